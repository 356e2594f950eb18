// monarch_fftconv: the filter spectrum in the Monarch layout, in one launch.
//
// Each channel's filter k (zero-padded to N) goes through the fp32 radix kernels' forward
// passes and real-FFT split (fp32/radix.cuh): every thread ends with the spectrum values
// X[h], X[M-h] of its mid-pass frequency pairs, h in [0, M], M = N/2. The layout stores
// S[k1][k2] = X[g]/N for g = k1 + n1·k2 with k1 <= n1/2 (g in [0, N)); an entry with g > M
// holds conj(X[N - g]). So each X[h] is written as itself at g = h and as its conjugate at
// g = N - h, where those entries exist. Each entry has one writer (g = M: two identical
// writes by one thread), so the result is deterministic. The entries are gathered in shared
// memory and stored to global memory in order.

#include "fp32/radix.cuh"

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

// X[h]·scale into the entries of the slot's stage that hold it (see above), in the stage
// layout the forward kernel copies the spectrum into (stage_index: rows padded to n2 + 1).
__device__ __forceinline__ void stage_frequency(float2* stage, int h, cf x, float scale, const KArgs& a) {
  const auto put = [&](int g, float im) {  // the entry e = k1·n2 + k2 of g = k1 + n1·k2, if it exists
    const int k1 = g & (a.n1 - 1);
    if (k1 <= (a.n1 >> 1)) stage[stage_index(a, k1 * a.n2 + (g >> a.ln1))] = make_float2(x.x * scale, im * scale);
  };
  put(h, x.y);
  if (h > 0) put(a.N - h, -x.y);  // g = N - h < N
}

// A refresh's test, for the CTA's rows together: whether any filter row differs, bit for bit
// (NaN payloads and -0.0 included), from the source row its cached spectrum was computed from.
// If one does, every source row takes its filter's values, and the CTA recomputes all its rows
// (an unchanged row's recomputation writes the bits it already holds: the kernel is
// deterministic). Reading k and source costs 6-8 bytes a tap; the FFT it may skip, far more.
// A bf16/fp16 k is compared widened (exact: the fp32 source holds the same widened values).
template <typename KT>
__device__ __forceinline__ bool filter_rows_changed(const KT* k, float* source, int64_t len, bool valid, int tx,
                                                    int threads) {
  int differs = 0;
  if (valid)
    for (int64_t e = tx; e < len; e += threads)
      differs |= __float_as_uint(io_to_float(k[e])) != __float_as_uint(source[e]);
  if (!__syncthreads_or(differs)) return false;
  if (valid)
    for (int64_t e = tx; e < len; e += threads) source[e] = io_to_float(k[e]);
  return true;
}

// Tap t of a two-sided filter's N-point circle (FilterSpectrumParams): causal tap t at lag t,
// anti-causal tap s at lag N - s (tap 0 of both halves at lag 0). len <= N/2 keeps the halves
// apart: the anti-causal taps land in the upper half, where the causal filter is zero padding.
__device__ __forceinline__ float two_sided_tap(const float* causal, const float* anti_causal, int t, int len, int N) {
  float x = t < len ? __ldg(causal + t) : 0.f;
  const int s = t == 0 ? 0 : N - t;
  if (s < len) x += __ldg(anti_causal + s);
  return x;
}

// forward_passes for a two-sided filter: p1 loads the whole circle (its upper half is not zero
// here), then p2. Only this kernel runs it, so the conv kernels' p1 keeps its zero-half code.
template <int LOGM>
__device__ __forceinline__ void two_sided_forward_passes(float* re, float* im, int tx, const float2* twFP2,
                                                         const float* causal, const float* anti_causal, int len) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T, R = P::R1, NB = 32 / R;
  cf v[NB][R];
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int t0 = 2 * (j + r * (M / R));  // z[m] = x[2m] + i·x[2m+1], as forward_passes packs it
      v[q][r] = {two_sided_tap(causal, anti_causal, t0, len, 2 * M),
                 two_sided_tap(causal, anti_causal, t0 + 1, len, 2 * M)};
    }
  }
  forward_p1_butterflies_and_p2<LOGM, false>(re, im, tx, twFP2, v);
}

// KT: the filter's element type (float; or, one-sided, bf16/fp16).
template <int LOGM, bool TWO_SIDED, typename KT = float>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS) filter_spectrum_kernel(const KArgs a,
                                                                                               float2* spectrum,
                                                                                               float* source) {
  static_assert(std::is_same_v<KT, float> || !TWO_SIDED, "a two-sided filter is read as fp32");
  using P = Plan<LOGM>;
  constexpr int M = P::M, SPB = P::SPB;
  extern __shared__ float4 smem_raw[];
  const SlotSmem<LOGM> slot(reinterpret_cast<float*>(smem_raw), a.S);
  const int tx = threadIdx.x, ty = threadIdx.y;

  const int64_t c = (int64_t)blockIdx.x * SPB + ty;
  const bool valid = c < a.C;
  const KT* k = static_cast<const KT*>(a.u) + (valid ? c : 0) * a.ucs;
  if constexpr (TWO_SIDED) {  // row c: the causal taps, then the anti-causal ones (ucs = 2L)
    two_sided_forward_passes<LOGM>(slot.re, slot.im, tx, slot.fp2(), k, k + a.L, valid ? (int)a.L : 0);
  } else {
    if (source && !filter_rows_changed(k, source + (valid ? c : 0) * a.ucs, a.L, valid, tx, P::T)) return;
    forward_passes<LOGM, KT>(slot.re, slot.im, tx, slot.fp2(), k, valid ? (int)a.L : 0);
  }
  cf A[16], Bv[16], A2[16], B2[16];
  mid_forward<M>(slot.re, slot.im, tx, slot.mid(), A, Bv);
  // The frequencies land scattered over the layout (a thread's neighbours hold the next k1,
  // a row of n2 away): they go to the slot's area first, then to global memory in order, in
  // full sectors. Written straight to global memory, each warp store touched 32 sectors.
  __syncthreads();  // all of Z is in registers: the slot's area becomes the stage
  float2* stage = reinterpret_cast<float2*>(slot.re);
  const float scale = 1.f / (float)a.N;  // a power of two: exact
  for_each_pair<M>(tx, A, Bv, A2, B2, slot.wp0, slot.wp1, [&](int, int f, cf zk, cf zm, cf w, cf&, cf&) {
    cf xk, xm;
    split_pair(zk, zm, w, xk, xm);
    stage_frequency(stage, f, xk, scale, a);
    stage_frequency(stage, M - f, xm, scale, a);
  });
  __syncthreads();
  if (!valid) return;
  const int total = stage_entries(a);
  float2* S = spectrum + c * (int64_t)total;
  for (int e = tx; e < total; e += P::T) S[e] = stage[stage_index(a, e)];
}

// One spectrum kernel's launch: a CTA per SPB channels (residency asked once, for its cache).
template <int LOGM, auto Kernel>
cudaError_t launch_spectrum_kernel(const KArgs& a, const FilterSpectrumParams& p, size_t smem, cudaStream_t stream) {
  using P = Plan<LOGM>;
  int ctas = 0, sms = 0;
  const cudaError_t err = residency<Kernel>(P::THREADS, smem, ctas, sms);
  if (err != cudaSuccess) return err;
  Kernel<<<(unsigned)((p.channels + P::SPB - 1) / P::SPB), dim3(P::T, P::SPB), smem, stream>>>(
      a, reinterpret_cast<float2*>(p.spectrum), p.source);
  return cudaGetLastError();
}

template <int LOGM>
cudaError_t launch_spectrum(const FilterSpectrumParams& p, cudaStream_t stream) {
  KArgs a{};
  a.u = p.filter;
  a.ucs = p.two_sided ? 2 * p.filter_len : p.filter_len;
  a.C = p.channels;
  a.L = p.filter_len;
  set_geometry<LOGM>(a, p.fft_size, p.n1, p.n2);
  const size_t smem = smem_bytes<LOGM>(p.n1, p.n2);
  switch (p.filter_type) {
    case IOType::kBFloat16:
      return launch_spectrum_kernel<LOGM, filter_spectrum_kernel<LOGM, false, __nv_bfloat16>>(a, p, smem, stream);
    case IOType::kFloat16:
      return launch_spectrum_kernel<LOGM, filter_spectrum_kernel<LOGM, false, __half>>(a, p, smem, stream);
    default:
      return p.two_sided ? launch_spectrum_kernel<LOGM, filter_spectrum_kernel<LOGM, true>>(a, p, smem, stream)
                         : launch_spectrum_kernel<LOGM, filter_spectrum_kernel<LOGM, false>>(a, p, smem, stream);
  }
}

}  // namespace fp32_detail
}  // namespace

cudaError_t filter_spectrum_fp32(const FilterSpectrumParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  const bool valid = covers_radix_split(p.n1, p.n2) && p.n1 * p.n2 == p.fft_size && p.filter && p.spectrum &&
                     p.channels > 0 && 1 <= p.filter_len && 2 * p.filter_len <= p.fft_size &&
                     reinterpret_cast<uintptr_t>(p.spectrum) % 8 == 0 && !(p.two_sided && p.source) &&
                     (p.filter_type == IOType::kFloat32 || !p.two_sided);
  if (!valid) return cudaErrorInvalidValue;
  return with_plan(p.fft_size, cudaErrorInvalidValue, [&](auto logm) { return launch_spectrum<decltype(logm)::value>(p, stream); });
}

}  // namespace monarch_fftconv
