// monarch_fftconv: the four-step inner stage (fourstep/fftconv_fourstep.cu): the M-point FFTs
// along the rows, the filter product (or what InnerMode asks for), the inverse, in place, on
// the fp32 radix library's plan and passes (fp32/radix.cuh).
#pragma once

#include "fp32/radix.cuh"
#include "fourstep/args.cuh"

#include <cstdint>

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

// kGrad with FOLD_SUMS (the backward's filter gradient, channel-major rows): the batch sum
// G[c][k2] = scale · Σ_b conj(X_b)·DY_b folded into the grad kernel instead of a batch_sum pass.
// A work item counts itself in g.arrivals[c·R + k2] once its product row is visible device-wide;
// the item that counts last (the B items of a filter row run side by side, so their product rows
// are still in L2) sums the B rows in batch order, batch_sum's order, so the same bits, into
// batch 0's row (c, k2), which is where batch_sum leaves G. Called by every thread of the CTA.
template <int M, int T>
__device__ __forceinline__ void fold_batch_sum(const FourStepArgs& g, int64_t work, bool valid, int tx, int ty,
                                               int* last) {
  __threadfence();  // this thread's product stores, before its item is counted
  __syncthreads();  // every thread's
  const InnerRow row = inner_row<true>(valid ? work : 0, g.B, g.C, g.R);
  if (tx == 0) last[ty] = valid && atomicAdd(g.arrivals + row.filter, 1) == g.B - 1;
  __syncthreads();
  if (!last[ty]) return;
  __threadfence();  // the other items' products, after their counts
  const int64_t batch_stride = g.C * g.R * (int64_t)M;  // row (b·C + c, k2) is b·C·R rows after (c, k2)
  float2* sum_row = g.products + row.filter * M;         // batch 0's row: (0·C + c)·R + k2
  for (int e = tx; e < M; e += T) {
    float2 sum = __ldcg(sum_row + e);
    for (int64_t b = 1; b < g.B; ++b) {
      const float2 z = __ldcg(sum_row + b * batch_stride + e);
      sum.x += z.x;
      sum.y += z.y;
    }
    sum_row[e] = make_float2(sum.x * g.scale, sum.y * g.scale);
  }
}

// The first passes of FFT_M on one row: p1 (global -> smem, radix R1) and p2. Its first barrier
// waits for the slot's previous reads of smem.
template <int LOGM>
__device__ __forceinline__ void forward_p1_p2(const float2* data, bool valid, const SlotSmem<LOGM>& slot, int tx) {
  using Pl = Plan<LOGM>;
  constexpr int M = Pl::M, T = Pl::T, R1 = Pl::R1, NB = 32 / R1;
  cf v[NB][R1];
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T;
#pragma unroll
    for (int r = 0; r < R1; ++r) {
      const float2 z = valid ? __ldcg(data + j + r * (M / R1)) : make_float2(0.f, 0.f);
      v[q][r] = {z.x, z.y};
    }
  }
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    if (q > 0) fence(v[q]);
    fft_reg<R1, false>(v[q]);
    fence(v[q]);
  }
  __syncthreads();  // the previous row's last pass has read smem
  store_butterflies<T>(slot.re, slot.im, tx, v);
  __syncthreads();
  if constexpr (Pl::LR2 > 0) pass_smem<M, T, Pl::R2, R1, false>(slot.re, slot.im, tx, slot.fp2());
}

// The mid pass's inputs from smem: butterfly q of thread tx in v[q], Z[j + r·M/16], j = tx + q·T.
template <int LOGM>
__device__ __forceinline__ void mid_inputs(const SlotSmem<LOGM>& slot, int tx,
                                           cf (&v)[Plan<LOGM>::M / 16 / Plan<LOGM>::T][16]) {
  constexpr int T = Plan<LOGM>::T, NS = Plan<LOGM>::M / 16, NB = NS / T;
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T, pj = pidx(j);
#pragma unroll
    for (int r = 0; r < 16; ++r) v[q][r] = lds_s<NS>(slot.re, slot.im, j, pj, r);
  }
}

// One row (s, k2) of M complex values per CTA slot: forward FFT_M (Stockham passes p1, p2 and
// the radix-16 "mid" pass, whose outputs are Z[j + r·M/16] in natural order), the filter
// product, and the inverse passes in the mirror order, in place.
template <int LOGM, InnerMode MODE, bool CHANNEL_MAJOR, bool FOLD_SUMS = false>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS) inner_kernel(const FourStepArgs g, int S) {
  static_assert(!FOLD_SUMS || ((MODE == InnerMode::kGrad || MODE == InnerMode::kGradFromU) && CHANNEL_MAJOR),
                "the fold is the channel-major grad kernels'");
  using Pl = Plan<LOGM>;
  constexpr int M = Pl::M, T = Pl::T, SPB = Pl::SPB, R1 = Pl::R1;
  extern __shared__ float4 smem_raw[];
  const SlotSmem<LOGM> slot(reinterpret_cast<float*>(smem_raw), S);
  float *re = slot.re, *im = slot.im;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t rows = (g.columns >> g.logM) * g.R;

  for (int64_t rb = (int64_t)blockIdx.x * SPB; rb < rows; rb += (int64_t)gridDim.x * SPB) {
    const int64_t work = rb + ty;
    const bool valid = work < rows;
    float2* data = g.a + (valid ? inner_row<CHANNEL_MAJOR>(work, g.B, g.C, g.R).data : 0) * M;

    // ---- kGradFromU: X = FFT_M of u's outer-stage row, in `products` in place (kSpectrum's work,
    // here instead of a pass of its own); this thread reads it back at the same places below
    if constexpr (MODE == InnerMode::kGradFromU) {
      constexpr int NS = M / 16, NB = NS / T;
      float2* prow = g.products + (data - g.a);
      forward_p1_p2<LOGM>(prow, valid, slot, tx);
      cf x[NB][16];
      mid_inputs<LOGM>(slot, tx, x);
#pragma unroll
      for (int q = 0; q < NB; ++q) {
        const int j = tx + q * T;
        if (q > 0) fence(x[q]);
        const float2 w = slot.mid()[j];
        apply_pow<16>(x[q], cf{w.x, w.y});
        fft_reg<16, false>(x[q]);
        if (valid) {
#pragma unroll
          for (int r = 0; r < 16; ++r) __stcg(prow + j + r * NS, make_float2(x[q][r].x, x[q][r].y));
        }
      }
    }

    // ---- forward p1, p2: global -> smem
    if constexpr (MODE != InnerMode::kInverse) forward_p1_p2<LOGM>(data, valid, slot, tx);

    // ---- mid: forward radix 16 (NS = M/16) -> Z[k], k = j + r·M/16; times K[k]; inverse radix 16
    {
      constexpr int NS = M / 16, NB = NS / T;
      cf v[NB][16];
      const float2* twM = slot.mid();
      const InnerRow row = inner_row<CHANNEL_MAJOR>(work, g.B, g.C, g.R);  // again: fewer live registers
      const float2* Krow = g.K + row.filter * M;
      // the skip term D·u is the convolution with D at lag 0: K + D/N
      const float d = (g.skip != nullptr && valid) ? g.skip[row.channel] / (float)g.N : 0.f;
      if constexpr (MODE == InnerMode::kInverse) {  // the row itself
#pragma unroll
        for (int q = 0; q < NB; ++q) {
          const int j = tx + q * T;
#pragma unroll
          for (int r = 0; r < 16; ++r) {
            const float2 z = valid ? __ldcs(data + j + r * NS) : make_float2(0.f, 0.f);
            v[q][r] = {z.x, z.y};
          }
        }
      } else {
        mid_inputs<LOGM>(slot, tx, v);
      }
#pragma unroll
      for (int q = 0; q < NB; ++q) {
        const int j = tx + q * T;
        if (q > 0) fence(v[q]);
        if constexpr (MODE != InnerMode::kInverse) {
          const float2 w = twM[j];
          apply_pow<16>(v[q], cf{w.x, w.y});
          fft_reg<16, false>(v[q]);
        }
        if constexpr (MODE == InnerMode::kSpectrum) {
          if (valid) {
#pragma unroll
            for (int r = 0; r < 16; ++r) __stcs(data + j + r * NS, make_float2(v[q][r].x * g.scale, v[q][r].y * g.scale));
          }
          continue;
        }
        if constexpr (MODE == InnerMode::kGrad || MODE == InnerMode::kGradFromU) {
          float2* prow = g.products + (valid ? row.data : 0) * M;
          if (valid) {
#pragma unroll
            for (int r = 0; r < 16; ++r) {
              const float2 x = __ldcs(prow + j + r * NS);
              __stcg(prow + j + r * NS, make_float2(x.x * v[q][r].x + x.y * v[q][r].y,  // conj(X)·DY
                                                    x.x * v[q][r].y - x.y * v[q][r].x));
            }
          }
        }
        if constexpr (MODE != InnerMode::kSpectrum && MODE != InnerMode::kInverse) {
#pragma unroll
          for (int r = 0; r < 16; ++r) {
            const float2 kk = valid ? __ldg(Krow + j + r * NS) : make_float2(0.f, 0.f);
            v[q][r] = cmul(v[q][r], cf{kk.x + d, g.conj ? -kk.y : kk.y});
          }
        }
        fft_reg<16, true>(v[q]);
        fence(v[q]);
      }
      if constexpr (MODE == InnerMode::kSpectrum) continue;
      __syncthreads();  // everyone has read the forward pass's smem (or the last row's)
      store_butterflies<T>(re, im, tx, v);
      __syncthreads();
    }
    if constexpr (Pl::LR2 > 0) pass_smem<M, T, Pl::R2, 16, true>(re, im, tx, slot.ip2());

    // ---- inverse last: radix R1, NS = M/R1, smem -> global
    {
      constexpr int NB = 32 / R1, NS = M / R1;
      cf v[NB][R1];
      last_inverse_butterflies<LOGM>(re, im, tx, slot.mid(), v, [&](int q) {
        if (!valid) return;  // stored as each butterfly completes: fewer live registers
        const int j = tx + q * T;
#pragma unroll
        for (int r = 0; r < R1; ++r) __stcg(data + j + r * NS, make_float2(v[q][r].x, v[q][r].y));
      });
    }
    if constexpr (FOLD_SUMS) {
      __shared__ int last_arrival[SPB];
      fold_batch_sum<M, T>(g, work, valid, tx, ty, last_arrival);
    }
  }
}

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
