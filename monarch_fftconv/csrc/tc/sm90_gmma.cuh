// monarch_fftconv: the Hopper Monarch kernel's GEMMs (tc/sm90_kernel.cuh): issuing wgmma over
// shared-memory tiles (real and complex products, descriptors made where they are used),
// the begin/wait fences around them, the proxy fence that makes ordinary shared-memory
// stores visible to them, and the named barriers of a sequence slot and of a warpgroup.
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace monarch_fftconv {
namespace sm90 {

using namespace cute;

// Generic-proxy shared-memory writes become visible to the wgmma (async) proxy.
__device__ __forceinline__ void fence_smem_for_gmma() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Named barriers (0 is __syncthreads): one warpgroup (ids 1, 2), and the warpgroups of one
// sequence slot: both (id 3) or, where a slot has one warpgroup, that warpgroup's own.
__device__ __forceinline__ void warpgroup_barrier(int warpgroup) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + warpgroup) : "memory");
}
template <int SeqWarpgroups>
__device__ __forceinline__ void slot_barrier(int warpgroup) {
  if constexpr (SeqWarpgroups == 1) {
    warpgroup_barrier(warpgroup);
  } else {
    asm volatile("bar.sync 3, 256;\n" ::: "memory");
  }
}

// acc (+)= A · B over the whole K of the tiles, issued (not waited for): sA (64, K), sB (64, K).
template <class TiledMma, class TA, class TB, class Acc>
__device__ __forceinline__ void gemm_issue(TA const& sA, TB const& sB, Acc& acc, bool accumulate) {
  TiledMma mma;
  auto thr = mma.get_slice(threadIdx.x % 128);
  Tensor fA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, 1, K/16) descriptors
  Tensor fB = thr.make_fragment_B(thr.partition_B(sB));  // (MMA, 1, K/16)
  CUTE_STATIC_ASSERT_V(size<2>(fA) == size<2>(fB));
  mma.accumulate_ = accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(fA); ++k) {
    cute::gemm(mma, fA(_, _, k), fB(_, _, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
}

// A k step's descriptor fragment, computed where it is used: the empty asm keeps the compiler
// from making every step's descriptors before the first wgmma (a register each).
template <class Fragment>
__device__ __forceinline__ auto at_use(Fragment const& fragment) {
  auto descriptors = fragment.data();
  asm volatile("" : "+r"(descriptors.desc_.reg32_[0]));
  return make_tensor(descriptors, fragment.layout());
}

// The complex product of stage 2 (Conjugate = false) or inverse 2 (true), issued k step by k step
// so that each step's four descriptors are made where they are used (all 32 made up front took
// 64 registers): with F = C + iS,
//   forward:  re += R·C - I·S,  im += I·C + R·S          (R + iI) · F
//   inverse:  re += R·C + I·S,  im += I·C - R·S          (R + iI) · conj(F)
template <class MmaPos, class MmaNeg, bool Conjugate, class TR, class TC, class Acc>
__device__ __forceinline__ void complex_gemm_issue(TR const& sR, TR const& sI, TC const& sC, TC const& sS,
                                                   Acc& acc_re, Acc& acc_im) {
  MmaPos pos;
  MmaNeg neg;
  auto thr = pos.get_slice(threadIdx.x % 128);
  Tensor fR = thr.make_fragment_A(thr.partition_A(sR));  // (MMA, 1, K/16) descriptors
  Tensor fI = thr.make_fragment_A(thr.partition_A(sI));
  Tensor fC = thr.make_fragment_B(thr.partition_B(sC));
  Tensor fS = thr.make_fragment_B(thr.partition_B(sS));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(fR); ++k) {
    const auto r = at_use(fR(_, _, k)), i = at_use(fI(_, _, k));
    const auto c = at_use(fC(_, _, k)), s = at_use(fS(_, _, k));
    pos.accumulate_ = k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    cute::gemm(pos, r, c, acc_re);
    cute::gemm(pos, i, c, acc_im);
    pos.accumulate_ = GMMA::ScaleOut::One;
    neg.accumulate_ = GMMA::ScaleOut::One;
    if constexpr (Conjugate) {
      cute::gemm(pos, i, s, acc_re);
      cute::gemm(neg, r, s, acc_im);
    } else {
      cute::gemm(neg, i, s, acc_re);
      cute::gemm(pos, r, s, acc_im);
    }
  }
}

template <class... Accs>
__device__ __forceinline__ void gmma_begin(Accs&... accs) {
  (warpgroup_fence_operand(accs), ...);
  warpgroup_arrive();
}
template <class... Accs>
__device__ __forceinline__ void gmma_wait(Accs&... accs) {
  warpgroup_wait<0>();
  (warpgroup_fence_operand(accs), ...);
}

}  // namespace sm90
}  // namespace monarch_fftconv
