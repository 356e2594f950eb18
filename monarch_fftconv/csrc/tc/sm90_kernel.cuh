// monarch_fftconv: the Hopper-native fused Monarch convolution (wgmma), split 128 x 128
// (N = 16384, 4096 < L <= 8192), bf16 and fp16 operands, fp32 accumulation and epilogues.
// docs/design.md ("Hopper kernel") derives the data flow; this file, the kernel and its
// launcher, and its parts are its one home: the traits (tc/sm90_traits.cuh), the GEMMs and
// their synchronisation (tc/sm90_gmma.cuh), the epilogues' helpers (tc/sm90_epilogue.cuh).
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
#include "tc/sm90_traits.cuh"
#include "tc/sm90_gmma.cuh"
#include "tc/sm90_epilogue.cuh"
#include "common/residency.cuh"

namespace monarch_fftconv {
namespace sm90 {

using namespace cute;

// ---------------------------------------------------------------------------
// The stages. Each runs on one warpgroup's half (columns [col0, col0 + 64)) of one sequence;
// the kernel below orders them with the GEMMs and the barriers.
// ---------------------------------------------------------------------------

// The DFT tables in the operand type (into the kernel's tensors over sm's f1c, s1, f2c, f2s)
// and the fp32 twiddle tables, once per CTA (the caller fences them for the GEMMs and
// synchronizes).
template <class Cfg, class TSquare, class TF2>
__device__ __forceinline__ void build_tables(typename Cfg::Smem& sm, TSquare& sF1c, TSquare& sS1, TF2& sF2c, TF2& sF2s,
                                             int tid) {
  using T = typename Cfg::T;
  constexpr int kN2 = Cfg::kN2;
  for (int j = tid; j < kN2; j += Cfg::kThreads) {
    float sn, cs;
    sincospif(2.0f * j / float(kN2), &sn, &cs);
    sm.w128[j] = make_float2(cs, -sn);
    sincospif(2.0f * j / float(Cfg::kN), &sn, &cs);
    sm.tw_lo[j] = make_float2(cs, -sn);
  }
  __syncthreads();
  for (int e = tid; e < kN2 * kN2; e += Cfg::kThreads) {
    const int i = e / kN2, j = e % kN2;
    const float2 w = sm.w128[(i * j) & (kN2 - 1)];
    sF2c(i, j) = T(w.x);
    sF2s(i, j) = T(w.y);
    if (i < Cfg::kRows && j < Cfg::kRows) {
      sF1c(i, j) = T(w.x);
      sS1(i, j) = T(i == 0 ? ((j & 1) ? -1.0f : 1.0f) : w.y);
    }
  }
}

// u -> x, one column half: this thread's share (8 rows r, 4 consecutive s each), rounded; zero
// past L. Loaded into registers under one GEMM (the next sequence's, under inverse stage 1),
// stored into x after it, so that the loads' latency hides under the epilogue between.
template <class Cfg>
struct UHalf {
  static constexpr int kThreadsPerRow = Cfg::kHalf / 4;                  // 16, 4 consecutive s each
  static constexpr int kRowsPerStep = Cfg::kWarpgroup / kThreadsPerRow;  // 8
  static constexpr int kSteps = Cfg::kRows / kRowsPerStep;               // 8
  float v[kSteps][4];

  __device__ __forceinline__ void load(const ConvForwardParams& p, int64_t u_off, bool u_vec_ok, int col0, int lt) {
    using Io = typename Cfg::Io;
    const int64_t L = p.seq_len;
    const int s0 = col0 + 4 * (lt % kThreadsPerRow);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      const int64_t t0 = int64_t(lt / kThreadsPerRow + kRowsPerStep * i) * Cfg::kN2 + s0;
      if (u_vec_ok && t0 + 3 < L) {
        if constexpr (sizeof(typename Io::T) == 4) {
          const float4 q = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.u) + u_off + t0));
          v[i][0] = q.x; v[i][1] = q.y; v[i][2] = q.z; v[i][3] = q.w;
        } else {
          const float2 lo = Io::load2(p.u, u_off + t0), hi = Io::load2(p.u, u_off + t0 + 2);
          v[i][0] = lo.x; v[i][1] = lo.y; v[i][2] = hi.x; v[i][3] = hi.y;
        }
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) v[i][q] = t0 + q < L ? Io::load(p.u, u_off + t0 + q) : 0.0f;
      }
    }
  }

  __device__ __forceinline__ void store(int col0, int lt, uint32_t x_plane) const {
    using T = typename Cfg::T;
    const typename Cfg::LayoutColsMN cols_mn{};
    const int s0 = col0 + 4 * (lt % kThreadsPerRow);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {  // 4 consecutive s: one 8-byte chunk
      const int r = lt / kThreadsPerRow + kRowsPerStep * i;
      st_shared(x_plane + 2 * swizzled_offset(cols_mn, s0, r),
                make_uint2(pack2<T>(v[i][0], v[i][1]), pack2<T>(v[i][2], v[i][3])));
    }
  }
};

// The (b, c) offset of sequence `seq` in u.
__device__ __forceinline__ int64_t u_offset(const ConvForwardParams& p, int64_t seq) {
  return (seq / p.channels) * p.u_batch_stride + (seq % p.channels) * p.u_channel_stride;
}

// Asks L2 for sequence `next`'s u, this warpgroup's half: one 128-byte line per thread.
template <class Cfg>
__device__ __forceinline__ void prefetch_u(const ConvForwardParams& p, int64_t next, int col0, int lt) {
  const int64_t t = int64_t(lt / 2) * Cfg::kN2 + col0 + (lt & 1) * (Cfg::kHalf / 2);  // 64 rows x this half
  if (t < p.seq_len) {
    prefetch_l2(static_cast<const typename Cfg::Io::T*>(p.u) + u_offset(p, next) + t);
  }
}

// After stage 1: twiddle exp(-2 pi i k1 s / N), round, store A (k1, s). Row 0: A[0] is real
// (its twiddle is 1); its imaginary slot holds the Nyquist row, twiddled into nyq.b in fp32.
template <class Cfg, class Coord, class Acc>
__device__ __forceinline__ void twiddle_to_a(const Acc& acc_re, const Acc& acc_im, const Coord& coord, int col0,
                                             const typename Cfg::Smem& sm, typename Cfg::Nyquist& nyq,
                                             uint32_t a_plane) {
  using T = typename Cfg::T;
  constexpr uint32_t kPlaneBytes = Cfg::kPlaneBytes;
  const typename Cfg::LayoutRowsK rows_k{};
  for_each_pair_by_row(coord, col0, sm.w128, sm.tw_lo, [&](int k1, int s, int i, RowTwiddles& tw) {
    float2 z0 = make_float2(acc_re(i), acc_im(i)), z1 = make_float2(acc_re(i + 1), acc_im(i + 1));
    if (k1 == 0) {
      nyq.b[s] = cmul(make_float2(z0.y, 0.0f), twiddle(sm.w128, sm.tw_lo, Cfg::kNyquistRow * s));
      nyq.b[s + 1] = cmul(make_float2(z1.y, 0.0f), twiddle(sm.w128, sm.tw_lo, Cfg::kNyquistRow * (s + 1)));
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
}

// After stage 2: the filter product in fp32, round, store P (k1, k2). The first kEarly of the
// thread's filter pairs come loaded (FilterEarly, issued under the GEMM); the rest load here.
template <int kEarly>
struct FilterEarly {
  float4 kf[kEarly];
  template <class Cfg, class Coord>
  __device__ __forceinline__ void load(const Coord& coord, int col0, const float2* filt) {
#pragma unroll
    for (int j = 0; j < kEarly; ++j) {
      const int k1 = get<0>(coord(2 * j)), k2 = col0 + get<1>(coord(2 * j));
      kf[j] = __ldg(reinterpret_cast<const float4*>(filt + k1 * Cfg::kN2 + k2));
    }
  }
};

template <class Cfg, int kEarly, class Coord, class Acc>
__device__ __forceinline__ void filter_to_p(const Acc& acc_re, const Acc& acc_im, const Coord& coord, int col0,
                                            const float2* filt, const FilterEarly<kEarly>& early, uint32_t p_plane) {
  using T = typename Cfg::T;
  constexpr uint32_t kPlaneBytes = Cfg::kPlaneBytes;
  constexpr int kAcc = decltype(size(acc_re))::value;
  const typename Cfg::LayoutRowsK rows_k{};
#pragma unroll
  for (int i = 0; i < kAcc; i += 2) {
    const int k1 = get<0>(coord(i)), k2 = col0 + get<1>(coord(i));
    const float4 kf = i / 2 < kEarly ? early.kf[i / 2] : __ldg(reinterpret_cast<const float4*>(filt + k1 * Cfg::kN2 + k2));
    const float2 z0 = cmul(make_float2(acc_re(i), acc_im(i)), make_float2(kf.x, kf.y));
    const float2 z1 = cmul(make_float2(acc_re(i + 1), acc_im(i + 1)), make_float2(kf.z, kf.w));
    const uint32_t at = p_plane + 2 * swizzled_offset(rows_k, k1, k2);
    st_shared(at, pack2<T>(z0.x, z1.x));
    st_shared(at + kPlaneBytes, pack2<T>(z0.y, z1.y));
  }
}

// After inverse 2: the conj twiddle times the Hermitian weight (2 but for row 0), round, store
// A' (s, k1). Row 0 is real; its imaginary slot carries the Nyquist row's real output.
template <class Cfg, class Coord, class Acc>
__device__ __forceinline__ void twiddle_to_ap(const Acc& acc_re, const Acc& acc_im, const Coord& coord, int col0,
                                              const typename Cfg::Smem& sm, const typename Cfg::Nyquist& nyq,
                                              uint32_t ap_plane) {
  using T = typename Cfg::T;
  constexpr uint32_t kPlaneBytes = Cfg::kPlaneBytes;
  const typename Cfg::LayoutColsMN cols_mn{};
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
    const uint32_t at = ap_plane + 2 * swizzled_offset(cols_mn, s, k1);  // s, s + 1: adjacent (MN-major)
    st_shared(at, pack2<T>(z0.x, z1.x));
    st_shared(at + kPlaneBytes, pack2<T>(z0.y, z1.y));
  });
}

// After inverse 1: y[t = 128 r + s] for t < L, plus the skip term.
template <class Cfg, class Coord, class Acc>
__device__ __forceinline__ void store_y(const Acc& acc_re, const Coord& coord, int col0, const ConvForwardParams& p,
                                        int64_t seq, int64_t c, int64_t u_off) {
  using Io = typename Cfg::Io;
  constexpr int kAcc = decltype(size(acc_re))::value;
  const int64_t L = p.seq_len;
  const float skip = p.skip != nullptr ? __ldg(p.skip + c) : 0.0f;
  const int64_t y_off = seq * L;
#pragma unroll
  for (int i = 0; i < kAcc; i += 2) {
    const int r = get<0>(coord(i)), s = col0 + get<1>(coord(i));
    const int64_t t = int64_t(r) * Cfg::kN2 + s;
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

// ---------------------------------------------------------------------------
// The kernel: per sequence, the five steps of docs/design.md in order, each GEMM issued
// asynchronously with the Nyquist row's fp32 work (one warp) under it. A warpgroup runs each
// step on its column halves in turn (one half, or both where it has a sequence to itself).
// ---------------------------------------------------------------------------
template <Precision P, IOType IO, int SeqWarpgroups>
__global__ void __launch_bounds__(Sm90Cfg<P, IO, SeqWarpgroups>::kThreads, 1)
    monarch_sm90_kernel(const ConvForwardParams p) {
  using Cfg = Sm90Cfg<P, IO, SeqWarpgroups>;
  using Io = typename Cfg::Io;
  using Smem = typename Cfg::Smem;
  using GM = GMMA::Major;
  using MmaKK = typename Cfg::template Mma<GM::K, GM::K>;
  using MmaKKNeg = typename Cfg::template Mma<GM::K, GM::K, GMMA::ScaleIn::Neg>;
  using MmaKMN = typename Cfg::template Mma<GM::K, GM::MN>;
  using MmaMNMN = typename Cfg::template Mma<GM::MN, GM::MN>;
  constexpr int kHalves = Cfg::kHalvesPerWarpgroup;

  extern __shared__ uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int warpgroup = tid / Cfg::kWarpgroup;
  const int slot = warpgroup / Cfg::kSeqWarpgroups;  // the sequence slot this thread works on
  const int wg = warpgroup % Cfg::kSeqWarpgroups;    // the warpgroup's place in its slot
  const int half0 = wg * kHalves;                    // its first column half
  typename Cfg::SlotData& data = sm.slot[slot];
  typename Cfg::Nyquist& nyq = sm.nyq[slot];

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

  // Byte addresses of the planes the epilogues store into: x and p share p's bytes, a and ap a's.
  const uint32_t a_plane = smem_address(data.a[0]), p_plane = smem_address(data.p[0]);

  // Column half h's N slices: rows [64 h, 64 h + 64) of the N-by-K operands.
  using TileHalfRows = typename Cfg::TileHalfRows;
  using TileHalfCols = typename Cfg::TileHalfCols;
  auto x_half = [&](int h) { return local_tile(sX, TileHalfRows{}, make_coord(h, 0)); };      // (64 s, 64 r)
  auto f2c_half = [&](int h) { return local_tile(sF2c, TileHalfCols{}, make_coord(h, 0)); };  // (64 k2|s, 128)
  auto f2s_half = [&](int h) { return local_tile(sF2s, TileHalfCols{}, make_coord(h, 0)); };
  auto apre_half = [&](int h) { return local_tile(sApre, TileHalfRows{}, make_coord(h, 0)); }; // (64 s, 64 k1)
  auto apim_half = [&](int h) { return local_tile(sApim, TileHalfRows{}, make_coord(h, 0)); };

  build_tables<Cfg>(sm, sF1c, sS1, sF2c, sF2s, tid);
  fence_smem_for_gmma();
  __syncthreads();  // the tables

  // Accumulator fragments, (64 rows, 64 columns) of one column half's tile.
  Tensor acc_re = partition_fragment_C(MmaKK{}, typename Cfg::TileAcc{});     // 32 fp32
  Tensor acc_im = partition_fragment_C(MmaKK{}, typename Cfg::TileAcc{});

  const int64_t sequences = p.batch * p.channels;
  const bool u_vec_ok = (reinterpret_cast<uintptr_t>(p.u) % (4 * sizeof(typename Io::T))) == 0 &&
                        p.u_batch_stride % 4 == 0 && p.u_channel_stride % 4 == 0;

  const int64_t seq_step = int64_t(gridDim.x) * Cfg::kSlots;
  const int64_t first_seq = int64_t(blockIdx.x) * Cfg::kSlots + slot;
  // ---- 1. u -> x: the slot's first sequence here; every later one under the last GEMM before it ----
  if (first_seq < sequences) {
    const int lt = threadIdx.x % Cfg::kWarpgroup;
#pragma unroll 1
    for (int h = half0; h < half0 + kHalves; ++h) {
      UHalf<Cfg> u_half;
      u_half.load(p, u_offset(p, first_seq), u_vec_ok, Cfg::kHalf * h, lt);
      u_half.store(Cfg::kHalf * h, lt, p_plane);
    }
    fence_smem_for_gmma();
  }
  for (int64_t seq = first_seq; seq < sequences; seq += seq_step) {
    // x is in place; the slot's previous sequence is done with ap (a's bytes)
    slot_barrier<SeqWarpgroups>(warpgroup);
    // The accumulators' (row, column) coordinates. Derived from an opaque copy of the thread
    // index each sequence: hoisted out of the loop, their addresses would take ~100 registers.
    int lt = threadIdx.x % Cfg::kWarpgroup;
    asm volatile("" : "+r"(lt));
    Tensor coord = MmaKK{}.get_slice(lt).partition_C(make_identity_tensor(typename Cfg::TileAcc{}));  // (m, n)
    const int64_t c = seq % p.channels;
    const int64_t u_off = u_offset(p, seq);
    const float2* filt = reinterpret_cast<const float2*>(p.filter_spectrum) +
                         c * int64_t((Cfg::kNyquistRow + 1) * Cfg::kN2);  // (65, 128)
    const bool has_next = seq + seq_step < sequences;

    // ---- 2. stage 1: A = F1 · X over r, rows k1 = 0..63; row 0's imaginary = Nyquist row ----
#pragma unroll 1
    for (int h = half0; h < half0 + kHalves; ++h) {
      gmma_begin(acc_re, acc_im);
      gemm_issue<MmaKMN>(sF1c, x_half(h), acc_re, false);
      gemm_issue<MmaKMN>(sS1, x_half(h), acc_im, false);
      warpgroup_commit_batch();
      if (has_next) prefetch_u<Cfg>(p, seq + seq_step, Cfg::kHalf * h, lt);
      gmma_wait(acc_re, acc_im);
      twiddle_to_a<Cfg>(acc_re, acc_im, coord, Cfg::kHalf * h, sm, nyq, a_plane);
    }
    fence_smem_for_gmma();
    slot_barrier<SeqWarpgroups>(warpgroup);  // stage 2 contracts over every s

    // ---- 3. stage 2: B = A · F2 over s, columns k2 of each half ----
#pragma unroll 1
    for (int h = half0; h < half0 + kHalves; ++h) {
      gmma_begin(acc_re, acc_im);
      complex_gemm_issue<MmaKK, MmaKKNeg, false>(sAre, sAim, f2c_half(h), f2s_half(h), acc_re, acc_im);
      warpgroup_commit_batch();
      FilterEarly<Cfg::kEarlyFilterPairs> filter_early;  // L2 latency under the GEMM
      filter_early.template load<Cfg>(coord, Cfg::kHalf * h, filt);
      if (h == 0 && lt / 32 == Cfg::kNyquistForwardWarp) {  // meanwhile one warp: the Nyquist row's
                                                             // stage 2 and filter, fp32
        const int lane = lt % 32;
        const float2* spectrum = fft128_warp<false>(nyq.b, nyq.fft[0], sm.w128, lane);
#pragma unroll
        for (int k2 = lane; k2 < Cfg::kN2; k2 += 32)
          nyq.p[k2] = cmul(spectrum[k2], __ldg(filt + Cfg::kNyquistRow * Cfg::kN2 + k2));
      }
      gmma_wait(acc_re, acc_im);
      filter_to_p<Cfg>(acc_re, acc_im, coord, Cfg::kHalf * h, filt, filter_early, p_plane);
    }
    fence_smem_for_gmma();
    slot_barrier<SeqWarpgroups>(warpgroup);  // inverse 2 contracts over every k2; nyq.p complete

    // ---- 4. inverse stage 2: A' = P · conj(F2) over k2, columns s of each half ----
#pragma unroll 1
    for (int h = half0; h < half0 + kHalves; ++h) {
      gmma_begin(acc_re, acc_im);
      complex_gemm_issue<MmaKK, MmaKKNeg, true>(sPre, sPim, f2c_half(h), f2s_half(h), acc_re, acc_im);
      warpgroup_commit_batch();
      const bool first = h == half0;
      if (first && lt / 32 == Cfg::kNyquistInverseWarp) {  // meanwhile one warp per warpgroup: the
        // Nyquist row's inverse 2 and conj twiddle, c64[s] = Re(conj(tw64[s]) · IDFT(P64)[s]) for its halves' s
        const int lane = lt % 32;
        const float2* signal = fft128_warp<true>(nyq.p, nyq.fft[wg], sm.w128, lane);
#pragma unroll
        for (int s = Cfg::kHalf * half0 + lane; s < Cfg::kHalf * (half0 + kHalves); s += 32)
          nyq.c[s] = cmul_conj(signal[s], twiddle(sm.w128, sm.tw_lo, Cfg::kNyquistRow * s)).x;
      }
      gmma_wait(acc_re, acc_im);
      if (first) warpgroup_barrier(warpgroup);  // nyq.c of this warpgroup's halves
      twiddle_to_ap<Cfg>(acc_re, acc_im, coord, Cfg::kHalf * h, sm, nyq, a_plane);
    }
    fence_smem_for_gmma();
    // Inverse stage 1 reads this warpgroup's halves of ap; the next sequence's x goes into p's
    // bytes, which inverse 2 has finished reading in every warpgroup of the slot.
    slot_barrier<SeqWarpgroups>(warpgroup);

    // ---- 5. inverse stage 1: y = cos · Re A' + (-sin | Nyquist) · Im A' over k1; and the
    //         next sequence's u -> x (step 1), its loads under this GEMM and the y stores ----
    const int64_t next_u_off = has_next ? u_offset(p, seq + seq_step) : 0;
#pragma unroll 1
    for (int h = half0; h < half0 + kHalves; ++h) {
      gmma_begin(acc_re);
      gemm_issue<MmaKMN>(sF1c, apre_half(h), acc_re, false);    // f1c is symmetric: read (r, k1)
      gemm_issue<MmaMNMN>(sS1T, apim_half(h), acc_re, true);
      warpgroup_commit_batch();
      UHalf<Cfg> u_next;
      if (has_next) u_next.load(p, next_u_off, u_vec_ok, Cfg::kHalf * h, lt);
      gmma_wait(acc_re);
      store_y<Cfg>(acc_re, coord, Cfg::kHalf * h, p, seq, c, u_off);
      if (has_next) u_next.store(Cfg::kHalf * h, lt, p_plane);
    }
    fence_smem_for_gmma();  // x, for the next sequence's stage 1 (after the barrier at the top)
  }
}

// SeqWarpgroups: warpgroups per sequence. 2 (the request "sm90"): one sequence in flight per
// CTA. 1 ("sm90-2seq"): two, one per warpgroup. Both 256 threads, up to 255 registers a thread.
template <Precision P, IOType IO, int SeqWarpgroups>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream) {
  using Cfg = Sm90Cfg<P, IO, SeqWarpgroups>;
  constexpr auto kernel = &monarch_sm90_kernel<P, IO, SeqWarpgroups>;
  int ctas_per_sm = 0, sms = 0;
  cudaError_t err = residency<kernel>(Cfg::kThreads, Cfg::kSmemBytes, ctas_per_sm, sms);
  if (err != cudaSuccess) return err;
  const int64_t sequences = p.batch * p.channels;
  const int64_t needed = (sequences + Cfg::kSlots - 1) / Cfg::kSlots;
  const int64_t grid = needed < int64_t(ctas_per_sm) * sms ? needed : int64_t(ctas_per_sm) * sms;
  kernel<<<dim3(unsigned(grid)), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace monarch_fftconv
