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

// conj(x)·z, its roundings fixed (the products kGrad stores and kGradSum sums must be the same bits).
__device__ __forceinline__ float2 conj_times(float2 x, cf z) {
  return make_float2(__fmaf_rn(x.x, z.x, __fmul_rn(x.y, z.y)), __fmaf_rn(x.x, z.y, -__fmul_rn(x.y, z.x)));
}

// One row (s, k2) of M complex values per CTA slot: forward FFT_M (Stockham passes p1, p2 and
// the radix-16 "mid" pass, whose outputs are Z[j + r·M/16] in natural order), the filter
// product, and the inverse passes in the mirror order, in place.
template <int LOGM, InnerMode MODE>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS) inner_kernel(const FourStepArgs g, int S) {
  using Pl = Plan<LOGM>;
  constexpr int M = Pl::M, T = Pl::T, SPB = Pl::SPB, R1 = Pl::R1;
  extern __shared__ float4 smem_raw[];
  const SlotSmem<LOGM> slot(reinterpret_cast<float*>(smem_raw), S);
  float *re = slot.re, *im = slot.im;
  const int tx = threadIdx.x, ty = threadIdx.y;
  constexpr bool kInverseTxFence = MONARCH_FFTCONV_TX_FENCES != 0 && MODE != InnerMode::kInverse;
  const int64_t rows = (g.columns >> g.logM) * g.R;
  // A slot's item: one row, or in kGradSum the B rows b·(C·R) + item of one (c, k2) = item, in
  // the order b = 0 .. B-1, so that the slot alone sums their products (a fixed order).
  const int64_t steps = MODE == InnerMode::kGradSum ? g.B : 1;
  const int64_t items = rows / steps;

  for (int64_t ib = (int64_t)blockIdx.x * SPB; ib < items; ib += (int64_t)gridDim.x * SPB) {
    for (int64_t b = 0; b < steps; ++b) {
      const int64_t item = ib + ty, row = b * items + item;
      const bool valid = item < items;
      float2* data = g.a + (valid ? row : 0) * M;

      // ---- forward p1: global -> smem, radix R1, NS = 1
      if constexpr (MODE != InnerMode::kInverse) {
        constexpr int NB = 32 / R1;
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
        store_butterflies<T>(re, im, tx, v);
        __syncthreads();
      }
      if constexpr (Pl::LR2 > 0 && MODE != InnerMode::kInverse)
        pass_smem<M, T, Pl::R2, R1, false>(re, im, tx, slot.fp2());

      // The inverse side's tx (the mid pass's store, the inverse passes): opaque with
      // MONARCH_FFTCONV_TX_FENCES (radix_passes.cuh), so that its shared-memory addresses
      // are computed again, not the forward passes' held through the mid pass.
      int tx_inverse = tx;
      if constexpr (kInverseTxFence) fence(tx_inverse);
      // ---- mid: forward radix 16 (NS = M/16) -> Z[k], k = j + r·M/16; times K[k]; inverse radix 16
      {
        constexpr int NS = M / 16, NB = NS / T;
        cf v[NB][16];
        const float2* twM = slot.mid();
        const int64_t s = row / g.R;
        const int k2 = (int)(row % g.R);
        const int64_t c = s % g.C;
        const float2* Krow = g.K + (c * g.R + k2) * (int64_t)M;
        // the skip term D·u is the convolution with D at lag 0: K + D/N
        const float d = (g.skip != nullptr && valid) ? g.skip[c] / (float)g.N : 0.f;
#pragma unroll
        for (int q = 0; q < NB; ++q) {
          const int j = tx + q * T, pj = pidx(j);
#pragma unroll
          for (int r = 0; r < 16; ++r) {
            if constexpr (MODE == InnerMode::kInverse) {
              const float2 z = valid ? __ldcs(data + j + r * NS) : make_float2(0.f, 0.f);
              v[q][r] = {z.x, z.y};
            } else {
              v[q][r] = lds_s<NS>(re, im, j, pj, r);
            }
          }
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
              for (int r = 0; r < 16; ++r)
                __stcs(data + j + r * NS, make_float2(v[q][r].x * g.scale, v[q][r].y * g.scale));
            }
            continue;
          }
          if constexpr (MODE == InnerMode::kConvKeep) {
            if (valid) {  // X for the backward: read once, much later
              float2* xrow = g.spectrum_out + row * M;
#pragma unroll
              for (int r = 0; r < 16; ++r) __stcs(xrow + j + r * NS, make_float2(v[q][r].x, v[q][r].y));
            }
          }
          if constexpr (MODE == InnerMode::kGrad) {
            if (valid) {
              const float2* xrow = g.products + row * M;
              float2* prow = g.products_out + row * M;
#pragma unroll
              for (int r = 0; r < 16; ++r) __stcg(prow + j + r * NS, conj_times(__ldcs(xrow + j + r * NS), v[q][r]));
            }
          }
          if constexpr (MODE == InnerMode::kGradSum) {
            if (valid) {  // G[item] = Σ_b conj(X_b)·DY_b, b in order, times scale at the last: batch_sum's bits
              const float2* xrow = g.products + row * M;
              float2* grow = g.grad_sum + item * M;
#pragma unroll
              for (int r = 0; r < 16; ++r) {
                float2 sum = conj_times(__ldcs(xrow + j + r * NS), v[q][r]);
                if (b > 0) {  // this slot's own store of step b - 1, from L2
                  const float2 before = __ldcg(grow + j + r * NS);
                  sum = make_float2(__fadd_rn(before.x, sum.x), __fadd_rn(before.y, sum.y));
                }
                if (b == steps - 1) sum = make_float2(__fmul_rn(sum.x, g.scale), __fmul_rn(sum.y, g.scale));
                __stcg(grow + j + r * NS, sum);
              }
            }
          }
          if constexpr (MODE == InnerMode::kConv || MODE == InnerMode::kConvKeep || MODE == InnerMode::kGrad ||
                        MODE == InnerMode::kGradSum) {
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
        store_butterflies<T>(re, im, tx_inverse, v);
        __syncthreads();
      }
      if constexpr (Pl::LR2 > 0) pass_smem<M, T, Pl::R2, 16, true>(re, im, tx_inverse, slot.ip2());

      // ---- inverse last: radix R1, NS = M/R1, smem -> global
      {
        constexpr int NB = 32 / R1, NS = M / R1;
        cf v[NB][R1];
        last_inverse_butterflies<LOGM>(re, im, tx_inverse, slot.mid(), v, [&](int q) {
          if (!valid) return;  // stored as each butterfly completes: fewer live registers
          const int j = tx_inverse + q * T;
#pragma unroll
          for (int r = 0; r < R1; ++r) __stcg(data + j + r * NS, make_float2(v[q][r].x, v[q][r].y));
        });
      }
    }
  }
}

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
