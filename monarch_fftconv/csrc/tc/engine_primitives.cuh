// monarch_fftconv: the tensor-core engine's primitives (tc/engine_kernel.cuh): operand rounding,
// mbarriers, named barriers, setmaxnreg and the proxy fence, the wgmma issue (SS and RS) and
// its shared-memory descriptors, and the small fp32 and shared-store helpers its stages share.
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "common/complex.cuh"
#include "common/ptx.cuh"

namespace monarch_fftconv {
namespace engine {

using namespace cute;

// Two floats rounded to the operand type T (cute::bfloat16_t or cute::half_t), lo in the low
// half: one cvt instruction.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, cute::bfloat16_t>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(h);
  }
}

// ---------------------------------------------------------------------------
// Synchronisation: mbarriers (the ring, the filter, the non-finite flags), named barriers
// (between the consumer warpgroups), setmaxnreg, the proxy fence.
// ---------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// One arrival that also adds `bytes` to the phase's expected transaction count (a bulk copy's).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned) by the
// bulk-copy engine, completing that many bytes of `bar`'s transaction count.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}
// Waits until the phase of the given parity has completed (a fresh barrier's parity 1 has).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int kRegs> __device__ __forceinline__ void regs_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void regs_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---------------------------------------------------------------------------
// wgmma on register arrays: the accumulators are plain float arrays (fully unrolled, so they
// stay in registers), the register A operand four packed words per k step.
// ---------------------------------------------------------------------------
template <class Op, int N, size_t... I>
__device__ __forceinline__ void ss_fma(uint64_t a, uint64_t b, float (&d)[N], GMMA::ScaleOut s, std::index_sequence<I...>) {
  Op::fma(a, b, d[I]..., s);
}
template <class Op, int N>
__device__ __forceinline__ void mma_ss(uint64_t a, uint64_t b, float (&d)[N], bool accumulate) {
  ss_fma<Op>(a, b, d, accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero, std::make_index_sequence<N>{});
}
template <class Op, int N, size_t... I>
__device__ __forceinline__ void rs_fma(const uint32_t* a, uint64_t b, float (&d)[N], GMMA::ScaleOut s,
                                       std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, d[I]..., s);
}
template <class Op, int N>
__device__ __forceinline__ void mma_rs(const uint32_t* a, uint64_t b, float (&d)[N], bool accumulate) {
  rs_fma<Op>(a, b, d, accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero, std::make_index_sequence<N>{});
}
// Keeps the compiler from moving register uses across a wgmma's issue and its wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// The shared-memory descriptors of a GEMM's operands, one per k step: fragment(0, 0, k).
template <class Atom, class Tensor_>
__device__ __forceinline__ auto descriptors_a(Tensor_ const& s) {
  auto thr = make_tiled_mma(Atom{}).get_slice(threadIdx.x % 128);
  return thr.make_fragment_A(thr.partition_A(s));
}
template <class Atom, class Tensor_>
__device__ __forceinline__ auto descriptors_b(Tensor_ const& s) {
  auto thr = make_tiled_mma(Atom{}).get_slice(threadIdx.x % 128);
  return thr.make_fragment_B(thr.partition_B(s));
}
// The base made opaque where it is used: otherwise the compiler makes every k step's
// descriptor up front, two registers each.
template <class Fragment>
__device__ __forceinline__ uint64_t desc_at(Fragment const& f, int k) {
  auto base = f.data();
  asm volatile("" : "+r"(base.desc_.reg32_[0]));
  return uint64_t(make_tensor(base, f.layout())(0, 0, k));
}

// ---------------------------------------------------------------------------
// Small fp32 helpers.
// ---------------------------------------------------------------------------
// exp(-2 pi i e / N) with e reduced mod N in integers: e / (N/2) is exact in fp32.
template <int kN>
__device__ __forceinline__ float2 omega(int e) {
  float sn, cs;
  sincospif(float(e & (kN - 1)) / float(kN / 2), &sn, &cs);
  return make_float2(cs, -sn);
}
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (std::is_same_v<T, cute::bfloat16_t>) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    __half2 h;
    reinterpret_cast<uint32_t&>(h) = w;
    return __half22float2(h);
  }
}
template <class T>
__device__ __forceinline__ uint16_t round1(float v) {
  return uint16_t(pack2<T>(v, 0.0f) & 0xffffu);
}
__device__ __forceinline__ void st_shared_u16(uint32_t address, uint16_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(address), "h"(v) : "memory");
}
// A load from shared memory by shared-window address: LDS, where a generic pointer into shared
// memory the compiler cannot prove shared gives a generic LD. Volatile, with a memory clobber:
// it stays after the barrier wait that publishes what it reads.
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t address) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(address) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t address, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ uint4 ld_stream_u4(const void* p) {  // 16 bytes read once: no L1 allocation
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// The two planes of a pair of packed (re, im) words: (re0, re1) and (im0, im1).
__device__ __forceinline__ uint32_t re_plane(uint32_t w0, uint32_t w1) { return __byte_perm(w0, w1, 0x5410); }
__device__ __forceinline__ uint32_t im_plane(uint32_t w0, uint32_t w1) { return __byte_perm(w0, w1, 0x7632); }

}  // namespace engine
}  // namespace monarch_fftconv
