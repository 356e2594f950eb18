// monarch_fftconv, the fp32 radix library (fp32/radix.cuh): the passes. The Stockham pass in
// shared memory, a sequence slot's view of shared memory (SlotSmem), and the whole forward,
// mid and inverse passes as the backward, filter-spectrum and four-step kernels compose them.
#pragma once

#include "fp32/radix_dft.cuh"
#include "fp32/radix_memory.cuh"
#include "fp32/radix_plan.cuh"

#include <cstdint>

namespace monarch_fftconv {
namespace {  // internal linkage: each kernel translation unit has its own copy
namespace fp32_detail {

// Stockham pass in shared memory: radix R, NS = product of the previous radices.
template <int M, int T, int R, int NS, bool INV>
__device__ __forceinline__ void pass_smem(float* re, float* im, int tx, const float2* tw) {
  constexpr int NB = 32 / R;
  cf v[NB][R];
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T, pj = pidx(j);
#pragma unroll
    for (int r = 0; r < R; ++r) v[q][r] = lds_s<M / R>(re, im, j, pj, r);
  }
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T;
    if (q > 0) fence(v[q]);  // one butterfly at a time (register budget)
    if constexpr (NS > 1) {
      const float2 w = tw[j & (NS - 1)];
      apply_pow<R>(v[q], cf{w.x, INV ? -w.y : w.y});
    }
    fft_reg<R, INV>(v[q]);
    fence(v[q]);
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T;
    const int base = (j / NS) * NS * R + (j & (NS - 1));
    if constexpr (NS % 32 == 0) {
      const int pb = pidx(base);
#pragma unroll
      for (int r = 0; r < R; ++r) sts_s<NS>(re, im, pb, r, v[q][r]);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) sts(re, im, base + r * NS, v[q][r]);
    }
  }
  __syncthreads();
}

// ------------------------------------------------------------------------------------
// whole passes, as the backward and filter-spectrum kernels compose them (the forward kernel
// has its own in fp32/forward_stages.cuh, with the u prefetch and the filter-walk fast path)
// ------------------------------------------------------------------------------------
// One sequence slot's view of a radix kernel's shared memory (layout: the slots' areas,
// then the twiddle tables): its area re/im and the tables, which the constructor builds
// with the whole CTA (a barrier: every thread of the CTA constructs one), and the split
// twiddles ω_N^j of this thread's mid-pass butterflies j0 = tx and j1.
template <int LOGM>
struct SlotSmem {
  using P = Plan<LOGM>;
  float* re;
  float* im;
  const float2* tw;
  cf wp0, wp1;

  __device__ __forceinline__ SlotSmem(float* sm, int S) {
    const int tx = threadIdx.x, ty = threadIdx.y;
    re = sm + (size_t)ty * 2 * S;
    im = re + S;
    float2* tables = reinterpret_cast<float2*>(sm + (size_t)P::SPB * 2 * S);
    build_twiddles<LOGM>(tables, ty * P::T + tx, P::THREADS);
    __syncthreads();
    tw = tables;
    const float2 p0 = tw[P::OFF_POST + tx], p1 = tw[P::OFF_POST + (tx == 0 ? P::M / 32 : P::M / 16 - tx)];
    wp0 = {p0.x, p0.y};
    wp1 = {p1.x, p1.y};
  }
  __device__ __forceinline__ const float2* fp2() const { return tw + P::OFF_FP2; }
  __device__ __forceinline__ const float2* mid() const { return tw + P::OFF_TM; }
  __device__ __forceinline__ const float2* ip2() const { return tw + P::OFF_IP2; }
};

// The outputs v[q][r] of the butterflies j = tx + q·T into smem at j·R + r, where a Stockham
// pass with NS = 1 puts them (R | 32: the R outputs never straddle a pad).
template <int T, int NB, int R>
__device__ __forceinline__ void store_butterflies(float* re, float* im, int tx, const cf (&v)[NB][R]) {
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int pb = pidx((tx + q * T) * R);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      re[pb + r] = v[q][r].x;
      im[pb + r] = v[q][r].y;
    }
  }
}

// A gate (pregate or postgate: (B, C, L) contiguous, like y) applied to the values v[q][r] =
// (x[t0], x[t0 + 1]), t0 = 2(j + r·NS), of this thread's butterflies j = tx + q·T, r < R/2:
// the pairs the first forward and the last inverse pass read and write. Products in fp32.
template <int T, int NB, int R, typename IO>
__device__ __forceinline__ void apply_gate(cf (&v)[NB][R], const IO* gate, int tx, int ns, int Lv) {
  const bool gpair = (reinterpret_cast<uintptr_t>(gate) & (2 * sizeof(IO) - 1)) == 0;
  // Every load issued before the first product (load_pair_bits): a product inside the load's
  // branch waited for that load before the next one issued. Zero past Lv, where v is zero
  // or not stored.
  pair_bits_t<IO> bits[NB][R / 2];
#pragma unroll
  for (int q = 0; q < NB; ++q) {
#pragma unroll
    for (int r = 0; r < R / 2; ++r) bits[q][r] = load_pair_bits<IO>(gate, 2 * (tx + q * T + r * ns), Lv, gpair);
  }
#pragma unroll
  for (int q = 0; q < NB; ++q) {
#pragma unroll
    for (int r = 0; r < R / 2; ++r) {
      const float2 g2 = pair_bits_to_float2<IO>(bits[q][r]);
      v[q][r].x *= g2.x;
      v[q][r].y *= g2.y;
    }
  }
}

// MONARCH_FFTCONV_GATED_L2_PREFETCH=1 (a build switch, session 38; unmeasured, off): the gated
// forward (fp32 io) asks L2, when a sequence starts, for its postgate row and for the next
// sequence's u and pregate rows (prefetch.global.L2: no register held, no shared memory), so
// that the gate loads at the first and last pass come from L2, not DRAM. ncu
// (session 38, H100, 16x256x8192 fp32): the gated kernel 454.7 against the plain 331.6 us,
// issue slots 49.5% against 60.2%, 7.45 against 6.00 cycles between a warp's issues, L2 hit rate
// 39% against 63%: the gates' loads wait on DRAM with two CTAs an SM to hide them.
// The gated grad kernel asks for the next sequence's gates with its u and dy (which the ungated
// one has asked for since session 27: −4% measured). Predicted −8 to −15% of the gated forward's
// time at 16x256x8192 (397 us in kernels), −3 to −8% of the gated grad kernel's (822 us).
#ifndef MONARCH_FFTCONV_GATED_L2_PREFETCH
#define MONARCH_FFTCONV_GATED_L2_PREFETCH 0
#endif

// MONARCH_FFTCONV_TX_FENCES=1 (a build switch, session 39; unmeasured, off): shared-memory
// addresses derived from tx computed where they are used, not held. Every smem address of a pass
// is a function of tx, so the compiler hoists them out of the sequence loop and holds them, and
// forward p2 and the inverse passes touch the same slots (index i + i/32 of the same
// butterflies), so it also holds p2's addresses through the mid pass for the inverse passes;
// under the 128-register cap it spills them (at N = 8192, fp32 io: 34 stored before the mid pass,
// 33 loaded in the last pass, every sequence). With an opaque copy of tx (fence) for the inverse
// passes (ForwardIoChoices::kInverseTxFence; the four-step inner kernel's mid store and inverse
// passes too), and for 2-byte io one for each sequence (kLoopTxFence), they are computed again,
// two integer instructions each. SASS (sm_90a, nvcc 13.0), spill instructions in the sequence
// loop: fp32 forward N = 4096 113 -> 0, 8192 69 -> 0, 16384 5 -> 5, 32768 3 -> 6, instructions
// -2.3 to -3.9% at every N; its gated instances 91 -> 1, 73 -> 0, 23 -> 3 at 4096, 8192, 16384,
// -5 to -8%; bf16 io N = 4096 47 -> 8, 8192 62 -> 33, 16384 3 -> 0, 32768 31 -> 0; the
// own-path bf16 instances 25-199 -> 4-12; the inner kernel at M = 4096 (N = 2^19) 104-176 -> 0,
// at M = 8192 none before or after and -1.3% instructions. Predicted (H100): fp32 forward kernels
// -8 to -15% at 16x256x{2048,4096}, -2 to -4% at 16x256x8192; bf16 I/O forward -3 to -10% at
// 16x256x{2048,4096,8192}; the gated fp32 forward -6 to -12% at 16x256x8192; four-step calls at
// N <= 2^18 within noise. The same arithmetic: the same bits.
#ifndef MONARCH_FFTCONV_TX_FENCES
#define MONARCH_FFTCONV_TX_FENCES 0
#endif

// Sequence s's row of a gate ((B, C, L) contiguous), asked of L2 by `threads` threads.
template <typename IO>
__device__ __forceinline__ void prefetch_gate_row(const void* gate, const KArgs& a, int64_t s, int tx, int threads) {
  const int64_t b = s % a.B, c = s / a.B;
  prefetch_span_l2(static_cast<const IO*>(gate) + (b * a.C + c) * a.L, a.L * (int64_t)sizeof(IO), tx, threads);
}

// The causal half of the last inverse pass's values v[q][r] = (w[t0], w[t0 + 1]), t0 =
// 2(tx + q·T + r·ns), r < R/2, into out at t < Lv (opair: out aligned for two-element stores):
// inverse_passes' y, and the gated kernels' outputs (the forward's z, the backward's dpregate and du).
template <int T, int NB, int R, typename IO>
__device__ __forceinline__ void store_causal_half(IO* out, const cf (&v)[NB][R], int tx, int ns, int Lv, bool opair) {
#pragma unroll
  for (int q = 0; q < NB; ++q) {
#pragma unroll
    for (int r = 0; r < R / 2; ++r) {
      const int t0 = 2 * (tx + q * T + r * ns);
      if (opair && t0 + 1 < Lv) {
        io_store2<IO>(out + t0, v[q][r].x, v[q][r].y);
      } else {
        if (t0 < Lv) io_store<IO>(out + t0, v[q][r].x);
        if (t0 + 1 < Lv) io_store<IO>(out + t0 + 1, v[q][r].y);
      }
    }
  }
}

// Forward p1's radix-R1 butterflies on this thread's loaded values v (UPPER_ZERO: inputs R/2..R-1
// known zero) into smem, then p2. Starts with a barrier before its first smem write.
template <int LOGM, bool UPPER_ZERO>
__device__ __forceinline__ void forward_p1_butterflies_and_p2(float* re, float* im, int tx, const float2* twFP2,
                                                              cf (&v)[32 / Plan<LOGM>::R1][Plan<LOGM>::R1]) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T, R = P::R1, NB = 32 / R;
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    if (q > 0) fence(v[q]);
    fft_reg<R, false, UPPER_ZERO>(v[q]);
    fence(v[q]);
  }
  __syncthreads();
  store_butterflies<T>(re, im, tx, v);
  __syncthreads();
  if constexpr (P::LR2 > 0) pass_smem<M, T, P::R2, P::R1, false>(re, im, tx, twFP2);
}

// Forward passes p1 (global -> smem, radix R1, the upper half of z known zero) and p2: the
// sequence x[0:Lv), zero beyond, leaves them in smem ready for the mid pass. Starts with a
// barrier before its first smem write, so smem may still be read when it is called.
// GATED: the sequence gate ⊙ x where gate (contiguous, like x's row) is given (the gated grad
// kernel's x = pregate ⊙ u and dz = postgate ⊙ dy); the ungated instance is the code as it was.
template <int LOGM, typename IO, bool GATED = false>
__device__ __forceinline__ void forward_passes(float* re, float* im, int tx, const float2* twFP2, const IO* x,
                                               int Lv, const IO* gate = nullptr) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T, R = P::R1, NB = 32 / R;
  const bool xpair = (reinterpret_cast<uintptr_t>(x) & (2 * sizeof(IO) - 1)) == 0;
  cf v[NB][R];
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T;
#pragma unroll
    for (int r = 0; r < R / 2; ++r) {
      const int t0 = 2 * (j + r * (M / R));
      if constexpr (sizeof(IO) == 4) {
        // fp32: the loads land as the values. (The same loads through load_pair_bits compile
        // to other code at N = 1024, 16384 and 32768; this is the code that was measured.)
        if (xpair && t0 + 1 < Lv) {
          const float2 x2 = io_load2<IO>(x + t0);
          v[q][r] = {x2.x, x2.y};
        } else {
          v[q][r].x = t0 < Lv ? io_load<IO>(x + t0) : 0.f;
          v[q][r].y = t0 + 1 < Lv ? io_load<IO>(x + t0 + 1) : 0.f;
        }
      } else {
        v[q][r] = {__uint_as_float(load_pair_bits<IO>(x, t0, Lv, xpair)), 0.f};  // the raw word, parked
      }
    }
#pragma unroll
    for (int r = R / 2; r < R; ++r) v[q][r] = {0.f, 0.f};
  }
  if constexpr (sizeof(IO) == 2) {
    // widened once every load has issued (load_pair_bits)
#pragma unroll
    for (int q = 0; q < NB; ++q) {
#pragma unroll
      for (int r = 0; r < R / 2; ++r) {
        const float2 x2 = pair_bits_to_float2<IO>(__float_as_uint(v[q][r].x));
        v[q][r] = {x2.x, x2.y};
      }
    }
  }
  if constexpr (GATED) {
    if (gate != nullptr) apply_gate<T>(v, gate, tx, M / R, Lv);
  }
  forward_p1_butterflies_and_p2<LOGM, true>(re, im, tx, twFP2, v);
}


// The mid pass's forward radix-16 butterflies j0 = tx and j1 (Z of the packed sequence at
// k = j + r·M/16), from smem into registers.
template <int M>
__device__ __forceinline__ void mid_forward(const float* re, const float* im, int tx, const float2* twM,
                                            cf (&A)[16], cf (&Bv)[16]) {
  constexpr int NS = M / 16;
  const int j0 = tx, j1 = tx == 0 ? M / 32 : NS - tx;
  const int pj0 = pidx(j0), pj1 = pidx(j1);
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    A[r] = lds_s<NS>(re, im, j0, pj0, r);
    Bv[r] = lds_s<NS>(re, im, j1, pj1, r);
  }
  const float2 w0 = twM[j0], w1 = twM[j1];
  apply_pow<16>(A, cf{w0.x, w0.y});
  fft_reg<16, false>(A);
  fence(A);
  fence(Bv);
  apply_pow<16>(Bv, cf{w1.x, w1.y});
  fft_reg<16, false>(Bv);
}

// The last inverse pass's butterflies, smem -> registers: v[q][r] is output j + r·M/R1 of
// butterfly j = tx + q·T (radix R1, the twiddles of span M conjugated). done(q) runs as
// butterfly q completes: a store there keeps fewer values live.
template <int LOGM, class Done>
__device__ __forceinline__ void last_inverse_butterflies(const float* re, const float* im, int tx, const float2* twM,
                                                         cf (&v)[32 / Plan<LOGM>::R1][Plan<LOGM>::R1], Done&& done) {
  using P = Plan<LOGM>;
  constexpr int T = P::T, R = P::R1, NB = 32 / R, NS = P::M / R;
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T, pj = pidx(j);
#pragma unroll
    for (int r = 0; r < R; ++r) v[q][r] = lds_s<NS>(re, im, j, pj, r);
  }
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const float2 w = twM[tx + q * T];
    if (q > 0) fence(v[q]);
    apply_pow<R>(v[q], cf{w.x, -w.y});
    fft_reg<R, true>(v[q]);
    fence(v[q]);
    done(q);
  }
}

// The mid pass's inverse radix-16 butterflies j0 = tx and j1 (NS = 1), registers -> smem,
// once every thread is done with the stage; ends with a barrier.
__device__ __forceinline__ void mid_inverse(float* re, float* im, int j0, int j1, cf (&A2)[16], cf (&B2)[16]) {
  fence(A2);
  fft_reg<16, true>(A2);
  fence(A2);
  fence(B2);
  fft_reg<16, true>(B2);
  __syncthreads();  // everyone is done with the stage
  {
    const int pb0 = pidx(j0 * 16), pb1 = pidx(j1 * 16);
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      re[pb0 + r] = A2[r].x;
      im[pb0 + r] = A2[r].y;
      re[pb1 + r] = B2[r].x;
      im[pb1 + r] = B2[r].y;
    }
  }
  __syncthreads();
}

// The mid pass's inverse radix-16 butterflies, the inverse p2 and the last inverse pass's
// butterflies (smem -> registers): v[q][r] = (w[m], ...) holds the samples (y[t0], y[t0 + 1]),
// t0 = 2(tx + q·T + r·NS), NS = M/R1, of the N-point circle.
template <int LOGM>
__device__ __forceinline__ void inverse_to_registers(float* re, float* im, int tx, const float2* twM,
                                                     const float2* twIP2, cf (&A2)[16], cf (&B2)[16],
                                                     cf (&v)[32 / Plan<LOGM>::R1][Plan<LOGM>::R1]) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T;
  mid_inverse(re, im, tx, tx == 0 ? M / 32 : M / 16 - tx, A2, B2);
  if constexpr (P::LR2 > 0) pass_smem<M, T, P::R2, 16, true>(re, im, tx, twIP2);
  last_inverse_butterflies<LOGM>(re, im, tx, twM, v, [](int) {});
}

// inverse_to_registers, then every sample of the N-point circle handed to store(t, value),
// t in [0, N): the filter gradient's negative lags live in its back half (bin N - s).
template <int LOGM, class Store>
__device__ __forceinline__ void inverse_passes_circle(float* re, float* im, int tx, const float2* twM,
                                                      const float2* twIP2, cf (&A2)[16], cf (&B2)[16], Store&& store) {
  using P = Plan<LOGM>;
  constexpr int T = P::T, R = P::R1, NB = 32 / R, NS = P::M / R;
  cf v[NB][R];
  inverse_to_registers<LOGM>(re, im, tx, twM, twIP2, A2, B2, v);
#pragma unroll
  for (int q = 0; q < NB; ++q) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int t0 = 2 * (tx + q * T + r * NS);
      store(t0, v[q][r].x);
      store(t0 + 1, v[q][r].y);
    }
  }
}

// inverse_to_registers, then the causal half stored (smem -> global): y[t] for t < Lv.
template <int LOGM, typename IO>
__device__ __forceinline__ void inverse_passes(float* re, float* im, int tx, const float2* twM, const float2* twIP2,
                                               cf (&A2)[16], cf (&B2)[16], IO* y, int Lv) {
  using P = Plan<LOGM>;
  constexpr int T = P::T, R = P::R1, NB = 32 / R, NS = P::M / R;
  cf v[NB][R];
  inverse_to_registers<LOGM>(re, im, tx, twM, twIP2, A2, B2, v);
  const bool ypair = (reinterpret_cast<uintptr_t>(y) & (2 * sizeof(IO) - 1)) == 0;
  store_causal_half<T>(y, v, tx, NS, Lv, ypair);
}

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
