// monarch_fftconv: fused fp32-accurate causal FFT convolution (SIMT, no tensor cores).
//
// One sequence (b, c) is convolved entirely on chip, from the load of u to the store of y:
//
//   x = u[b, c, 0:L], zero-padded to N = fft_size (the padding is never in memory)
//   z[m] = x[2m] + i·x[2m+1],  m in [0, M),  M = N/2          (real input packed as complex)
//   Z = FFT_M(z)                                              (Stockham radix passes)
//   X[k] = ½(Z[k] + conj Z[M-k]) - ½·i·ω^k (Z[k] - conj Z[M-k]),  ω = exp(-2πi/N)
//   Y[k] = X[k]·K[k],  k in [0, M]                            (K carries the 1/N)
//   V[k] = (Y[k] + conj Y[M-k]) + i·ω^-k (Y[k] - conj Y[M-k]),  k in [0, M)
//   w = unnormalised inverse FFT_M(V),  w[m] = y[2m] + i·y[2m+1]
//
// Radix plan (all passes are Stockham, autosorting; E = 32 complex values per thread,
// T = M/32 threads per sequence):
//   forward : p1 (radix R1, global -> smem; z[m] = 0 for m >= M/2, so half of every
//             butterfly's inputs are known zeros) , [p2 (radix R2)] , mid (radix 16)
//   inverse : mid (radix 16), [p2 (radix R2)], last (radix R1, smem -> global; only the
//             first half of the outputs, w[m] for m < M/2, is stored: the causal part)
//   with log2(R1) + log2(R2) + 4 = log2(M).
// The "mid" pass fuses the last forward pass, the real-FFT split, the filter product and
// the first inverse pass in registers: a thread owns butterflies j and M/16 - j, whose
// outputs Z[j + r·M/16] and Z[M/16 - j + r·M/16] are exactly the (k, M-k) pairs the split
// needs, and whose V outputs are exactly what the first inverse butterflies read.
//
// In-register DFTs (radix <= 32) are radix-2 decimation in time with the twiddle folded into
// FMAs ((a + Wb, 2a - (a + Wb))); inter-pass twiddles w^r come from one correctly rounded
// table value w per butterfly and a short product tree.
//
// Shared memory per sequence: re[S], im[S] (structure of arrays, index i stored at
// i + i/32 to break bank conflicts of the strided Stockham writes). During the mid pass
// the same memory holds the channel's filter spectrum, copied with cp.async in its global
// order [k1][k2] with rows padded to n2+1 float2 (so that the reads by frequency, which
// walk k1, are conflict free). Twiddle tables (one per pass, from double-precision
// sincospi, built once per CTA; the grid is persistent) follow the per-sequence areas; for
// 2-byte io, a buffer into which the next sequence's u is prefetched (cp.async) follows them.
// The skip term D·u is folded into the filter (K[f] += D/N), so it costs no extra pass.
//
// CTA: 256 threads (M/32 per sequence; 256/(M/32) sequences per CTA below N = 16384),
// __launch_bounds__(256, 2): two CTAs per SM, <= 128 registers per thread.
// N = 16384: 76 KB smem per CTA (fp32 io), 109 KB with the u prefetch buffer (bf16/fp16 io).
// N = 32768: one CTA of 512 threads per sequence and per SM (the same 16 warps and 128
// registers per thread), 156 KB smem (fp32 io), 188 KB with the prefetch buffer.
// Timings and accuracy: docs/performance.md.
//
// Each sequence is independent: nothing is shared between two sequences' arithmetic.

#include "fp32/radix.cuh"

namespace monarch_fftconv {
namespace {
namespace fp32_detail {


template <int LOGM, typename IO>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS) fftconv_fp32_kernel(const KArgs a) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T, SPB = P::SPB;
  extern __shared__ float4 smem_raw[];
  float* sm = reinterpret_cast<float*>(smem_raw);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * T + tx;
  float* re = sm + (size_t)ty * 2 * a.S;
  float* im = re + a.S;
  float2* stage = reinterpret_cast<float2*>(re);
  float2* tw = reinterpret_cast<float2*>(sm + (size_t)SPB * 2 * a.S);
  // prefetch buffer (when a.prefetch): M elements of u per sequence slot, after the tables
  IO* ubuf = reinterpret_cast<IO*>(tw + P::N_TW) + (size_t)ty * M;

  // ---- twiddle tables, once per CTA
  build_twiddles<LOGM>(tw, tid, P::THREADS);
  __syncthreads();
  const float2* twFP2 = tw + P::OFF_FP2;
  const float2* twM = tw + P::OFF_TM;
  const float2* twPost = tw + P::OFF_POST;
  const float2* twIP2 = tw + P::OFF_IP2;

  const int64_t nseq = a.B * a.C;
  const int64_t L = a.L;
  // pf_cur: this slot's next sequence has its u staged in ubuf
  auto seq_ptr = [&](int64_t sq) {
    const int64_t bq = sq % a.B, cq = sq / a.B;
    return static_cast<const IO*>(a.u) + bq * a.ubs + cq * a.ucs;
  };
  bool pf_cur = false;
  if (kPrefetchU<IO> && a.prefetch) {
    const int64_t s0 = (int64_t)blockIdx.x * SPB + ty;
    if (s0 < nseq) {
      const IO* p0 = seq_ptr(s0);
      pf_cur = (reinterpret_cast<uintptr_t>(p0) & 15) == 0;
      if (pf_cur) prefetch_u<IO, T>(ubuf, p0, (int)L, tx);
    }
  }
  for (int64_t sb = (int64_t)blockIdx.x * SPB; sb < nseq; sb += (int64_t)gridDim.x * SPB) {
    const int64_t s = sb + ty;
    const bool valid = s < nseq;
    int64_t b = 0, c = 0;
    if (valid) {
      b = s % a.B;
      c = s / a.B;
    }
    const IO* u = static_cast<const IO*>(a.u) + b * a.ubs + c * a.ucs;
    IO* y = static_cast<IO*>(a.y) + (b * a.C + c) * L;  // y is contiguous (B, C, L)
    // valid length as int (L <= N/2 <= 16384); an invalid slot reads and writes nothing
    const int Lv = valid ? (int)L : 0;
    const bool upair = (reinterpret_cast<uintptr_t>(u) & (2 * sizeof(IO) - 1)) == 0;
    const bool ypair = (reinterpret_cast<uintptr_t>(y) & (2 * sizeof(IO) - 1)) == 0;

    // ================= forward p1: global -> smem, radix R1, NS = 1, upper half zero
    {
      constexpr int R = P::R1, NB = 32 / R;
      cf v[NB][R];
      if (kPrefetchU<IO> && a.prefetch) {
        cp_async_wait_all();
        __syncthreads();  // every thread's part of the staged u is visible
      }
      const bool from_smem = kPrefetchU<IO> && pf_cur;
#pragma unroll
      for (int q = 0; q < NB; ++q) {
        const int j = tx + q * T;
#pragma unroll
        for (int r = 0; r < R / 2; ++r) {
          const int t0 = 2 * (j + r * (M / R));
          if (from_smem) {
            if (t0 + 1 < Lv) {
              float2 x2;
              if constexpr (sizeof(IO) == 4) {
                x2 = *reinterpret_cast<const float2*>(ubuf + t0);
              } else if constexpr (std::is_same_v<IO, __nv_bfloat16>) {
                x2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(ubuf + t0));
              } else {
                x2 = __half22float2(*reinterpret_cast<const __half2*>(ubuf + t0));
              }
              v[q][r] = {x2.x, x2.y};
            } else {
              v[q][r].x = t0 < Lv ? io_to_float(ubuf[t0]) : 0.f;
              v[q][r].y = 0.f;
            }
          } else if (upair && t0 + 1 < Lv) {
            const float2 x2 = io_load2<IO>(u + t0);
            v[q][r] = {x2.x, x2.y};
          } else {
            v[q][r].x = t0 < Lv ? io_load<IO>(u + t0) : 0.f;
            v[q][r].y = t0 + 1 < Lv ? io_load<IO>(u + t0 + 1) : 0.f;
          }
        }
#pragma unroll
        for (int r = R / 2; r < R; ++r) v[q][r] = {0.f, 0.f};
      }
#pragma unroll
      for (int q = 0; q < NB; ++q) {
        if (q > 0) fence(v[q]);
        fft_reg<R, false, true>(v[q]);
        fence(v[q]);
      }
      __syncthreads();  // the previous sequence's last pass has read smem
      store_butterflies<T>(re, im, tx, v);
      __syncthreads();
    }
    // ================= forward p2
    if constexpr (P::LR2 > 0) pass_smem<M, T, P::R2, P::R1, false>(re, im, tx, twFP2);

    // ================= mid: forward radix-16 (NS = M/16), split, ·K, inverse radix-16 (NS = 1)
    {
      constexpr int NS = M / 16;
      const bool z = (tx == 0);
      const int j0 = tx;
      const int j1 = z ? M / 32 : NS - tx;
      cf A[16], Bv[16];
      {
        const int pj0 = pidx(j0), pj1 = pidx(j1);
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          A[r] = lds_s<NS>(re, im, j0, pj0, r);
          Bv[r] = lds_s<NS>(re, im, j1, pj1, r);
        }
      }
      {
        const float2 w0 = twM[j0], w1 = twM[j1];
        apply_pow<16>(A, cf{w0.x, w0.y});
        fft_reg<16, false>(A);
        fence(A);
        fence(Bv);
        apply_pow<16>(Bv, cf{w1.x, w1.y});
        fft_reg<16, false>(Bv);
      }
      __syncthreads();  // all of Z is in registers: smem becomes the filter stage
      if (valid) {
        const float2* Kc = a.K + c * (int64_t)((a.n1 / 2 + 1) * a.n2);
        const int total = (a.n1 / 2 + 1) * a.n2;
        const int rowp = a.n2 + 1;
        for (int e = tx; e < total; e += T)
          cp_async8(stage + (e >> a.ln2) * rowp + (e & (a.n2 - 1)), Kc + e);
      }
      cp_async_wait_all();
      if (a.skip != nullptr && a.skip_fold && valid) {
        // skip folded into the filter: K[f] += D/N for every f (1/N is a power of two: exact).
        // The real part of a stored entry is the real part of every K[f] read from it, also
        // of the conjugated ones. Each thread adjusts the entries it copied itself.
        const float dsk = a.skip[c] * (1.f / (float)a.N);
        const int total = (a.n1 / 2 + 1) * a.n2;
        const int rowp = a.n2 + 1;
        for (int e = tx; e < total; e += T) stage[(e >> a.ln2) * rowp + (e & (a.n2 - 1))].x += dsk;
      }
      __syncthreads();
      // p1 has consumed ubuf: stage the next sequence's u while this one finishes
      pf_cur = false;
      if (kPrefetchU<IO> && a.prefetch) {
        const int64_t sn = s + (int64_t)gridDim.x * SPB;
        if (sn < nseq) {
          const IO* pn = seq_ptr(sn);
          pf_cur = (reinterpret_cast<uintptr_t>(pn) & 15) == 0;
          if (pf_cur) prefetch_u<IO, T>(ubuf, pn, (int)L, tx);
        }
      }

      const float2 p0 = twPost[j0], p1 = twPost[j1];
      const cf wp0 = {p0.x, p0.y}, wp1 = {p1.x, p1.y};
      cf A2[16], B2[16];
      if (!z && a.n1 <= NS) {
        // pairs (A[i], B[15-i]): k = j0 + i·NS, M-k = (M - j0) - i·NS. n1 | NS, so along i
        // the filter row k1 (and so the conjugation) is fixed and k2 moves by ±NS/n1.
        const KWalk kp(j0, +1, NS, a), kq(M - j0, -1, NS, a);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          pair_fn(A[i], Bv[15 - i], kp.at(stage, i), kq.at(stage, i), tw_const<false>(wp0, i, 32), A2[i],
                  B2[15 - i]);
          if (i % kPairsPerFence == kPairsPerFence - 1) { fence(A2[i]); fence(B2[15 - i]); }
        }
      } else if (!z) {
        // pairs (A[i], B[15-i]): k = j0 + i·NS, M-k = j1 + (15-i)·NS
#pragma unroll
        for (int i = 0; i < 16; ++i) pair_at<M>(stage, a, i, j0 + i * NS, A[i], Bv[15 - i], wp0, A2[i], B2[15 - i]);
      } else {
        // thread 0 owns the self-paired butterflies j0 = 0 and j1 = M/32
        cf dummy;
        // k = 0 with M - k = M (Z[M] = Z[0])
        pair_fn(A[0], A[0], kspec(stage, 0, a), kspec(stage, M, a), cf{1.f, 0.f}, A2[0], dummy);
        // k = M/2 pairs with itself; ω_N^(N/4) = -i
        pair_fn(A[8], A[8], kspec(stage, M / 2, a), kspec(stage, M / 2, a), cf{0.f, -1.f}, A2[8], dummy);
#pragma unroll
        for (int i = 1; i < 8; ++i) pair_at<M>(stage, a, i, i * NS, A[i], A[16 - i], wp0, A2[i], A2[16 - i]);
#pragma unroll
        for (int i = 0; i < 8; ++i) pair_at<M>(stage, a, i, j1 + i * NS, Bv[i], Bv[15 - i], wp1, B2[i], B2[15 - i]);
      }
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
    // ================= inverse p2
    if constexpr (P::LR2 > 0) pass_smem<M, T, P::R2, 16, true>(re, im, tx, twIP2);

    // ================= inverse last: smem -> global, radix R1, NS = M/R1, causal half stored
    {
      constexpr int R = P::R1, NB = 32 / R, NS = M / R;
      cf v[NB][R];
      last_inverse_butterflies<LOGM>(re, im, tx, twM, v, [](int) {});
      {
        const bool direct_skip = a.skip != nullptr && !a.skip_fold;
        const float sk = (direct_skip && valid) ? a.skip[c] : 0.f;
#pragma unroll
        for (int q = 0; q < NB; ++q) {
          const int j = tx + q * T;
#pragma unroll
          for (int r = 0; r < R / 2; ++r) {
            const int t0 = 2 * (j + r * NS);
            float y0 = v[q][r].x, y1 = v[q][r].y;
            if (ypair && upair && t0 + 1 < Lv) {
              if (direct_skip) {
                const float2 x2 = io_load2<IO>(u + t0);
                y0 = fmaf(sk, x2.x, y0);
                y1 = fmaf(sk, x2.y, y1);
              }
              io_store2<IO>(y + t0, y0, y1);
            } else {
              if (direct_skip) {
                if (t0 < Lv) y0 = fmaf(sk, io_load<IO>(u + t0), y0);
                if (t0 + 1 < Lv) y1 = fmaf(sk, io_load<IO>(u + t0 + 1), y1);
              }
              if (ypair && t0 + 1 < Lv) {
                io_store2<IO>(y + t0, y0, y1);
              } else {
                if (t0 < Lv) io_store<IO>(y + t0, y0);
                if (t0 + 1 < Lv) io_store<IO>(y + t0 + 1, y1);
              }
            }
          }
        }
      }
    }
  }
}

struct ForwardShape {
  int ctas_per_sm = 0, sms = 0, prefetch = 0;
  size_t smem = 0;
};

// Resident CTAs, SM count, the u prefetch decision and the smem size for one kernel instance
// on the current device. The occupancy queries cost host time: asked once per device.
template <int LOGM, typename IO>
cudaError_t forward_shape(int n1, int n2, ForwardShape& shape) {
  using P = Plan<LOGM>;
  static ForwardShape cached[kMaxDevices];  // ctas_per_sm == 0: not asked yet
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < kMaxDevices && cached[dev].ctas_per_sm > 0) {
    shape = cached[dev];
    return cudaSuccess;
  }
  const size_t smem0 = smem_bytes<LOGM>(n1, n2);
  const size_t smem_pf = smem0 + (size_t)P::SPB * P::M * sizeof(IO);  // + the u prefetch buffers
  const bool try_pf = kPrefetchU<IO> && smem_pf <= kMaxSmem;
  auto kern = fftconv_fp32_kernel<LOGM, IO>;
  err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(try_pf ? smem_pf : smem0));
  if (err != cudaSuccess) return err;
  int sms = 0, occ = 0, occ_pf = 0;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return err;
  if ((err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, P::THREADS, smem0)) != cudaSuccess)
    return err;
  if (try_pf &&
      (err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_pf, kern, P::THREADS, smem_pf)) != cudaSuccess)
    return err;
  // prefetch only where it costs no occupancy
  shape.prefetch = (try_pf && occ_pf >= 1 && occ_pf >= occ) ? 1 : 0;
  shape.smem = shape.prefetch ? smem_pf : smem0;
  shape.ctas_per_sm = shape.prefetch ? occ_pf : occ;
  shape.sms = sms;
  if (shape.ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  if (dev < kMaxDevices) cached[dev] = shape;
  return cudaSuccess;
}

template <int LOGM, typename IO>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream) {
  using P = Plan<LOGM>;
  KArgs a;
  a.u = p.u;
  a.ubs = p.u_batch_stride;
  a.ucs = p.u_channel_stride;
  a.K = reinterpret_cast<const float2*>(p.filter_spectrum);
  a.skip = p.skip;
  // The skip is always folded into the spectrum. The direct form stays compiled, though never
  // used, because the register allocation depends on it: without it fp32 io at N <= 2048
  // spills more and runs slower (2-byte io and larger N run faster).
  a.skip_fold = 1;
  a.y = p.y;
  a.B = p.batch;
  a.C = p.channels;
  a.L = p.seq_len;
  set_geometry<LOGM>(a, p.fft_size, p.n1, p.n2);
  const int64_t nseq = p.batch * p.channels;
  if (nseq == 0) return cudaSuccess;
  ForwardShape shape;
  const cudaError_t err = forward_shape<LOGM, IO>(p.n1, p.n2, shape);
  if (err != cudaSuccess) return err;
  a.prefetch = shape.prefetch;
  const int occ = shape.ctas_per_sm, sms = shape.sms;
  const size_t smem = shape.smem;
  auto kern = fftconv_fp32_kernel<LOGM, IO>;
  const int64_t blocks_needed = (nseq + P::SPB - 1) / P::SPB;
  int64_t grid = (int64_t)occ * sms;
  if (grid > blocks_needed) grid = blocks_needed;
  kern<<<(unsigned)grid, dim3(P::T, P::SPB), smem, stream>>>(a);
  return cudaGetLastError();
}

template <typename IO>
cudaError_t dispatch_size(const ConvForwardParams& p, cudaStream_t stream) {
  return with_plan(p.fft_size, cudaErrorInvalidValue, [&](auto logm) { return launch<decltype(logm)::value, IO>(p, stream); });
}

}  // namespace fp32_detail
}  // namespace

// The binding has checked the call against the coverage (MONARCH_FFTCONV_SPLITS); this
// only guards the launch itself.
cudaError_t conv_forward_fp32(const ConvForwardParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  const bool valid = p.precision == Precision::kFP32 && covers_radix_split(p.n1, p.n2) && p.u && p.y &&
                     p.filter_spectrum && reinterpret_cast<uintptr_t>(p.filter_spectrum) % 8 == 0 &&
                     smem_bytes_for(p.fft_size, p.n1, p.n2) <= kMaxSmem;
  if (!valid) return cudaErrorInvalidValue;
  switch (p.io_type) {
    case IOType::kFloat32: return dispatch_size<float>(p, stream);
    case IOType::kBFloat16: return dispatch_size<__nv_bfloat16>(p, stream);
    case IOType::kFloat16: return dispatch_size<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace monarch_fftconv
