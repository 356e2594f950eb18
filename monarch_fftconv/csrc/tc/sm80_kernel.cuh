// monarch_fftconv: the fused tensor-core Monarch convolution kernel and its
// launcher (precisions tf32 / bf16 / fp16, fp32 accumulation), FFT sizes 256 .. 16384.
// Included by one translation unit per precision (tc/sm80_instances_<precision>.cu),
// which instantiate the launchers in parallel builds; the dispatch table lives in
// tc/dispatch.cu.
//
// One CTA (8 warps) per (b, c) sequence at a time (a persistent grid); everything
// stays on chip between the load of u and the store of y. Stages (see fftconv.h and docs/design.md):
//   1. A  = F1[0..H, :H] . X              (real X; two real GEMMs, M = rows k1)
//      A *= w_N^(k1 n2)                    (fp32)
//   2. B  = A . F2                          (complex GEMM, K = n2)
//      P  = B * K[c]                        (fp32)
//   3. A' = P . conj(F2)                    (complex GEMM, K = n2)
//      A'*= conj(w_N^(k1 n2))               (fp32)
//   4. y  = Sum_k1 w cos . Re A' - w sin . Im A'   (real GEMM, K = rows k1)
//      y += skip[c] u
// Each GEMM output is rounded to the operand type when it is written back to
// shared memory, which is exactly where the PyTorch emulation rounds.
// Rows k1 = 0..H (H+1 rows) are padded with zero rows to a multiple of 16.
// Matmuls use CuTe SM80 mma.sync atoms on register fragments.
// The traits (tile shapes, shared-memory layout, operand precisions) are in
// tc/sm80_traits.cuh, the fragment loads and stores in tc/sm80_fragments.cuh. The kernel is
// one function: its stages are blocks and lambdas over the kernel's locals (tables, lane
// indices, the u prefetched into registers), so it stays in one piece here.
//
// CUDA + CuTe headers only: never include torch here.

#pragma once

#include <algorithm>
#include <type_traits>

#include "tc/sm80_traits.cuh"
#include "tc/sm80_fragments.cuh"
#include "common/complex.cuh"
#include "common/residency.cuh"

namespace monarch_fftconv {
namespace tc {

// ------------------------------ kernel helpers ------------------------------
__device__ __forceinline__ int opaque_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// The accumulator rows a thread holds in one pass of an epilogue: in its m tiles mt (j < kPass
// of the pass that starts at tile j0), the rows 16 mt + g + 8h, h = 0, 1, without the 8-row
// halves that are padding only (at or past kRowsLive8). fn(j, h, row).
template <int kPass, int kWM, int kMTW, int kMT, int kRowsLive8, class Fn>
__device__ __forceinline__ void for_each_live_row(int wm, int g, int j0, Fn&& fn) {
#pragma unroll
  for (int j = 0; j < kPass; ++j) {
    const int mt = wm + kWM * (j0 + j);
    if (j0 + j < kMTW && mt < kMT) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (mt * 16 + 8 * h >= kRowsLive8) continue;  // padding rows only
        fn(j, h, mt * 16 + g + 8 * h);
      }
    }
  }
}

// ------------------------------- the kernel's parts -------------------------------
// The kernel's shared memory, carved as Cfg lays it out: the fp32 tables, then the data planes
// (X, then A, P and A' over it) and the operand-type tables.
template <class C>
struct TcSmem {
  using S = typename C::S;
  float2* W1;    // w_N1^i, i < N1
  float2* W2;    // w_N2^i, i < N2
  float2* TL;    // w_N^i, i < kTL; then TH
  float2* TH;    // w_N^(64 i)
  S* data;       // X (row-major), then the A, P, A' planes over it
  S* Are;
  S* Aim;
  S* F1re;       // operand-type tables (kTables): F1, then G2's B fragments
  S* F1im;
  uint4* G2;
  __device__ __forceinline__ explicit TcSmem(unsigned char* raw)
      : W1(reinterpret_cast<float2*>(raw)), W2(W1 + C::N1), TL(W2 + C::N2), TH(TL + C::kTL),
        data(reinterpret_cast<S*>(raw + C::kSmallBytes)), Are(data), Aim(data + C::kPlane),
        F1re(data + C::kDataElems), F1im(F1re + C::kF1Plane), G2(reinterpret_cast<uint4*>(F1im + C::kF1Plane)) {}
  // Twiddle w_N^(a), a = k1*n2_ < N, from two small tables.
  __device__ __forceinline__ float2 twiddle(int a) const { return cmul(TL[a & 63], TH[a >> 6]); }
  // Stage-2 matrix: column m of the half-column DFT matrix, k-th entry. Column 0's
  // (identically zero) imaginary part carries the real column n2/2, (-1)^k.
  __device__ __forceinline__ float2 g2(int m, int k) const {
    return m == 0 ? make_float2(1.0f, (k & 1) ? -1.0f : 1.0f) : W2[(m * k) & (C::N2 - 1)];
  }
};

// A thread's lane-derived indices, re-derived per sequence (see the persistent loop).
struct LaneIds {
  int lane, warp, g, t4;
};

// u of one sequence in registers, 16-byte vectors when aligned: issued one sequence ahead
// (software pipelining across the persistent loop).
template <class C>
struct UVectors {
  static constexpr int kVec = C::Io::kVec;
  static constexpr int kXElems = C::kHK * C::N2;
  static constexpr int kVecs = kXElems / kVec;
  static constexpr int kIt = (kVecs + C::kThreads - 1) / C::kThreads;
  static_assert(C::N2 % kVec == 0, "vector loads stay inside one row");
  using Regs = float[kIt][kVec];
};

__device__ __forceinline__ int64_t u_offset(const ConvForwardParams& p, int64_t sq) {
  return (sq % p.batch) * p.u_batch_stride + (sq / p.batch) * p.u_channel_stride;
}

// Loads sequence sq's u into xv. Always writes every element of xv (zeros when unused), which
// keeps xv dead between the X store and the next prefetch. Returns whether xv holds sq.
template <class C>
__device__ __forceinline__ bool prefetch_u(typename UVectors<C>::Regs& xv, const ConvForwardParams& p, int64_t sq,
                                           int64_t nseq, int64_t L, int tid) {
  using Io = typename C::Io;
  constexpr int kVec = UVectors<C>::kVec, kVecs = UVectors<C>::kVecs, kIt = UVectors<C>::kIt;
  const int64_t off = sq < nseq ? u_offset(p, sq) : 0;
  const bool ok = sq < nseq &&
      ((reinterpret_cast<uintptr_t>(p.u) + uint64_t(off) * sizeof(typename Io::T)) & 15) == 0;
  if (!ok) {
#pragma unroll
    for (int it = 0; it < kIt; ++it)
#pragma unroll
      for (int e = 0; e < kVec; ++e) xv[it][e] = 0.0f;
  } else {
    const typename Io::T* ub = static_cast<const typename Io::T*>(p.u) + off;
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int v = tid + it * C::kThreads;
      const int64_t t0 = int64_t(v) * kVec;
      if (v < kVecs && t0 + kVec <= L) {
        Io::unpack(__ldg(reinterpret_cast<const uint4*>(ub + t0)), xv[it]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          xv[it][e] = (v < kVecs && t0 + e < L) ? Io::load(p.u, off + t0 + e) : 0.0f;
      }
    }
  }
  return ok;
}

// The tables (identical for every sequence), once per CTA, and the padding rows of the planes.
template <class C>
__device__ __forceinline__ void build_tables(const TcSmem<C>& sm, int tid) {
  using Op = typename C::Op;
  using S = typename C::S;
  constexpr int N1 = C::N1, N2 = C::N2, kH = C::kH, kRP = C::kRP, kK = C::kK, kSD = C::kSD;
  const auto& [W1, W2, TL, TH, data, Are, Aim, F1re, F1im, G2] = sm;  // the carved smem, by name
  for (int i = tid; i < N1; i += C::kThreads) {
    float s, co;
    sincospif(2.0f * float(i) / float(N1), &s, &co);
    W1[i] = make_float2(co, -s);
  }
  for (int i = tid; i < N2; i += C::kThreads) {
    float s, co;
    sincospif(2.0f * float(i) / float(N2), &s, &co);
    W2[i] = make_float2(co, -s);
  }
  for (int i = tid; i < C::kTL + C::kN / 64; i += C::kThreads) {
    const float x = i < C::kTL ? 2.0f * float(i) / float(C::kN)
                               : 128.0f * float(i - C::kTL) / float(C::kN);
    float s, co;
    sincospif(x, &s, &co);
    TL[i] = make_float2(co, -s);  // TL and TH are contiguous
  }
  __syncthreads();
  auto g2 = [&](int m, int k) { return sm.g2(m, k); };
  // operand-type tables F1 and G2 (16-bit operands only)
  if constexpr (C::kTables) {
    for (int idx = tid; idx < kRP * C::kHK; idx += C::kThreads) {
      const int k1 = idx / C::kHK, j = idx % C::kHK;
      float2 v = make_float2(0.0f, 0.0f);
      if (k1 <= kH && j < kH) v = W1[(k1 * j) & (N1 - 1)];
      F1re[k1 * C::kSF1 + j] = Op::cvt1(v.x);
      F1im[k1 * C::kSF1 + j] = Op::cvt1(v.y);
    }
    // G2[(nt, ks)][lane] = {re b0, re b1, im b0, im b1} of the m16n8k16 B fragment
    for (int idx = tid; idx < C::kNT2 * C::kKSteps2 * 32; idx += C::kThreads) {
      const int ln = idx & 31, ks = (idx >> 5) % C::kKSteps2, nt = (idx >> 5) / C::kKSteps2;
      uint32_t re[2], im[2];
      lookup_b<Op>(re, im, g2, nt * 8, ks * kK, ln >> 2, ln & 3);
      G2[idx] = make_uint4(re[0], re[1], im[0], im[1]);
    }
  }

  // Rows past kRowsLive8 (whole 8-row halves of padding, past H) stay zero:
  // written here once, skipped by every epilogue (and never covered by X).
  for (int idx = tid; idx < (kRP - C::kRowsLive8) * kSD; idx += C::kThreads) {
    Are[C::kRowsLive8 * kSD + idx] = S(0);
    Aim[C::kRowsLive8 * kSD + idx] = S(0);
  }

}

// X[n1_][n2_] = rnd(u[n1_*N2 + n2_]) (row-major, zero past L), from xv or from global memory.
template <class C>
__device__ __forceinline__ void store_x(const TcSmem<C>& sm, const typename UVectors<C>::Regs& xv, bool xv_ok,
                                        const ConvForwardParams& p, int64_t u_off, int64_t L, int tid) {
  using Op = typename C::Op;
  using Io = typename C::Io;
  using S = typename C::S;
  constexpr int N2 = C::N2, kSD = C::kSD;
  constexpr int kVec = UVectors<C>::kVec, kVecs = UVectors<C>::kVecs, kIt = UVectors<C>::kIt;
  constexpr int kXElems = UVectors<C>::kXElems;
  S* const data = sm.data;
  if (xv_ok) {
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int v = tid + it * C::kThreads;
      if (v < kVecs) {
        const int t0 = v * kVec;
        const int idx = (t0 / N2) * kSD + (t0 % N2);
#pragma unroll
        for (int e = 0; e < kVec; e += 2) store_pair<Op>(data, idx + e, xv[it][e], xv[it][e + 1]);
      }
    }
  } else {
    for (int t = tid; t < kXElems; t += C::kThreads) {
      const float x = t < L ? Io::load(p.u, u_off + t) : 0.0f;
      data[(t / N2) * kSD + (t % N2)] = Op::cvt1(x);
    }
  }
  __syncthreads();

}

// ================= stage 1: A = F1 . X (rows k1 <= H) =================
// Each warp first takes its X columns into registers (the B fragments of
// every k step), so that A may then overwrite X pass by pass: the m tiles run
// in passes of kPass, and only one pass's accumulators are live at a time.
template <class C>
__device__ __forceinline__ void stage1(const TcSmem<C>& sm, const LaneIds& ids, int rows_io) {
  using Op = typename C::Op;
  constexpr int N1 = C::N1, kH = C::kH, kK = C::kK, kSD = C::kSD;
  constexpr int kMT = C::kMT;
  const auto& [W1, W2, TL, TH, data, Are, Aim, F1re, F1im, G2] = sm;  // the carved smem, by name
  const int lane = ids.lane, warp = ids.warp, g = ids.g, t4 = ids.t4;
  auto twiddle = [&](int a) { return sm.twiddle(a); };
  constexpr int kWN = C::kWN, kWM = C::kWM, kMTW = C::kMTW, kNTW = C::kNTW;
  constexpr int kKS = C::kHK / kK;  // k steps over the rows of X
  constexpr int kPass = C::kPass;
  const int wn = warp % kWN, wm = warp / kWN;
  const int ksteps = (rows_io + kK - 1) / kK;  // X rows past L are zero: skip them

  uint32_t bx[kKS][kNTW][2];
  const SmemView<Op> x_b = b_view<Op>(data, kSD, lane);
#pragma unroll
  for (int ks = 0; ks < kKS; ++ks)
#pragma unroll
    for (int i = 0; i < kNTW; ++i) {
      bx[ks][i][0] = bx[ks][i][1] = 0u;
      if (ks < ksteps) load_b_kmajor<Op>(bx[ks][i], x_b, ks * kK, (wn + kWN * i) * 8);
    }
  __syncthreads();  // X is in registers everywhere: A may overwrite it

  auto f1 = [&](int k1, int j) -> float2 {
    return k1 <= kH ? W1[(k1 * j) & (N1 - 1)] : make_float2(0.0f, 0.0f);
  };
  const SmemView<Op> f1re_a = a_view<Op>(F1re, C::kSF1, lane);
  const SmemView<Op> f1im_a = a_view<Op>(F1im, C::kSF1, lane);
#pragma unroll
  for (int j0 = 0; j0 < kMTW; j0 += kPass) {
    float acc[kPass][kNTW][2][4];
#pragma unroll
    for (int j = 0; j < kPass; ++j)
#pragma unroll
      for (int i = 0; i < kNTW; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][i][0][e] = acc[j][i][1][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      if (ks < ksteps) {
#pragma unroll
        for (int j = 0; j < kPass; ++j) {
          const int mt = wm + kWM * (j0 + j);
          if (j0 + j < kMTW && mt < kMT) {
            uint32_t fr[4], fi[4];
            if constexpr (C::kTables) {
              load_a<Op>(fr, f1re_a, mt * 16, ks * kK);
              load_a<Op>(fi, f1im_a, mt * 16, ks * kK);
            } else {
              lookup_a<Op>(fr, fi, f1, mt * 16, ks * kK, g, t4);
            }
#pragma unroll
            for (int i = 0; i < kNTW; ++i) {
              Op::mma(acc[j][i][0], fr, bx[ks][i]);
              Op::mma(acc[j][i][1], fi, bx[ks][i]);
            }
          }
        }
      }
    }
    // twiddle (fp32) in registers, then write rnd(A) row-major planar over X.
    // Per row r: w^(r c) for c = c0 + q + 8 kWN i is base(r, i) * w^(r q), with
    // base(r, 0) = w^(r c0) (one two-level lookup) and w^r = TL[r].
    for_each_live_row<kPass, kWM, kMTW, kMT, C::kRowsLive8>(wm, g, j0, [&](int j, int h, int row) {
      const float2 al = twiddle(row * (8 * wn + 2 * t4));
      const float2 be = TL[row];
#pragma unroll
      for (int i = 0; i < kNTW; ++i) {
        const int col = (wn + kWN * i) * 8 + 2 * t4;
        const float2 t0 = i == 0 ? al : cmul(al, twiddle(row * 8 * kWN * i));
        const float2 t1 = cmul(t0, be);
        const float2 v0 = cmul(make_float2(acc[j][i][0][2 * h], acc[j][i][1][2 * h]), t0);
        const float2 v1 = cmul(make_float2(acc[j][i][0][2 * h + 1], acc[j][i][1][2 * h + 1]), t1);
        store_pair<Op>(Are, row * kSD + col, v0.x, v1.x);
        store_pair<Op>(Aim, row * kSD + col, v0.y, v1.y);
      }
    });
  }
  __syncthreads();
}

// Stage 2 (kInv = false: B = A . F2, P = B * K -> planes) and inverse stage 2 (kInv = true:
// A' = P . conj(F2), twiddle -> planes). Only the half columns m < n2/2 are computed, as four
// real products
//   P1 = Ar.Gr, P2 = Ai.Gi, P3 = Ai.Gr, P4 = Ar.Gi;
//   column m      = (P1 - P2) + i (P3 + P4),
//   column n2 - m = (P1 + P2) + i (P3 - P4)   (G[:, n2-m] = conj G[:, m]).
// Column 0's Gi slot (identically 0) carries the real column n2/2 instead,
// (-1)^k: column 0 = P1 + i P3, column n2/2 = P4 + i P2.
template <class C, bool kInv>
__device__ __forceinline__ void stage2(const TcSmem<C>& sm, const LaneIds& ids, const float2* __restrict__ Kc,
                                       bool kvec) {
  using Op = typename C::Op;
  constexpr int N1 = C::N1, N2 = C::N2, kH = C::kH, kK = C::kK, kSD = C::kSD;
  constexpr int kMT = C::kMT;
  const auto& [W1, W2, TL, TH, data, Are, Aim, F1re, F1im, G2] = sm;  // the carved smem, by name
  const int lane = ids.lane, warp = ids.warp, g = ids.g, t4 = ids.t4;
  auto twiddle = [&](int a) { return sm.twiddle(a); };
  auto g2 = [&](int m, int k) { return sm.g2(m, k); };
  constexpr int kWN = C::kWN2, kWM = C::kWM2, kMTW = C::kMTW2, kNTW = C::kNTW2;
  constexpr int kPass = C::kPass;
  const int wn = warp % kWN, wm = warp / kWN;

  // Filter values for this lane's row of m tile mt, half h: columns m0, m0+1,
  // n2-m0 (n2/2 when m0 == 0), n2-m0-1. Zero for the padding rows past H.
  auto load_filter = [&](int mt, int h, float2 (&kb)[kNTW][4]) {
    const int row = mt * 16 + g + 8 * h;
#pragma unroll
    for (int i = 0; i < kNTW; ++i) {
      const int m0 = (wn + kWN * i) * 8 + 2 * t4;
      const int mh0 = m0 == 0 ? N2 / 2 : N2 - m0, mh1 = N2 - m0 - 1;
      kb[i][0] = kb[i][1] = kb[i][2] = kb[i][3] = make_float2(0.0f, 0.0f);
      if (mt < kMT && row <= kH) {
        const float2* kr = Kc + row * N2;
        if (kvec) {
          const float4 k4 = __ldg(reinterpret_cast<const float4*>(kr + m0));
          kb[i][0] = make_float2(k4.x, k4.y);
          kb[i][1] = make_float2(k4.z, k4.w);
        } else {
          kb[i][0] = __ldg(kr + m0);
          kb[i][1] = __ldg(kr + m0 + 1);
        }
        kb[i][2] = __ldg(kr + mh0);
        kb[i][3] = __ldg(kr + mh1);
      }
    }
  };

  // The inverse multiplies by conj(G): negated imaginary parts, column 0's
  // included (its sign is undone in the combine below).
  auto g2_dir = [&](int m, int k) -> float2 {
    const float2 v = g2(m, k);
    return kInv ? make_float2(v.x, -v.y) : v;
  };
  const SmemView<Op> are_a = a_view<Op>(Are, kSD, lane);
  const SmemView<Op> aim_a = a_view<Op>(Aim, kSD, lane);
  [[maybe_unused]] const uint4* g2_lane = G2 + wn * C::kKSteps2 * 32 + lane;

  // Passes of kPass m tiles. A pass's results overwrite its own rows of A once
  // every warp has read them (one barrier per pass); later passes read other rows.
#pragma unroll
  for (int j0 = 0; j0 < kMTW; j0 += kPass) {
    // the filter values of the whole pass, loaded under its GEMM
    float2 kf[kPass][2][kNTW][4];
    if constexpr (!kInv) {
#pragma unroll
      for (int j = 0; j < kPass; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) load_filter(j0 + j < kMTW ? wm + kWM * (j0 + j) : kMT, h, kf[j][h]);
    }
    float acc[kPass][kNTW][4][4];
#pragma unroll
    for (int j = 0; j < kPass; ++j)
#pragma unroll
      for (int i = 0; i < kNTW; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[j][i][q][e] = 0.0f;

#pragma unroll(C::kTables ? C::kKSteps2 : 2)
    for (int k0 = 0; k0 < N2; k0 += kK) {
      uint32_t gr[kNTW][2], gi[kNTW][2];
#pragma unroll
      for (int i = 0; i < kNTW; ++i) {
        if constexpr (C::kTables) {
          const uint4 f = g2_lane[(kWN * i * C::kKSteps2 + k0 / kK) * 32];
          gr[i][0] = f.x;
          gr[i][1] = f.y;
          gi[i][0] = kInv ? f.z ^ Op::kNegMask : f.z;
          gi[i][1] = kInv ? f.w ^ Op::kNegMask : f.w;
        } else {
          lookup_b<Op>(gr[i], gi[i], g2_dir, (wn + kWN * i) * 8, k0, g, t4);
        }
      }
#pragma unroll
      for (int j = 0; j < kPass; ++j) {
        const int mt = wm + kWM * (j0 + j);
        if (j0 + j < kMTW && mt < kMT) {
          uint32_t ar[4], ai[4];
          load_a<Op>(ar, are_a, mt * 16, k0);
          load_a<Op>(ai, aim_a, mt * 16, k0);
#pragma unroll
          for (int i = 0; i < kNTW; ++i) {
            Op::mma(acc[j][i][0], ar, gr[i]);
            Op::mma(acc[j][i][1], ai, gi[i]);
            Op::mma(acc[j][i][2], ai, gr[i]);
            Op::mma(acc[j][i][3], ar, gi[i]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done reading this pass's rows of A

    // combine into (column m, column n2-m); then filter product or inverse
    // twiddle; write back in place
    for_each_live_row<kPass, kWM, kMTW, kMT, C::kRowsLive8>(wm, g, j0, [&](int j, int h, int row) {
#pragma unroll
      for (int i = 0; i < kNTW; ++i) {
        const int m0 = (wn + kWN * i) * 8 + 2 * t4;
        const int mh0 = m0 == 0 ? N2 / 2 : N2 - m0, mh1 = N2 - m0 - 1;
        float2 lo[2], hi[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int e = 2 * h + q;
          const float P1 = acc[j][i][0][e], P2 = acc[j][i][1][e];
          const float P3 = acc[j][i][2][e], P4 = acc[j][i][3][e];
          if (m0 + q == 0) {
            lo[q] = make_float2(P1, P3);
            hi[q] = kInv ? make_float2(-P4, -P2) : make_float2(P4, P2);
          } else {
            lo[q] = make_float2(P1 - P2, P3 + P4);
            hi[q] = make_float2(P1 + P2, P3 - P4);
          }
        }
        if constexpr (!kInv) {
          lo[0] = cmul(lo[0], kf[j][h][i][0]);
          lo[1] = cmul(lo[1], kf[j][h][i][1]);
          hi[0] = cmul(hi[0], kf[j][h][i][2]);
          hi[1] = cmul(hi[1], kf[j][h][i][3]);
        } else {
          // w^(r m) for m = m0, m0+1; w^(r (n2 - m)) = w^(r n2) conj(w^(r m)),
          // w^(r n2) = W1[r]; column n2/2 (m0 == 0): w^(r n2/2).
          const float2 t0 = twiddle(row * m0);
          const float2 t1 = cmul(t0, TL[row]);
          const float2 wr = W1[row & (N1 - 1)];
          const float2 th0 = m0 == 0 ? twiddle(row * (N2 / 2))
                                     : cmul(wr, make_float2(t0.x, -t0.y));
          const float2 th1 = cmul(wr, make_float2(t1.x, -t1.y));
          // inverse: multiply by the conjugates, and by inverse stage 1's
          // Hermitian weight of this row (1 for rows 0 and H, else 2)
          const float wr2 = (row == 0 || row == kH) ? 1.0f : 2.0f;
          lo[0] = cmul(lo[0], make_float2(wr2 * t0.x, -wr2 * t0.y));
          lo[1] = cmul(lo[1], make_float2(wr2 * t1.x, -wr2 * t1.y));
          hi[0] = cmul(hi[0], make_float2(wr2 * th0.x, -wr2 * th0.y));
          hi[1] = cmul(hi[1], make_float2(wr2 * th1.x, -wr2 * th1.y));
        }
        store_pair<Op>(Are, row * kSD + m0, lo[0].x, lo[1].x);
        store_pair<Op>(Aim, row * kSD + m0, lo[0].y, lo[1].y);
        Are[row * kSD + mh0] = Op::cvt1(hi[0].x);
        Aim[row * kSD + mh0] = Op::cvt1(hi[0].y);
        Are[row * kSD + mh1] = Op::cvt1(hi[1].x);
        Aim[row * kSD + mh1] = Op::cvt1(hi[1].y);
      }
    });
  }
  __syncthreads();
}

// ====== inverse stage 1: y = Sum_k1 w (cos Re A' - sin Im A'), w folded into A' ======
template <class C>
__device__ __forceinline__ void inverse_stage1(const TcSmem<C>& sm, const LaneIds& ids, const ConvForwardParams& p,
                                               int64_t c, int64_t u_off, int64_t y_off, int64_t L, int rows_io) {
  using Op = typename C::Op;
  using Io = typename C::Io;
  constexpr int N1 = C::N1, N2 = C::N2, kH = C::kH, kRP = C::kRP, kK = C::kK, kSD = C::kSD;
  const auto& [W1, W2, TL, TH, data, Are, Aim, F1re, F1im, G2] = sm;  // the carved smem, by name
  const int lane = ids.lane, warp = ids.warp, g = ids.g, t4 = ids.t4;
  constexpr int kWN = C::kWN, kWM = C::kWM, kMTW = C::kMTW1, kNTW = C::kNTW;
  const int wn = warp % kWN, wm = warp / kWN;
  // (cos, Im W1) = (cos, -sin): y = cos . ReA' + (-sin) . ImA'
  auto fi1 = [&](int jrow, int k1) -> float2 {
    return k1 > kH ? make_float2(0.0f, 0.0f) : W1[(jrow * k1) & (N1 - 1)];
  };
  float acc[kMTW][kNTW][4];
#pragma unroll
  for (int j = 0; j < kMTW; ++j)
#pragma unroll
    for (int i = 0; i < kNTW; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][i][e] = 0.0f;
  const SmemView<Op> are_b = b_view<Op>(Are, kSD, lane), aim_b = b_view<Op>(Aim, kSD, lane);
  const SmemView<Op> f1re_at = at_view<Op>(F1re, C::kSF1, lane);
  const SmemView<Op> f1im_at = at_view<Op>(F1im, C::kSF1, lane);
#pragma unroll(C::kTables ? 8 : 1)  // tf32's table lookups need the registers
  for (int k0 = 0; k0 < kRP; k0 += kK) {
    uint32_t bre[kNTW][2], bim[kNTW][2];
#pragma unroll
    for (int i = 0; i < kNTW; ++i) {
      load_b_kmajor<Op>(bre[i], are_b, k0, (wn + kWN * i) * 8);
      load_b_kmajor<Op>(bim[i], aim_b, k0, (wn + kWN * i) * 8);
    }
#pragma unroll
    for (int j = 0; j < kMTW; ++j) {
      const int mt = wm + kWM * j;
      if (mt < C::kMT1 && mt * 16 < rows_io) {
        uint32_t cr[4], ci[4];
        if constexpr (C::kTables) {
          load_a_trans<Op>(cr, f1re_at, mt * 16, k0);  // F1 is symmetric
          load_a_trans<Op>(ci, f1im_at, mt * 16, k0);
        } else {
          lookup_a<Op>(cr, ci, fi1, mt * 16, k0, g, t4);
        }
#pragma unroll
        for (int i = 0; i < kNTW; ++i) {
          Op::mma(acc[j][i], cr, bre[i]);
          Op::mma(acc[j][i], ci, bim[i]);
        }
      }
    }
  }
  // epilogue: skip term, store the first L samples
  const float skip = p.skip != nullptr ? __ldg(p.skip + c) : 0.0f;
  const bool pair_ok = (L % 2) == 0;
  const bool u_pair_ok = ((reinterpret_cast<uintptr_t>(p.u) +
                           uint64_t(u_off) * sizeof(typename Io::T)) % (2 * sizeof(typename Io::T))) == 0;
#pragma unroll
  for (int j = 0; j < kMTW; ++j) {
    const int mt = wm + kWM * j;
    if (mt < C::kMT1 && mt * 16 < rows_io) {
#pragma unroll
      for (int i = 0; i < kNTW; ++i) {
        const int col = (wn + kWN * i) * 8 + 2 * t4;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = mt * 16 + g + 8 * h;
          const int64_t t = int64_t(row) * N2 + col;
          float y0 = acc[j][i][2 * h], y1 = acc[j][i][2 * h + 1];
          if (p.skip != nullptr) {
            if (u_pair_ok && t + 1 < L) {
              const float2 uu = Io::load2(p.u, u_off + t);
              y0 += skip * uu.x;
              y1 += skip * uu.y;
            } else {
              if (t < L) y0 += skip * Io::load(p.u, u_off + t);
              if (t + 1 < L) y1 += skip * Io::load(p.u, u_off + t + 1);
            }
          }
          if (pair_ok && t + 1 < L) {
            Io::store2(p.y, y_off + t, y0, y1);
          } else {
            if (t < L) Io::store(p.y, y_off + t, y0);
            if (t + 1 < L) Io::store(p.y, y_off + t + 1, y1);
          }
        }
      }
    }
  }
}

// ---------------------------------- kernel ----------------------------------
template <class C>
__global__ void __launch_bounds__(C::kThreads, 2) monarch_tc_kernel(const ConvForwardParams p) {
  constexpr int N2 = C::N2, kH = C::kH;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const TcSmem<C> sm(smem_raw);

  const int tid = threadIdx.x;
  const int64_t L = p.seq_len;
  const int64_t nseq = p.batch * p.channels;
  const int rows_io = int((L + N2 - 1) / N2);  // rows_in = rows_out

  typename UVectors<C>::Regs xv;
  bool xv_ok = prefetch_u<C>(xv, p, blockIdx.x, nseq, L, tid);
  build_tables<C>(sm, tid);

  // ---- persistent loop over sequences; consecutive sequences share a channel ----
#pragma unroll 1
  for (int64_t seq = blockIdx.x; seq < nseq; seq += gridDim.x) {
    // Lane-derived values are re-derived from an opaque read of %tid.x on every
    // iteration so that the compiler does not hoist (and then spill) per-lane
    // addresses of every stage out of the loop.
    const int lane_tid = opaque_tid();
    const int lane = lane_tid & 31;
    const LaneIds ids{lane, lane_tid >> 5, lane >> 2, lane & 3};
    const int64_t b = seq % p.batch, c = seq / p.batch;
    const int64_t u_off = u_offset(p, seq);
    const int64_t y_off = (b * p.channels + c) * L;
    const float2* __restrict__ Kc =
        reinterpret_cast<const float2*>(p.filter_spectrum) + c * int64_t(kH + 1) * N2;

    store_x<C>(sm, xv, xv_ok, p, u_off, L, lane_tid);
    stage1<C>(sm, ids, rows_io);
    const bool kvec = (reinterpret_cast<uintptr_t>(p.filter_spectrum) & 15) == 0;
    stage2<C, false>(sm, ids, Kc, kvec);  // B = A . F2, P = B * K  -> planes
    stage2<C, true>(sm, ids, Kc, kvec);   // A' = P . conj(F2), twiddle -> planes
    xv_ok = prefetch_u<C>(xv, p, seq + gridDim.x, nseq, L, tid);  // the next sequence, under inverse stage 1
    inverse_stage1<C>(sm, ids, p, c, u_off, y_off, L, rows_io);
    __syncthreads();  // inverse stage 1 has read the planes before the next X store
  }
}

// --------------------------------- launcher ---------------------------------
template <int N1, int N2, Precision P, IOType IO>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream) {
  using C = Cfg<N1, N2, P, IO>;
  constexpr size_t smem = C::kSmemBytes;
  // Persistent grid: as many CTAs as fit at once, each looping over sequences.
  int blocks_per_sm = 0, sms = 0;
  const cudaError_t e = residency<monarch_tc_kernel<C>>(C::kThreads, smem, blocks_per_sm, sms);
  if (e != cudaSuccess) return e;
  const int64_t nseq = p.batch * p.channels;
  const int64_t grid = std::min<int64_t>(nseq, int64_t(blocks_per_sm) * sms);
  monarch_tc_kernel<C><<<dim3(unsigned(grid)), dim3(C::kThreads), smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tc
}  // namespace monarch_fftconv

// Every (split, io type) launcher of one precision; used once per precision unit.
#define MONARCH_TC_INSTANTIATE_SPLIT(N1_, N2_, P_)                                         \
  template cudaError_t launch<N1_, N2_, P_, IOType::kFloat32>(const ConvForwardParams&,  \
                                                               cudaStream_t);           \
  template cudaError_t launch<N1_, N2_, P_, IOType::kBFloat16>(const ConvForwardParams&, \
                                                                cudaStream_t);          \
  template cudaError_t launch<N1_, N2_, P_, IOType::kFloat16>(const ConvForwardParams&,  \
                                                               cudaStream_t);
