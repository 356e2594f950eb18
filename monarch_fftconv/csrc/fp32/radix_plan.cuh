// monarch_fftconv, the fp32 radix library (fp32/radix.cuh): the plan of passes per FFT size
// (Plan<LOGM>: radices, threads, sequences per CTA, twiddle-table offsets), the twiddle
// tables, the kernels' arguments (KArgs), and the host side: shared-memory sizes and the
// one switch from a runtime FFT size to a plan (with_plan).
#pragma once

#include "common/limits.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace monarch_fftconv {
namespace {  // internal linkage: each kernel translation unit has its own copy
namespace fp32_detail {

// ------------------------------------------------------------------------------------
// plan
// ------------------------------------------------------------------------------------
// CTAs per SM the register allocation is sized for: 2 CTAs of 256 threads -> at most 128
// registers per thread
constexpr int kMinCtasPerSm = 2;

template <int LOGM>
struct Plan {
  static_assert(LOGM >= 7 && LOGM <= 14, "fft_size must be in [256, 32768]");
  static constexpr int M = 1 << LOGM;  // complex FFT size = N/2
  static constexpr int E = 32;         // complex values per thread
  static constexpr int T = M / E;      // threads per sequence
  static constexpr int LR1 = (LOGM == 7) ? 3 : (LOGM == 8) ? 4 : (LOGM == 9) ? 5 : (LOGM == 10) ? 3
                             : (LOGM == 11) ? 4 : (LOGM == 12) ? 4 : 5;
  static constexpr int LR2 = LOGM - 4 - LR1;  // 0: no second pass
  static constexpr int R1 = 1 << LR1;
  static constexpr int R2 = 1 << LR2;
  static constexpr int SPB = T >= 256 ? 1 : 256 / T;  // sequences per CTA
  static constexpr int THREADS = T * SPB;
  // N = 32768 runs one CTA of 512 threads per SM: the same 128 registers per thread
  static constexpr int MIN_CTAS = THREADS > 256 ? 1 : kMinCtasPerSm;
  // twiddle tables (float2), all W_S^m = exp(-2πi m/S)
  static constexpr int N_FP2 = LR2 ? R1 : 0;                  // span R1·R2, forward p2
  static constexpr int N_TM = M / (R1 < 16 ? R1 : 16);        // span M: forward mid, inverse last
  static constexpr int N_POST = M / 16;                       // span 2M: ω_N^j
  static constexpr int N_IP2 = LR2 ? 16 : 0;                  // span 16·R2, inverse p2
  static constexpr int OFF_FP2 = 0;
  static constexpr int OFF_TM = OFF_FP2 + N_FP2;
  static constexpr int OFF_POST = OFF_TM + N_TM;
  static constexpr int OFF_IP2 = OFF_POST + N_POST;
  static constexpr int N_TW = OFF_IP2 + N_IP2;
  static_assert(LR2 >= 0 && LR1 <= 5 && LR2 <= 5, "bad plan");
};

// The twiddle tables of Plan<LOGM> (float2 W_span^m, from double-precision sincospi), built
// by the CTA's `threads` threads; the caller synchronizes before reading them.
template <int LOGM>
__device__ __forceinline__ void build_twiddles(float2* tw, int tid, int threads) {
  using P = Plan<LOGM>;
  for (int i = tid; i < P::N_TW; i += threads) {
    int m, span;
    if (i < P::OFF_TM) { m = i - P::OFF_FP2; span = P::R1 * P::R2; }
    else if (i < P::OFF_POST) { m = i - P::OFF_TM; span = P::M; }
    else if (i < P::OFF_IP2) { m = i - P::OFF_POST; span = 2 * P::M; }
    else { m = i - P::OFF_IP2; span = 16 * P::R2; }
    double s, c;
    sincospi(2.0 * (double)m / (double)span, &s, &c);
    tw[i] = make_float2((float)c, (float)(-s));
  }
}

// The next sequence's u is prefetched into shared memory (cp.async) while the current one is
// transformed for 2-byte io only: for fp32 io it was slower (docs/performance.md). The host
// also leaves it off where the buffer would cost occupancy (KArgs::prefetch).
template <typename IO>
constexpr bool kPrefetchU = sizeof(IO) == 2;

struct KArgs {
  const void* u;
  int64_t ubs, ucs;
  const float2* K;  // (C, n1/2+1, n2), or a grouped bank's fewer rows (filter_row)
  const float* skip;
  void* y;
  int64_t B, C, L;
  int S;         // floats per component per sequence area
  int prefetch;  // u of the next sequence is staged in shared memory (cp.async)
  int skip_fold; // always 1, see launch(): skip folded into the filter spectrum; 0: y += D·u at the store
  int N, n1, n2, ln1, ln2;
  const void* pregate;   // (B, C, L) contiguous, IO, or nullptr: x = pregate ⊙ u at the load
  const void* postgate;  // (B, C, L) contiguous, IO, or nullptr: y = postgate ⊙ (conv + D·x) at the store
};

// ------------------------------------------------------------------------------------
// host side
// ------------------------------------------------------------------------------------
inline int ilog2_host(int64_t v) {
  int r = 0;
  while ((int64_t(1) << r) < v) ++r;
  return r;
}

constexpr size_t kMaxSmem = max_smem_per_cta(1);  // one CTA per SM (common/limits.cuh)

template <int LOGM>
inline int area_floats(int n1, int n2) {
  constexpr int M = 1 << LOGM;
  int64_t s = M + M / 32 + 1;
  const int64_t st = (int64_t)(n1 / 2 + 1) * (n2 + 1);
  if (st > s) s = st;
  return (int)((s + 1) & ~int64_t(1));
}

template <int LOGM>
inline size_t smem_bytes(int n1, int n2) {
  using P = Plan<LOGM>;
  return (size_t)P::SPB * 2 * area_floats<LOGM>(n1, n2) * sizeof(float) + (size_t)P::N_TW * sizeof(float2);
}

// f(std::integral_constant<int, LOGM>{}) for the plan of fft_size = 2^(LOGM+1), N = 256 ..
// 32768; `otherwise` for any other size. The one switch from a runtime size to a plan.
template <class R, class F>
inline R with_plan(int fft_size, R otherwise, F&& f) {
  switch (ilog2_host(fft_size)) {
    case 8: return f(std::integral_constant<int, 7>{});
    case 9: return f(std::integral_constant<int, 8>{});
    case 10: return f(std::integral_constant<int, 9>{});
    case 11: return f(std::integral_constant<int, 10>{});
    case 12: return f(std::integral_constant<int, 11>{});
    case 13: return f(std::integral_constant<int, 12>{});
    case 14: return f(std::integral_constant<int, 13>{});
    case 15: return f(std::integral_constant<int, 14>{});
    default: return otherwise;
  }
}

// The kernel units hold an io type's grad instances in two parts by size, so that no unit takes
// much longer to compile than the others (the JIT build compiles them in parallel; its wall time
// is its longest unit's): part 0 the plans of N <= 4096, part 1 those above.
constexpr int kLargeSizesFromLogm = 12;  // N = 8192
constexpr int size_part(int logm) { return logm < kLargeSizesFromLogm ? 0 : 1; }
inline int size_part_of(int fft_size) { return size_part(ilog2_host(fft_size) - 1); }

// with_plan for the plans of one part: `otherwise` for a size of the other part.
template <int PART, class R, class F>
inline R with_plan_in_part(int fft_size, R otherwise, F&& f) {
  return with_plan(fft_size, otherwise, [&](auto logm) -> R {
    if constexpr (size_part(decltype(logm)::value) == PART) return f(logm);
    else return otherwise;
  });
}

inline size_t smem_bytes_for(int fft_size, int n1, int n2) {
  return with_plan(fft_size, ~size_t(0), [&](auto logm) { return smem_bytes<decltype(logm)::value>(n1, n2); });
}

// The geometry fields of KArgs for Plan<LOGM> and the split (n1, n2) of fft_size.
template <int LOGM>
inline void set_geometry(KArgs& a, int fft_size, int n1, int n2) {
  a.N = fft_size;
  a.n1 = n1;
  a.n2 = n2;
  a.ln1 = ilog2_host(n1);
  a.ln2 = ilog2_host(n2);
  a.S = area_floats<LOGM>(n1, n2);
}

// The KArgs fields a conv call gives both radix conv kernels (ConvForwardParams and
// ConvBackwardParams name them alike): u and its strides, the spectrum, the skip term, the shape
// and the plan's geometry. The rest is zero until the caller sets it.
template <int LOGM, class ConvParams>
inline KArgs conv_kargs(const ConvParams& p) {
  KArgs a{};
  a.u = p.u;
  a.ubs = p.u_batch_stride;
  a.ucs = p.u_channel_stride;
  a.K = reinterpret_cast<const float2*>(p.filter_spectrum);
  a.skip = p.skip;
  a.B = p.batch;
  a.C = p.channels;
  a.L = p.seq_len;
  set_geometry<LOGM>(a, p.fft_size, p.n1, p.n2);
  return a;
}

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
