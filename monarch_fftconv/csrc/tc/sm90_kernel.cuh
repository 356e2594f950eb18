// monarch_fftconv: the Hopper-native fused Monarch convolution (wgmma), split 128 x 128
// (N = 16384, 4096 < L <= 8192), bf16 and fp16 operands, fp32 accumulation and epilogues.
// docs/design.md ("Hopper kernel") derives the data flow; this file is its one home.
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "fftconv.h"
#include "tc/traits.cuh"  // IoTraits: the io element conversions
#include "common/residency.cuh"

namespace monarch_fftconv {
namespace sm90 {

using namespace cute;

// The operand type and its GMMA atom (m64 n64 k16, both operands in shared memory).
// ScaleA = Neg negates the A operand for free: the complex products' minus signs.
template <Precision P> struct Operand;
template <> struct Operand<Precision::kBF16> {
  using T = cute::bfloat16_t;
  template <GMMA::Major MajorA, GMMA::Major MajorB, GMMA::ScaleIn ScaleA = GMMA::ScaleIn::One>
  using Atom = SM90_64x64x16_F32BF16BF16_SS<MajorA, MajorB, ScaleA>;
};
template <> struct Operand<Precision::kFP16> {
  using T = cute::half_t;
  template <GMMA::Major MajorA, GMMA::Major MajorB, GMMA::ScaleIn ScaleA = GMMA::ScaleIn::One>
  using Atom = SM90_64x64x16_F32F16F16_SS<MajorA, MajorB, ScaleA>;
};

// ---------------------------------------------------------------------------
// The traits: the one home of the tile shapes and the shared-memory layout.
//
// One CTA = two warpgroups working on one (b, c) sequence at a time (persistent grid).
// Warpgroup h owns the column half [64h, 64h + 64) of every stage's N dimension, so every
// GEMM is one m64 n64 tile per warpgroup: rows k1 = 0..63 of the Hermitian half (row 64,
// the Nyquist row, rides in row 0's imaginary slot through the stage-1 and inverse
// stage-1 GEMMs, and takes SIMT fp32 in between; see below).
//
// Shared memory (operand type T unless said; layouts are GMMA's 128-byte swizzles):
//   f1c  (64, 64)   K-major   cos(2 pi k1 r / 128): stage 1's A (k1, r) and inverse
//                             stage 1's A (r, k1): symmetric
//   s1   (64, 64)   K-major   -sin(2 pi k1 r / 128), row k1 = 0 replaced by (-1)^r (the
//                             Nyquist row's stage 1 lands in A's imaginary row 0);
//                             inverse stage 1 reads the same bytes MN-major, i.e. transposed
//   f2c, f2s (128, 128) K-major  cos / -sin(2 pi s k2 / 128): stages 2 and inverse 2 (B)
//   x    (128 s, 64 r)   MN-major  u, rounded: stage 1's B
//   a    2 x (64 k1, 128 s)  K-major  stage 1's output (re, im), twiddled: stage 2's A
//   p    2 x (64 k1, 128 k2) K-major  stage 2's output times the filter: inverse 2's A
//   ap   2 x (128 s, 64 k1)  MN-major inverse 2's output, conj twiddled, weighted:
//                             inverse stage 1's B
//   fp32: w128[j] = exp(-2 pi i j / 128), tw_lo[j] = exp(-2 pi i j / 16384), j < 128;
//         the Nyquist row's vectors (nyq_b, nyq_p, nyq_c).
// ---------------------------------------------------------------------------
template <Precision P_, IOType IO_, int Teams>
struct Sm90Cfg {
  static constexpr int kN1 = 128, kN2 = 128, kN = kN1 * kN2;
  static constexpr int kRows = 64;           // m64: Hermitian rows 0..63
  static constexpr int kHalf = 64;           // columns per warpgroup
  // Sequences in flight per CTA, one team of two warpgroups each: while one team runs its
  // epilogues, the other's GEMMs keep the tensor cores busy.
  static constexpr int kTeams = Teams;
  static constexpr int kThreads = 256 * kTeams;
  using Io = tc::IoTraits<IO_>;
  using T = typename Operand<P_>::T;
  template <GMMA::Major A, GMMA::Major B, GMMA::ScaleIn S = GMMA::ScaleIn::One>
  using Mma = decltype(make_tiled_mma(typename Operand<P_>::template Atom<A, B, S>{}));

  using LayoutSquare = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_64, _64>{}));
  using LayoutSquareT = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_64, _64>{}));
  using LayoutF2 = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_128, _128>{}));
  using LayoutRowsK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_64, _128>{}));
  using LayoutColsMN = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<_128, _64>{}));

  // One team's buffers. Two aliases keep two teams within shared memory: `ap` shares `a`'s
  // bytes (a is dead once stage 2 has run in both warpgroups) and `x` the first 16 KB of `p`
  // (x is dead after stage 1); a team barrier at the top of each sequence orders them.
  struct alignas(1024) TeamData {
    T a[2][64 * 128];          // a: (k1, s) K-major, then ap: (s, k1) MN-major
    T p[2][64 * 128];          // x: (s, r) MN-major in p[0], then p: (k1, k2) K-major
  };
  struct Nyquist {
    float2 b[128];             // the Nyquist row after stage 1 and its twiddle, by s
    float2 p[128];             // ... after stage 2 and the filter, by k2
    float c[128];              // ... after inverse 2 and the conj twiddle, real part, by s
    float2 fft[2][2][128];     // per warpgroup: the ping-pong buffers of its 128-point FFTs
  };
  struct alignas(1024) Smem {
    T f1c[64 * 64];
    T s1[64 * 64];
    T f2c[128 * 128];
    T f2s[128 * 128];
    TeamData team[kTeams];
    float2 w128[128];
    float2 tw_lo[128];
    Nyquist nyq[kTeams];
  };
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + alignment slack

  static_assert(sizeof(T) == 2, "GMMA operands here are 16-bit");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
};

// ---------------------------------------------------------------------------
// Small helpers.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float2 cmul(float2 a, float2 b) {
  return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ float2 cmul_conj(float2 a, float2 b) {  // a * conj(b)
  return make_float2(a.x * b.x + a.y * b.y, a.y * b.x - a.x * b.y);
}

// exp(-2 pi i e / 16384) for 0 <= e < 16384, from two 128-entry tables.
__device__ __forceinline__ float2 twiddle(const float2* w128, const float2* tw_lo, int e) {
  return cmul(w128[e >> 7], tw_lo[e & 127]);
}

// Two floats rounded to the operand type, lo in the low half: one cvt instruction.
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

// One warp: a 128-point complex DFT (radix-2 Stockham, natural order in and out), forward
// (exp(-2 pi i / 128)) or inverse (unnormalised). Reads `in`, ping-pongs between buf[0] and
// buf[1]; returns the buffer that holds the result. Used for the Nyquist row only.
template <bool Inverse>
__device__ __forceinline__ const float2* fft128_warp(const float2* in, float2 (*buf)[128], const float2* w128,
                                                     int lane) {
  const float2* src = in;
  int out = 0;
#pragma unroll
  for (int span = 1; span < 128; span *= 2) {  // span: length of the sub-transforms already done
    float2* dst = buf[out];
#pragma unroll
    for (int i = lane; i < 64; i += 32) {
      const int k = i & (span - 1);
      const float2 w = w128[k * (64 / span)];
      const float2 u0 = src[i];
      const float2 u1 = Inverse ? cmul_conj(src[i + 64], w) : cmul(src[i + 64], w);
      const int j = 2 * i - k;
      dst[j] = make_float2(u0.x + u1.x, u0.y + u1.y);
      dst[j + span] = make_float2(u0.x - u1.x, u0.y - u1.y);
    }
    __syncwarp();
    src = dst;
    out ^= 1;
  }
  return src;
}

// The twiddles of one accumulator row, by recurrence along its columns: the thread's columns
// are n0 + 8j and n0 + 8j + 1 (the GMMA accumulator layout), so w(s + 8) = w(s)·exp(-2 pi i 8 k1 / N).
// The fp32 rounding of 8 steps (~1e-6) is far below the 16-bit operands'.
struct RowTwiddles {
  float2 cur, step1, step8;
  __device__ __forceinline__ RowTwiddles(const float2* w128, const float2* tw_lo, int k1, int s0)
      : cur(twiddle(w128, tw_lo, k1 * s0)), step1(twiddle(w128, tw_lo, k1)), step8(twiddle(w128, tw_lo, 8 * k1)) {}
  // The twiddles of columns s and s + 1, then advance by 8 columns.
  __device__ __forceinline__ void next(float2& w0, float2& w1) {
    w0 = cur;
    w1 = cmul(cur, step1);
    cur = cmul(cur, step8);
  }
};

// Stores to shared memory through 32-bit shared-window addresses: one register per address
// (generic pointers take two), and the imaginary plane is the real one's address + a constant.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void st_shared(uint32_t address, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared(uint32_t address, uint2 v) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(address), "r"(v.x), "r"(v.y) : "memory");
}

// Element offset of (i, j) in a GMMA 128-byte-swizzled layout of 16-bit elements: the layout's
// unswizzled offset, then the swizzle (16-byte chunk ^= 128-byte row, mod 8). Calling the
// composed layout itself would swizzle element offsets as if they were bytes; the smem tensors
// apply the swizzle to addresses, which this matches (checked against them on the host).
template <class SwizzledLayout>
__device__ __forceinline__ uint32_t swizzled_offset(SwizzledLayout const& layout, int i, int j) {
  return Swizzle<3, 3, 3>{}(uint32_t(layout.layout_b()(i, j)));
}

// Generic-proxy shared-memory writes become visible to the wgmma (async) proxy.
__device__ __forceinline__ void fence_smem_for_gmma() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Named barriers (0 is __syncthreads): a team's two warpgroups (ids 1, 2), one warpgroup (3..6).
__device__ __forceinline__ void team_barrier(int team) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(1 + team) : "memory");
}
__device__ __forceinline__ void warpgroup_barrier(int warpgroup) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(3 + warpgroup) : "memory");
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

// Visits this thread's accumulator pairs row by row: fn(k1, s, i, twiddles) for the values i and
// i + 1 at (k1, s) and (k1, s + 1). The GMMA accumulator layout gives each thread two rows, m0
// (values 4j, 4j + 1) and m0 + 8 (values 4j + 2, 4j + 3), and columns n0 + 8j, n0 + 8j + 1: the
// order RowTwiddles::next walks, so fn takes the pair's twiddles with twiddles.next(w0, w1).
template <class Coord, class Fn>
__device__ __forceinline__ void for_each_pair_by_row(const Coord& coord, int col0, const float2* w128,
                                                     const float2* tw_lo, Fn&& fn) {
  constexpr int kValues = decltype(size(coord))::value;
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    const int k1 = get<0>(coord(2 * row));
    RowTwiddles twiddles(w128, tw_lo, k1, col0 + get<1>(coord(2 * row)));
#pragma unroll
    for (int i = 2 * row; i < kValues; i += 4) fn(k1, col0 + get<1>(coord(i)), i, twiddles);
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

// ---------------------------------------------------------------------------
// The kernel.
// ---------------------------------------------------------------------------
template <Precision P, IOType IO, int Teams>
__global__ void __launch_bounds__(Sm90Cfg<P, IO, Teams>::kThreads, 1) monarch_sm90_kernel(const ConvForwardParams p) {
  using Cfg = Sm90Cfg<P, IO, Teams>;
  using T = typename Cfg::T;
  using Io = typename Cfg::Io;
  using Smem = typename Cfg::Smem;
  using GM = GMMA::Major;
  using MmaKK = typename Cfg::template Mma<GM::K, GM::K>;
  using MmaKKNeg = typename Cfg::template Mma<GM::K, GM::K, GMMA::ScaleIn::Neg>;
  using MmaKMN = typename Cfg::template Mma<GM::K, GM::MN>;
  using MmaMNMN = typename Cfg::template Mma<GM::MN, GM::MN>;

  extern __shared__ uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int team = tid / 256;          // the sequence this thread works on: one per team
  const int warpgroup = tid / 128;
  const int wg = warpgroup % 2;        // the warpgroup's column half in its team
  const int col0 = Cfg::kHalf * wg;
  typename Cfg::TeamData& data = sm.team[team];
  typename Cfg::Nyquist& nyq = sm.nyq[team];

  // Shared-memory tensors.
  Tensor sF1c = make_tensor(make_smem_ptr(sm.f1c), typename Cfg::LayoutSquare{});   // (k1|r, r|k1)
  Tensor sS1 = make_tensor(make_smem_ptr(sm.s1), typename Cfg::LayoutSquare{});     // (k1, r)
  Tensor sS1T = make_tensor(make_smem_ptr(sm.s1), typename Cfg::LayoutSquareT{});   // (r, k1), same bytes
  Tensor sF2c = make_tensor(make_smem_ptr(sm.f2c), typename Cfg::LayoutF2{});       // (k2|s, s|k2)
  Tensor sF2s = make_tensor(make_smem_ptr(sm.f2s), typename Cfg::LayoutF2{});
  Tensor sX = make_tensor(make_smem_ptr(data.p[0]), typename Cfg::LayoutColsMN{});   // (s, r): 16 KB of p[0]
  Tensor sAre = make_tensor(make_smem_ptr(data.a[0]), typename Cfg::LayoutRowsK{});  // (k1, s)
  Tensor sAim = make_tensor(make_smem_ptr(data.a[1]), typename Cfg::LayoutRowsK{});
  Tensor sPre = make_tensor(make_smem_ptr(data.p[0]), typename Cfg::LayoutRowsK{});  // (k1, k2)
  Tensor sPim = make_tensor(make_smem_ptr(data.p[1]), typename Cfg::LayoutRowsK{});
  Tensor sApre = make_tensor(make_smem_ptr(data.a[0]), typename Cfg::LayoutColsMN{}); // (s, k1): a's bytes
  Tensor sApim = make_tensor(make_smem_ptr(data.a[1]), typename Cfg::LayoutColsMN{});

  // Byte addresses of the planes the epilogues store into, and the layouts that place an
  // element: byte = plane + 2 · swizzled_offset(layout, row, column).
  const uint32_t a_plane = smem_address(data.a[0]), p_plane = smem_address(data.p[0]);
  constexpr uint32_t kPlaneBytes = sizeof(data.a[0]);  // re to im
  const typename Cfg::LayoutRowsK rows_k{};
  const typename Cfg::LayoutColsMN cols_mn{};

  // This warpgroup's N slices: rows [64 wg, 64 wg + 64) of the N-by-K operands.
  Tensor sXh = local_tile(sX, Shape<_64, _64>{}, make_coord(wg, 0));        // (64 s, 64 r)
  Tensor sF2ch = local_tile(sF2c, Shape<_64, _128>{}, make_coord(wg, 0));   // (64 k2|s, 128 s|k2)
  Tensor sF2sh = local_tile(sF2s, Shape<_64, _128>{}, make_coord(wg, 0));
  Tensor sAprh = local_tile(sApre, Shape<_64, _64>{}, make_coord(wg, 0));   // (64 s, 64 k1)
  Tensor sApih = local_tile(sApim, Shape<_64, _64>{}, make_coord(wg, 0));

  // ---- tables, once per CTA ----
  for (int j = tid; j < 128; j += Cfg::kThreads) {
    float sn, cs;
    sincospif(2.0f * j / 128.0f, &sn, &cs);
    sm.w128[j] = make_float2(cs, -sn);
    sincospif(2.0f * j / 16384.0f, &sn, &cs);
    sm.tw_lo[j] = make_float2(cs, -sn);
  }
  __syncthreads();
  for (int e = tid; e < 128 * 128; e += Cfg::kThreads) {
    const int i = e / 128, j = e % 128;
    const float2 w = sm.w128[(i * j) & 127];
    sF2c(i, j) = T(w.x);
    sF2s(i, j) = T(w.y);
    if (i < 64 && j < 64) {
      sF1c(i, j) = T(w.x);
      sS1(i, j) = T(i == 0 ? ((j & 1) ? -1.0f : 1.0f) : w.y);
    }
  }
  fence_smem_for_gmma();
  __syncthreads();  // the tables

  // Accumulator fragments and their (row, column) coordinates within the warpgroup's tile.
  Tensor acc_re = partition_fragment_C(MmaKK{}, Shape<_64, _64>{});            // 32 fp32
  Tensor acc_im = partition_fragment_C(MmaKK{}, Shape<_64, _64>{});
  constexpr int kAcc = decltype(size(acc_re))::value;

  const int64_t sequences = p.batch * p.channels;
  const int64_t L = p.seq_len;
  const bool u_vec_ok = (reinterpret_cast<uintptr_t>(p.u) % (4 * sizeof(typename Io::T))) == 0 &&
                        p.u_batch_stride % 4 == 0 && p.u_channel_stride % 4 == 0;

  const int64_t seq_step = int64_t(gridDim.x) * Cfg::kTeams;
  for (int64_t seq = int64_t(blockIdx.x) * Cfg::kTeams + team; seq < sequences; seq += seq_step) {
    team_barrier(team);  // the team's previous sequence is done with p (x's bytes) and ap (a's)
    // The accumulators' (row, column) coordinates. Derived from an opaque copy of the thread
    // index each sequence: hoisted out of the loop, their addresses would take ~100 registers.
    int lt = threadIdx.x % 128;
    asm volatile("" : "+r"(lt));
    Tensor coord = MmaKK{}.get_slice(lt).partition_C(make_identity_tensor(Shape<_64, _64>{}));  // (m, n)
    const int64_t b = seq / p.channels, c = seq % p.channels;
    const int64_t u_off = b * p.u_batch_stride + c * p.u_channel_stride;
    const float2* filt = reinterpret_cast<const float2*>(p.filter_spectrum) + c * int64_t(65 * 128);

    // ---- 1. u -> x (this warpgroup's 64 columns, all 64 rows; zero past L) ----
    {
      const int s0 = col0 + 4 * (lt % 16);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = lt / 16 + 8 * i;
        const int64_t t0 = int64_t(r) * 128 + s0;
        float v[4];
        if (u_vec_ok && t0 + 3 < L) {
          if constexpr (sizeof(typename Io::T) == 4) {
            const float4 q = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.u) + u_off + t0));
            v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
          } else {
            const float2 lo = Io::load2(p.u, u_off + t0), hi = Io::load2(p.u, u_off + t0 + 2);
            v[0] = lo.x; v[1] = lo.y; v[2] = hi.x; v[3] = hi.y;
          }
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) v[q] = t0 + q < L ? Io::load(p.u, u_off + t0 + q) : 0.0f;
        }
        // 4 consecutive s: one 8-byte chunk
        st_shared(p_plane + 2 * swizzled_offset(cols_mn, s0, r), make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3])));
      }
    }
    fence_smem_for_gmma();
    warpgroup_barrier(warpgroup);  // stage 1 reads this half of x only

    // ---- 2. stage 1: A = F1 · X over r, rows k1 = 0..63; row 0's imaginary = Nyquist row ----
    gmma_begin(acc_re, acc_im);
    gemm_issue<MmaKMN>(sF1c, sXh, acc_re, false);
    gemm_issue<MmaKMN>(sS1, sXh, acc_im, false);
    warpgroup_commit_batch();
    if (seq + seq_step < sequences) {  // ask L2 for the next sequence's u: one 128-byte line per thread
      const int64_t next = seq + seq_step;
      const int64_t t = int64_t(lt / 2) * 128 + col0 + (lt & 1) * 32;  // 64 rows x this half
      if (t < L) {
        const auto* line = static_cast<const typename Io::T*>(p.u) + (next / p.channels) * p.u_batch_stride +
                           (next % p.channels) * p.u_channel_stride + t;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
      }
    }
    gmma_wait(acc_re, acc_im);

    // Twiddle exp(-2 pi i k1 s / N), round, store A (k1, s). Row 0: A[0] is real (its twiddle
    // is 1); its imaginary slot holds the Nyquist row, twiddled into nyq_b in fp32.
    for_each_pair_by_row(coord, col0, sm.w128, sm.tw_lo, [&](int k1, int s, int i, RowTwiddles& tw) {
      float2 z0 = make_float2(acc_re(i), acc_im(i)), z1 = make_float2(acc_re(i + 1), acc_im(i + 1));
      if (k1 == 0) {
        nyq.b[s] = cmul(make_float2(z0.y, 0.0f), twiddle(sm.w128, sm.tw_lo, 64 * s));
        nyq.b[s + 1] = cmul(make_float2(z1.y, 0.0f), twiddle(sm.w128, sm.tw_lo, 64 * (s + 1)));
        z0.y = 0.0f;
        z1.y = 0.0f;
      } else {
        float2 w0, w1;
        tw.next(w0, w1);
        z0 = cmul(z0, w0);
        z1 = cmul(z1, w1);
      }
      const uint32_t at = a_plane + 2 * swizzled_offset(rows_k, k1, s);
      st_shared(at, pack2<T>(z0.x, z1.x));
      st_shared(at + kPlaneBytes, pack2<T>(z0.y, z1.y));
    });
    fence_smem_for_gmma();
    team_barrier(team);  // stage 2 contracts over every s

    // ---- 3. stage 2: B = A · F2 over s, columns k2 of this half ----
    gmma_begin(acc_re, acc_im);
    complex_gemm_issue<MmaKK, MmaKKNeg, false>(sAre, sAim, sF2ch, sF2sh, acc_re, acc_im);
    warpgroup_commit_batch();
    if (wg == 0 && lt < 32) {  // meanwhile one warp: the Nyquist row's stage 2 and filter, fp32
      const float2* spectrum = fft128_warp<false>(nyq.b, nyq.fft[0], sm.w128, lt);
#pragma unroll
      for (int k2 = lt; k2 < 128; k2 += 32) nyq.p[k2] = cmul(spectrum[k2], __ldg(filt + 64 * 128 + k2));
    }
    gmma_wait(acc_re, acc_im);

    // Filter product in fp32, round, store P (k1, k2).
#pragma unroll
    for (int i = 0; i < kAcc; i += 2) {
      const int k1 = get<0>(coord(i)), k2 = col0 + get<1>(coord(i));
      const float4 kf = __ldg(reinterpret_cast<const float4*>(filt + k1 * 128 + k2));
      const float2 z0 = cmul(make_float2(acc_re(i), acc_im(i)), make_float2(kf.x, kf.y));
      const float2 z1 = cmul(make_float2(acc_re(i + 1), acc_im(i + 1)), make_float2(kf.z, kf.w));
      const uint32_t at = p_plane + 2 * swizzled_offset(rows_k, k1, k2);
      st_shared(at, pack2<T>(z0.x, z1.x));
      st_shared(at + kPlaneBytes, pack2<T>(z0.y, z1.y));
    }
    fence_smem_for_gmma();
    team_barrier(team);  // inverse 2 contracts over every k2; nyq.p complete

    // ---- 4. inverse stage 2: A' = P · conj(F2) over k2, columns s of this half ----
    gmma_begin(acc_re, acc_im);
    complex_gemm_issue<MmaKK, MmaKKNeg, true>(sPre, sPim, sF2ch, sF2sh, acc_re, acc_im);
    warpgroup_commit_batch();
    if (lt < 32) {  // meanwhile one warp per warpgroup: the Nyquist row's inverse 2 and conj
                    // twiddle, c64[s] = Re(conj(tw64[s]) · IDFT(P64)[s]) for this half's s
      const float2* signal = fft128_warp<true>(nyq.p, nyq.fft[wg], sm.w128, lt);
#pragma unroll
      for (int s = col0 + lt; s < col0 + 64; s += 32)
        nyq.c[s] = cmul_conj(signal[s], twiddle(sm.w128, sm.tw_lo, 64 * s)).x;
    }
    gmma_wait(acc_re, acc_im);
    warpgroup_barrier(warpgroup);  // nyq.c of this half

    // Conj twiddle times the Hermitian weight (2 but for row 0), round, store A' (s, k1).
    // Row 0 is real; its imaginary slot carries the Nyquist row's real output.
    for_each_pair_by_row(coord, col0, sm.w128, sm.tw_lo, [&](int k1, int s, int i, RowTwiddles& tw) {
      float2 z0 = make_float2(acc_re(i), acc_im(i)), z1 = make_float2(acc_re(i + 1), acc_im(i + 1));
      if (k1 == 0) {
        z0.y = nyq.c[s];
        z1.y = nyq.c[s + 1];
      } else {
        float2 w0, w1;
        tw.next(w0, w1);
        z0 = cmul_conj(make_float2(2.0f * z0.x, 2.0f * z0.y), w0);
        z1 = cmul_conj(make_float2(2.0f * z1.x, 2.0f * z1.y), w1);
      }
      const uint32_t at = a_plane + 2 * swizzled_offset(cols_mn, s, k1);  // s, s + 1: adjacent (MN-major)
      st_shared(at, pack2<T>(z0.x, z1.x));
      st_shared(at + kPlaneBytes, pack2<T>(z0.y, z1.y));
    });
    fence_smem_for_gmma();
    warpgroup_barrier(warpgroup);  // inverse stage 1 reads this half only

    // ---- 5. inverse stage 1: y = cos · Re A' + (-sin | Nyquist) · Im A' over k1 ----
    gmma_begin(acc_re);
    gemm_issue<MmaKMN>(sF1c, sAprh, acc_re, false);    // f1c is symmetric: read (r, k1)
    gemm_issue<MmaMNMN>(sS1T, sApih, acc_re, true);
    warpgroup_commit_batch();
    gmma_wait(acc_re);

    // y[t = 128 r + s] for t < L, plus the skip term.
    const float skip = p.skip != nullptr ? __ldg(p.skip + c) : 0.0f;
    const int64_t y_off = seq * L;
#pragma unroll
    for (int i = 0; i < kAcc; i += 2) {
      const int r = get<0>(coord(i)), s = col0 + get<1>(coord(i));
      const int64_t t = int64_t(r) * 128 + s;
      float y0 = acc_re(i), y1 = acc_re(i + 1);
      if (p.skip != nullptr) {
        if (t < L) y0 += skip * Io::load(p.u, u_off + t);
        if (t + 1 < L) y1 += skip * Io::load(p.u, u_off + t + 1);
      }
      if (t + 1 < L && ((y_off + t) & 1) == 0) {
        Io::store2(p.y, y_off + t, y0, y1);
      } else {
        if (t < L) Io::store(p.y, y_off + t, y0);
        if (t + 1 < L) Io::store(p.y, y_off + t + 1, y1);
      }
    }
  }
}

// Teams: sequences in flight per CTA. 1 (the request "sm90"): 255 registers a thread. 2
// ("sm90-2teams"): 128 registers and some spills; measured slower (docs/performance.md, session 10).
template <Precision P, IOType IO, int Teams>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream) {
  using Cfg = Sm90Cfg<P, IO, Teams>;
  constexpr auto kernel = &monarch_sm90_kernel<P, IO, Teams>;
  int ctas_per_sm = 0, sms = 0;
  cudaError_t err = residency<kernel>(Cfg::kThreads, Cfg::kSmemBytes, ctas_per_sm, sms);
  if (err != cudaSuccess) return err;
  const int64_t sequences = p.batch * p.channels;
  const int64_t needed = (sequences + Cfg::kTeams - 1) / Cfg::kTeams;
  const int64_t grid = needed < int64_t(ctas_per_sm) * sms ? needed : int64_t(ctas_per_sm) * sms;
  kernel<<<dim3(unsigned(grid)), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace monarch_fftconv
