// monarch_fftconv: the fused fp32-accurate causal FFT convolution's forward (SIMT, no tensor
// cores): its kernels and launchers (the checks and the entry point: fp32/fftconv_fp32.cu; the
// instances: fp32/forward_{uniform,own_path}_<io>.cu through fp32/forward_instances.cuh, one
// unit per io type and path, which build in parallel).
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
//
// CUDA headers only: never include torch here.

#pragma once

#include "fp32/forward_stages.cuh"  // the kernel's stages, one function each (and the radix library)

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

// The kernel's body, every sequence of the persistent grid. GATED: Hyena's gates fused into p1's
// load and the last pass's store (a.pregate, a.postgate), and z = conv + D·x stored before the
// postgate where a.z is given (the training step's forward). UNIFORM_PAIRS: the mid pass's
// frequency pairs without thread 0's own code path (mid_filter_pairs_uniform).
template <int LOGM, typename IO, bool GATED, bool UNIFORM_PAIRS>
__device__ __forceinline__ void forward_sequences(const ForwardArgs<GATED>& a) {
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
  // (forward_p1 finds it from sm the same way)
  IO* ubuf = reinterpret_cast<IO*>(tw + P::N_TW) + (size_t)ty * M;

  // ---- twiddle tables, once per CTA
  const ForwardTables tables = build_forward_tables<LOGM>(tw, tid);

  const int64_t nseq = a.B * a.C;
  using Choices = ForwardIoChoices<LOGM, IO, GATED, UNIFORM_PAIRS>;
  // pf_cur: this slot's next sequence has its u staged in ubuf
  bool pf_cur = false;
  // once p1 has consumed ubuf: the next sequence's u staged there while this one finishes, at
  // the point ForwardIoChoices picks
  auto prefetch_next = [&](int64_t s, int tx_s) {
    pf_cur = false;
    if (kPrefetchU<IO> && a.prefetch) {
      const int64_t sn = s + (int64_t)gridDim.x * SPB;
      if (sn < nseq) pf_cur = prefetch_seq<LOGM>(a, ubuf, sn, tx_s);
    }
  };
  if (kPrefetchU<IO> && a.prefetch) {
    const int64_t s0 = (int64_t)blockIdx.x * SPB + ty;
    if (s0 < nseq) pf_cur = prefetch_seq<LOGM>(a, ubuf, s0, tx);
  }
  for (int64_t sb = (int64_t)blockIdx.x * SPB; sb < nseq; sb += (int64_t)gridDim.x * SPB) {
    const int64_t s = sb + ty;
    // this sequence's tx: opaque where kLoopTxFence, so that no shared-memory address derived
    // from it is hoisted out of the loop and held across it (radix_passes.cuh says why)
    int tx_seq = tx;
    if constexpr (Choices::kLoopTxFence) fence(tx_seq);
    const ForwardSeq seq = forward_seq<IO>(a, s, nseq);
    // fp32 io only: the gated calls' (backends.FUSED_GATE_IO_DTYPES); session 17's L2 prefetch of
    // the postgate multiplied the 2-byte instances' spills (docs/design.md)
    constexpr bool kGateRowsToL2 = GATED && sizeof(IO) == 4 && MONARCH_FFTCONV_GATED_L2_PREFETCH != 0;
    if constexpr (kGateRowsToL2) {  // before p1, where no values are live
      // this sequence's postgate, read by the last pass; the next one's u and pregate, read by its p1
      if (seq.valid && a.postgate != nullptr) prefetch_gate_row<IO>(a.postgate, a, s, tx_seq, T);
      const int64_t next = s + (int64_t)gridDim.x * SPB;
      if (next < nseq) {
        prefetch_u_row<IO>(a, next, tx_seq, T);
        if (a.pregate != nullptr) prefetch_gate_row<IO>(a.pregate, a, next, tx_seq, T);
      }
    }

    // ================= forward p1: global -> smem, radix R1, NS = 1, upper half zero
    forward_p1<LOGM, IO, GATED>(sm, re, im, tx_seq, a, pf_cur, seq);
    // ================= forward p2
    if constexpr (P::LR2 > 0) pass_smem<M, T, P::R2, P::R1, false>(re, im, tx_seq, tables.fp2);

    // ================= mid: forward radix-16 (NS = M/16), split, ·K, inverse radix-16 (NS = 1)
    {
      // this thread's butterflies: j0 and j1 = M/16 - j0 (thread 0: the self-paired 0 and M/32)
      const int j0 = tx_seq, j1 = tx_seq == 0 ? M / 32 : M / 16 - tx_seq;
      cf A[16], Bv[16];
      mid_forward<M>(re, im, tx_seq, tables.mid, A, Bv);
      __syncthreads();  // all of Z is in registers: smem becomes the filter stage
      if constexpr (UNIFORM_PAIRS) stage_forward_filter_uniform<LOGM>(stage, tx_seq, a, seq, forward_row_shift<GATED>(a));
      else stage_forward_filter<LOGM>(stage, tx_seq, a, seq, forward_row_shift<GATED>(a));
      if constexpr (Choices::kPrefetchPoint == PrefetchPoint::kAfterFilterStage) prefetch_next(s, tx_seq);

      cf A2[16], B2[16];
      if constexpr (UNIFORM_PAIRS) mid_filter_pairs_uniform<M>(stage, a, tx_seq, tables.post, A, Bv, A2, B2);
      else mid_filter_pairs<M>(stage, a, j0, j1, tables.post, A, Bv, A2, B2);
      mid_inverse(re, im, j0, j1, A2, B2);
    }
    if constexpr (Choices::kPrefetchPoint == PrefetchPoint::kAfterMidInverse) prefetch_next(s, tx_seq);
    // the inverse passes' tx: opaque where kInverseTxFence, so that their shared-memory addresses
    // are computed again, not forward p2's held through the mid pass (radix_passes.cuh says why)
    int tx_inverse = tx_seq;
    if constexpr (Choices::kInverseTxFence) fence(tx_inverse);
    // ================= inverse p2
    if constexpr (P::LR2 > 0) pass_smem<M, T, P::R2, 16, true>(re, im, tx_inverse, tables.ip2);
    if constexpr (Choices::kPrefetchPoint == PrefetchPoint::kBeforeLastStore) prefetch_next(s, tx_seq);

    // ================= inverse last: smem -> global, radix R1, NS = M/R1, causal half stored
    last_inverse_store<LOGM, IO, GATED, UNIFORM_PAIRS>(re, im, tx_inverse, tables.mid, a, seq);
  }
}

// The ungated kernel (GATED false: the gated one is fftconv_fp32_gated_kernel, a kernel of its
// own taking GatedKArgs, so that this one keeps its name, registers and code).
template <int LOGM, typename IO, bool GATED>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS) fftconv_fp32_kernel(const PlainKArgs a) {
  static_assert(!GATED, "the gated forward is fftconv_fp32_gated_kernel");
  forward_sequences<LOGM, IO, false, false>(a);
}

template <int LOGM, typename IO>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS)
    fftconv_fp32_gated_kernel(const GatedKArgs a) {
  forward_sequences<LOGM, IO, true, false>(a);
}

// The uniform pair sweep's kernels (the default; MONARCH_FFTCONV_FWD_UNIFORM_PAIRS=0 runs thread
// 0's own path), gated and ungated (the gated one is the training step's forward), built where a
// covered split has n1 | M/16 (uniform_pairs_built).
template <int LOGM, typename IO>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS)
    fftconv_fp32_uniform_pairs_kernel(const PlainKArgs a) {
  forward_sequences<LOGM, IO, false, true>(a);
}

template <int LOGM, typename IO>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS)
    fftconv_fp32_gated_uniform_pairs_kernel(const GatedKArgs a) {
  forward_sequences<LOGM, IO, true, true>(a);
}

// The forward kernel of an instance.
template <int LOGM, typename IO, bool GATED, bool UNIFORM_PAIRS>
constexpr auto forward_kernel() {
  if constexpr (GATED && UNIFORM_PAIRS) return fftconv_fp32_gated_uniform_pairs_kernel<LOGM, IO>;
  else if constexpr (GATED) return fftconv_fp32_gated_kernel<LOGM, IO>;
  else if constexpr (UNIFORM_PAIRS) return fftconv_fp32_uniform_pairs_kernel<LOGM, IO>;
  else return fftconv_fp32_kernel<LOGM, IO, false>;
}

struct ForwardShape {
  int ctas_per_sm = 0, sms = 0, prefetch = 0;
  size_t smem = 0;
};

// Resident CTAs, SM count, the u prefetch decision and the smem size for one kernel instance
// on the current device. The occupancy queries cost host time: asked once per device.
template <int LOGM, typename IO, bool GATED, bool UNIFORM_PAIRS>
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
  auto kern = forward_kernel<LOGM, IO, GATED, UNIFORM_PAIRS>();
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

template <int LOGM, typename IO, bool GATED, bool UNIFORM_PAIRS>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream) {
  using P = Plan<LOGM>;
  ForwardArgs<GATED> a{};
  static_cast<KArgs&>(a) = conv_kargs<LOGM>(p);
  if constexpr (GATED) a.z = p.pre_postgate_out;
  else a.row_shift = p.filter_row_shift;
  if (!takes_row_shift(p.filter_row_shift, GATED)) return cudaErrorInvalidValue;
  if (!kGatedStoresZ<IO> && p.pre_postgate_out != nullptr) return cudaErrorInvalidValue;  // no z store built
  // The skip is always folded into the spectrum. The direct form stays compiled, though never
  // used, because the register allocation depends on it: without it fp32 io at N <= 2048
  // spills more and runs slower (2-byte io and larger N run faster).
  a.skip_fold = 1;
  a.y = p.y;
  a.pregate = p.pregate;
  a.postgate = p.postgate;
  const int64_t nseq = p.batch * p.channels;
  if (nseq == 0) return cudaSuccess;
  ForwardShape shape;
  const cudaError_t err = forward_shape<LOGM, IO, GATED, UNIFORM_PAIRS>(p.n1, p.n2, shape);
  if (err != cudaSuccess) return err;
  a.prefetch = shape.prefetch;
  const int occ = shape.ctas_per_sm, sms = shape.sms;
  const size_t smem = shape.smem;
  auto kern = forward_kernel<LOGM, IO, GATED, UNIFORM_PAIRS>();
  const int64_t blocks_needed = (nseq + P::SPB - 1) / P::SPB;
  int64_t grid = (int64_t)occ * sms;
  if (grid > blocks_needed) grid = blocks_needed;
  kern<<<(unsigned)grid, dim3(P::T, P::SPB), smem, stream>>>(a);
  return cudaGetLastError();
}

// Whether the uniform pair sweep is built for M: where a covered split of N = 2M has n1 | M/16,
// as its filter walks need (N >= 1024 with the planner's splits); elsewhere it would never run.
constexpr bool uniform_pairs_built(int M) {
#define MONARCH_FFTCONV_WALKABLE(N1_, N2_) \
  if (N1_ * N2_ == 2 * M && N1_ <= M / 16) return true;
  MONARCH_FFTCONV_SPLITS(MONARCH_FFTCONV_WALKABLE)
  MONARCH_FFTCONV_RADIX_ONLY_SPLITS(MONARCH_FFTCONV_WALKABLE)
#undef MONARCH_FFTCONV_WALKABLE
  return false;
}

// Whether a call of plan LOGM runs the uniform sweep's kernels: asked for (p.uniform_pairs), built
// for its size, and its filter walks hold (n1 | M/16). The dispatcher and the launcher both ask.
template <int LOGM>
bool takes_uniform_pairs(const ConvForwardParams& p) {
  if constexpr (uniform_pairs_built(Plan<LOGM>::M)) return p.uniform_pairs && p.n1 <= Plan<LOGM>::M / 16;
  return false;
}

template <int LOGM, typename IO, bool UNIFORM_PAIRS>
cudaError_t launch_gating(const ConvForwardParams& p, cudaStream_t stream) {
  const bool gated = p.pregate != nullptr || p.postgate != nullptr || p.pre_postgate_out != nullptr;
  return gated ? launch<LOGM, IO, true, UNIFORM_PAIRS>(p, stream) : launch<LOGM, IO, false, UNIFORM_PAIRS>(p, stream);
}

}  // namespace fp32_detail
}  // namespace

namespace fp32_forward {
// One io type's uniform pair sweep kernels (the default route where built), gated and
// ungated, every size where they are built (fp32_detail::uniform_pairs_built) and the call's
// split has n1 | M/16; cudaErrorInvalidValue elsewhere.
template <typename IO>
cudaError_t launch_uniform_pairs(const ConvForwardParams& p, cudaStream_t stream);
// One io type's kernels on thread 0's own path, gated and ungated, every size.
// Both defined in fp32/forward_instances.cuh and instantiated by the fp32/forward_{uniform,
// own_path}_<io>.cu units, which build in parallel; called by fp32/fftconv_fp32.cu
// (dispatch_size) once it has checked the call.
template <typename IO>
cudaError_t launch_own_path(const ConvForwardParams& p, cudaStream_t stream);
}  // namespace fp32_forward
}  // namespace monarch_fftconv
