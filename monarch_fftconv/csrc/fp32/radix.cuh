// monarch_fftconv: the building blocks of the fp32-accurate radix kernels, shared by the
// forward (fp32/fftconv_fp32.cu) and the backward (fp32/fftconv_fp32_backward.cu): complex helpers,
// in-register radix-R DFTs, twiddle tables, Stockham passes in shared memory, the real-FFT
// split and its inverse, io conversions and the plan of passes per FFT size. The algorithm
// is described at the top of fp32/fftconv_fp32.cu.
#pragma once


#include "fftconv.h"
#include "common/residency.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>


namespace monarch_fftconv {
namespace {  // internal linkage: each kernel translation unit has its own copy
namespace fp32_detail {


// compile-time loop: f(std::integral_constant<int, I>) for I in [0, N)
template <class F, int... Is>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, Is...>) {
  (f(std::integral_constant<int, Is>{}), ...);
}
template <int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

// ------------------------------------------------------------------------------------
// complex helpers
// ------------------------------------------------------------------------------------
struct cf {
  float x, y;
};

__device__ __forceinline__ cf cadd(cf a, cf b) { return {a.x + b.x, a.y + b.y}; }
__device__ __forceinline__ cf csub(cf a, cf b) { return {a.x - b.x, a.y - b.y}; }
__device__ __forceinline__ cf cmul(cf a, cf b) {
  return {fmaf(a.x, b.x, -a.y * b.y), fmaf(a.x, b.y, a.y * b.x)};
}
__device__ __forceinline__ cf cconj(cf a) { return {a.x, -a.y}; }

// Scheduling fence: values pass through an empty volatile asm. Volatile asm statements keep
// their order, so work that consumes fenced values cannot be hoisted above earlier fences.
// Used to stop the compiler from interleaving independent register-heavy phases (which
// would exceed the 128-register budget of 2 CTAs x 256 threads per SM).
__device__ __forceinline__ void fence(cf& v) { asm volatile("" : "+f"(v.x), "+f"(v.y)); }
__device__ __forceinline__ void fence(int& v) { asm volatile("" : "+r"(v)); }
template <int R>
__device__ __forceinline__ void fence(cf (&v)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) fence(v[r]);
}

// ------------------------------------------------------------------------------------
// compile-time W_32^m = exp(-2πi m/32), correctly rounded to float (Taylor series in double)
// ------------------------------------------------------------------------------------
constexpr double kPi = 3.14159265358979323846264338327950288;

constexpr double taylor_sin(double x) {
  double term = x, sum = x;
  for (int n = 1; n < 40; ++n) {
    term *= -x * x / ((2.0 * n) * (2.0 * n + 1.0));
    sum += term;
  }
  return sum;
}
constexpr double taylor_cos(double x) {
  double term = 1.0, sum = 1.0;
  for (int n = 1; n < 40; ++n) {
    term *= -x * x / ((2.0 * n - 1.0) * (2.0 * n));
    sum += term;
  }
  return sum;
}

struct Tw32Table {
  float c[32];
  float s[32];  // imaginary part of W_32^m, i.e. -sin(2πm/32)
};
constexpr Tw32Table make_tw32() {
  Tw32Table t{};
  for (int m = 0; m < 32; ++m) {
    // no argument reduction needed: on [0, 2π) the series is within ~1e-14 of the exact value
    const double a = 2.0 * kPi * m / 32.0;
    t.c[m] = static_cast<float>(taylor_cos(a));
    t.s[m] = static_cast<float>(-taylor_sin(a));
  }
  return t;
}
__constant__ Tw32Table c_tw32 = make_tw32();

// d · W_n^k (forward) or d · conj(W_n^k) (inverse), n a power of two <= 32; k and n are
// compile-time constants after unrolling, so the trivial cases fold away.
template <bool INV>
__device__ __forceinline__ cf tw_const(cf d, int k, int n) {
  const int m = (k * (32 / n)) & 31;
  if (m == 0) return d;
  if (m == 16) return {-d.x, -d.y};
  if (m == 8) return INV ? cf{-d.y, d.x} : cf{d.y, -d.x};   // ·(+i) : ·(-i)
  if (m == 24) return INV ? cf{d.y, -d.x} : cf{-d.y, d.x};  // ·(-i) : ·(+i)
  const float wr = c_tw32.c[m];
  const float wi = INV ? -c_tw32.s[m] : c_tw32.s[m];
  if ((m & 3) == 0) {
    // |wr| = |wi| = sqrt(1/2)
    const float h = 0.70710678118654752440f;
    const float sr = wr > 0.f ? 1.f : -1.f, si = wi > 0.f ? 1.f : -1.f;
    // (x + iy)(sr + i si)·h
    return {h * (sr * d.x - si * d.y), h * (si * d.x + sr * d.y)};
  }
  return cmul(d, cf{wr, wi});
}

// ------------------------------------------------------------------------------------
// in-register radix-R DFT (R <= 32): the inputs in bit-reversed order (free: it only renames
// registers), then radix-2 decimation-in-time stages, outputs in natural order.
// HZ: inputs v[R/2..R) are known zeros.
// ------------------------------------------------------------------------------------
__host__ __device__ constexpr int bitrev(int i, int bits) {
  int r = 0;
  for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
  return r;
}
__host__ __device__ constexpr int ilog2(int n) { return n <= 1 ? 0 : 1 + ilog2(n / 2); }

// radix-2 decimation-in-time butterfly (a, b) -> (a + W b, a - W b), W = W_n^k (conj if INV),
// with the twiddle folded into FMAs: a - W b = 2a - (a + W b) saves two instructions.
template <bool INV>
__device__ __forceinline__ void dit_bfly(cf& a, cf& b, int k, int n) {
  const int m = (k * (32 / n)) & 31;
  if (m == 0) {
    const cf x = cadd(a, b), y = csub(a, b);
    a = x;
    b = y;
    return;
  }
  if (m == 8 || m == 24) {
    // W b = ∓i b
    const bool minus_i = (m == 8) != INV;
    const cf wb = minus_i ? cf{b.y, -b.x} : cf{-b.y, b.x};
    const cf x = cadd(a, wb), y = csub(a, wb);
    a = x;
    b = y;
    return;
  }
  const float wr = c_tw32.c[m];
  const float wi = INV ? -c_tw32.s[m] : c_tw32.s[m];
  if ((m & 3) == 0) {
    // |wr| = |wi| = sqrt(1/2): W b = h·(sr·bx - si·by, si·bx + sr·by)
    const float h = 0.70710678118654752440f;
    const float sr = wr > 0.f ? 1.f : -1.f, si = wi > 0.f ? 1.f : -1.f;
    const float t1 = sr * b.x - si * b.y;  // sign products fold to an FADD
    const float t2 = si * b.x + sr * b.y;
    const cf x = {fmaf(h, t1, a.x), fmaf(h, t2, a.y)};
    const cf y = {fmaf(-h, t1, a.x), fmaf(-h, t2, a.y)};
    a = x;
    b = y;
    return;
  }
  const cf x = {fmaf(wr, b.x, fmaf(-wi, b.y, a.x)), fmaf(wr, b.y, fmaf(wi, b.x, a.y))};
  const cf y = {fmaf(2.f, a.x, -x.x), fmaf(2.f, a.y, -x.y)};
  a = x;
  b = y;
}

template <int R, int H, bool INV, bool HZ>
__device__ __forceinline__ void dit_stages(cf (&t)[R]) {
  if constexpr (H < R) {
#pragma unroll
    for (int base = 0; base < R; base += 2 * H) {
#pragma unroll
      for (int k = 0; k < H; ++k) {
        if constexpr (HZ) {
          t[base + k + H] = t[base + k];  // b = 0 (only in the first stage, H = 1, k = 0)
        } else {
          dit_bfly<INV>(t[base + k], t[base + k + H], k, 2 * H);
        }
      }
    }
    dit_stages<R, H * 2, INV, false>(t);
  }
}

template <int R, bool INV, bool HZ = false>
__device__ __forceinline__ void fft_reg(cf (&v)[R]) {
  constexpr int LR = ilog2(R);
  // HZ: inputs R/2..R-1 are zero, i.e. the odd slots after the bit reversal.
  cf t[R];
  static_for<R>([&](auto I) { t[I.value] = v[bitrev(I.value, LR)]; });
  dit_stages<R, 1, INV, HZ>(t);
  static_for<R>([&](auto I) { v[I.value] = t[I.value]; });
}

// the largest power of two <= r (r >= 1)
__host__ __device__ constexpr int hipow2(int r) { return r < 2 ? r : 2 * hipow2(r / 2); }

// p[r] = w^r for r < R, each power the product of two earlier ones (product depth ~log2 r).
template <int R>
__device__ __forceinline__ void fill_powers(cf (&p)[R], cf w) {
  p[0] = {1.f, 0.f};
  if constexpr (R > 1) p[1] = w;
  static_for<R>([&](auto I) {
    constexpr int r = I.value;
    if constexpr (r >= 2) {
      constexpr int hi = hipow2(r);
      if constexpr (hi == r) p[r] = cmul(p[r / 2], p[r / 2]);
      else p[r] = cmul(p[hi], p[r - hi]);
    }
  });
}

// v[r] *= w^r, r in [1, R), the powers from short product trees (depth ~log2 r).
template <int R>
__device__ __forceinline__ void apply_pow(cf (&v)[R], cf w) {
  if constexpr (R <= 8) {
    cf p[R];
    fill_powers<R>(p, w);
    static_for<R>([&](auto I) {
      if constexpr (I.value >= 1) v[I.value] = cmul(v[I.value], p[I.value]);
    });
  } else {
    // w^(4a+b) = (w^4)^a · w^b: few live powers (registers), product depth ~log2(r)+1
    constexpr int QA = R / 4;
    const cf p1 = w, p2 = cmul(w, w), p3 = cmul(p2, w);
    cf q[QA];
    fill_powers<QA>(q, cmul(p2, p2));
    static_for<R>([&](auto I) {
      constexpr int r = I.value, a = r / 4, b = r % 4;
      if constexpr (r >= 1) {
        const cf pb = b == 1 ? p1 : b == 2 ? p2 : p3;
        if constexpr (a == 0) v[r] = cmul(v[r], pb);
        else if constexpr (b == 0) v[r] = cmul(v[r], q[a]);
        else v[r] = cmul(v[r], cmul(q[a], pb));
      }
    });
  }
}

// ------------------------------------------------------------------------------------
// shared-memory helpers (structure of arrays, padded index)
// ------------------------------------------------------------------------------------
__device__ __forceinline__ int pidx(int i) { return i + (i >> 5); }
__device__ __forceinline__ void sts(float* re, float* im, int i, cf v) {
  const int p = pidx(i);
  re[p] = v.x;
  im[p] = v.y;
}

// element j + r·STRIDE, STRIDE a multiple of 32: pidx(j + r·STRIDE) = pidx(j) + r·(STRIDE + STRIDE/32)
// (for a small STRIDE, the generic index of j + r·STRIDE)
template <int STRIDE>
__device__ __forceinline__ cf lds_s(const float* re, const float* im, int j, int pj, int r) {
  const int p = (STRIDE % 32 == 0) ? pj + r * (STRIDE + STRIDE / 32) : pidx(j + r * STRIDE);
  return {re[p], im[p]};
}
template <int STRIDE>
__device__ __forceinline__ void sts_s(float* re, float* im, int pj, int r, cf v) {
  static_assert(STRIDE % 32 == 0, "");
  const int p = pj + r * (STRIDE + STRIDE / 32);
  re[p] = v.x;
  im[p] = v.y;
}

// io conversions. Sequences are read and written once per kernel: the accesses are
// streaming (evict-first, .cs), so that data a kernel reuses (the backward's scratch) keeps
// its place in L2.
template <typename IO> __device__ __forceinline__ float io_load(const IO* p);
template <> __device__ __forceinline__ float io_load<float>(const float* p) { return __ldcs(p); }
template <> __device__ __forceinline__ float io_load<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(__ushort_as_bfloat16(__ldcs(reinterpret_cast<const unsigned short*>(p))));
}
template <> __device__ __forceinline__ float io_load<__half>(const __half* p) {
  return __half2float(__ushort_as_half(__ldcs(reinterpret_cast<const unsigned short*>(p))));
}
template <typename IO> __device__ __forceinline__ void io_store(IO* p, float v);
template <> __device__ __forceinline__ void io_store<float>(float* p, float v) { __stcs(p, v); }
template <> __device__ __forceinline__ void io_store<__nv_bfloat16>(__nv_bfloat16* p, float v) {
  __stcs(reinterpret_cast<unsigned short*>(p), __bfloat16_as_ushort(__float2bfloat16_rn(v)));
}
template <> __device__ __forceinline__ void io_store<__half>(__half* p, float v) {
  __stcs(reinterpret_cast<unsigned short*>(p), __half_as_ushort(__float2half_rn(v)));
}

__device__ __forceinline__ float io_to_float(float v) { return v; }
__device__ __forceinline__ float io_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float io_to_float(__half v) { return __half2float(v); }

// two consecutive elements p[0], p[1] (p aligned to two elements); 16-bit pairs travel as
// one 32-bit word
template <typename H2> __device__ __forceinline__ H2 bits_as(unsigned w) {
  H2 h;
  memcpy(&h, &w, sizeof(h));
  return h;
}
template <typename H2> __device__ __forceinline__ unsigned as_bits(H2 h) {
  unsigned w;
  memcpy(&w, &h, sizeof(w));
  return w;
}
template <typename IO> __device__ __forceinline__ float2 io_load2(const IO* p);
template <> __device__ __forceinline__ float2 io_load2<float>(const float* p) {
  return __ldcs(reinterpret_cast<const float2*>(p));
}
template <> __device__ __forceinline__ float2 io_load2<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat1622float2(bits_as<__nv_bfloat162>(__ldcs(reinterpret_cast<const unsigned*>(p))));
}
template <> __device__ __forceinline__ float2 io_load2<__half>(const __half* p) {
  return __half22float2(bits_as<__half2>(__ldcs(reinterpret_cast<const unsigned*>(p))));
}
template <typename IO> __device__ __forceinline__ void io_store2(IO* p, float a, float b);
template <> __device__ __forceinline__ void io_store2<float>(float* p, float a, float b) {
  __stcs(reinterpret_cast<float2*>(p), make_float2(a, b));
}
template <> __device__ __forceinline__ void io_store2<__nv_bfloat16>(__nv_bfloat16* p, float a, float b) {
  __stcs(reinterpret_cast<unsigned*>(p), as_bits(__floats2bfloat162_rn(a, b)));
}
template <> __device__ __forceinline__ void io_store2<__half>(__half* p, float a, float b) {
  __stcs(reinterpret_cast<unsigned*>(p), as_bits(__floats2half2_rn(a, b)));
}

__device__ __forceinline__ void cp_async8(void* smem_dst, const void* gmem_src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem_src) : "memory");
}
// 16-byte copy, bytes [src_bytes, 16) of the destination are zero-filled
__device__ __forceinline__ void cp_async16_zfill(void* smem_dst, const void* gmem_src, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

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

// The mid pass fences the outputs of every second frequency pair, so that the pairs' products
// are not all interleaved (register budget).
constexpr int kPairsPerFence = 2;

// The next sequence's u is prefetched into shared memory (cp.async) while the current one is
// transformed for 2-byte io only: for fp32 io it was slower (docs/performance.md). The host
// also leaves it off where the buffer would cost occupancy (KArgs::prefetch).
template <typename IO>
constexpr bool kPrefetchU = sizeof(IO) == 2;

struct KArgs {
  const void* u;
  int64_t ubs, ucs;
  const float2* K;  // (C, n1/2+1, n2)
  const float* skip;
  void* y;
  int64_t B, C, L;
  int S;         // floats per component per sequence area
  int prefetch;  // u of the next sequence is staged in shared memory (cp.async)
  int skip_fold; // always 1, see launch(): skip folded into the filter spectrum; 0: y += D·u at the store
  int N, n1, n2, ln1, ln2;
};

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

// filter spectrum at frequency f in [0, N/2], from the staged [k1][k2] copy
__device__ __forceinline__ cf kspec(const float2* stage, int f, const KArgs& a) {
  const int k1 = f & (a.n1 - 1);
  const bool dir = k1 <= (a.n1 >> 1);
  const int ff = dir ? f : a.N - f;
  const float2 v = stage[(ff & (a.n1 - 1)) * (a.n2 + 1) + (ff >> a.ln1)];
  return {v.x, dir ? v.y : -v.y};
}

// the filter spectrum along f = f0 + sgn·i·ns, i = 0, 1, ..., for n1 | ns: the row k1 and the
// conjugation are fixed, the column moves by ±ns/n1
struct KWalk {
  int base, step;
  bool neg;
  __device__ __forceinline__ KWalk(int f0, int sgn, int ns, const KArgs& a) {
    const int k1 = f0 & (a.n1 - 1);
    const bool dir = k1 <= (a.n1 >> 1);
    const int ff = dir ? f0 : a.N - f0;
    base = (ff & (a.n1 - 1)) * (a.n2 + 1) + (ff >> a.ln1);
    step = (dir ? sgn : -sgn) * (ns >> a.ln1);
    neg = !dir;
  }
  __device__ __forceinline__ cf at(const float2* stage, int i) const {
    const float2 v = stage[base + i * step];
    return {v.x, neg ? -v.y : v.y};
  }
};

// The real-FFT split of the frequency pair (k, M-k): the N-point spectrum X[k], X[M-k] of the
// real x from zk = Z[k], zm = Z[M-k] of the packed z[m] = x[2m] + i·x[2m+1] (Z[M] = Z[0]),
// w = ω_N^k.
__device__ __forceinline__ void split_pair(cf zk, cf zm, cf w, cf& xk, cf& xm) {
  const cf s = {zk.x + zm.x, zk.y - zm.y};  // Zk + conj Zm
  const cf d = {zk.x - zm.x, zk.y + zm.y};  // Zk - conj Zm
  const cf wd = cmul(w, d);
  const cf g = {-wd.y, wd.x};  // i·w·d
  xk = {0.5f * (s.x - g.x), 0.5f * (s.y - g.y)};
  xm = {0.5f * (s.x + g.x), -0.5f * (s.y + g.y)};  // conj(½(s + g))
}

// Its inverse: V[k], V[M-k] from the spectrum pair yk = Y[k], ym = Y[M-k], such that the
// unnormalised inverse M-point FFT of V packs the N-point inverse real FFT of Y (unnormalised).
__device__ __forceinline__ void merge_pair(cf yk, cf ym, cf w, cf& vk, cf& vm) {
  const cf s2 = {yk.x + ym.x, yk.y - ym.y};  // Yk + conj Ym
  const cf d2 = {yk.x - ym.x, yk.y + ym.y};  // Yk - conj Ym
  const cf cd = cmul(cconj(w), d2);
  const cf h = {-cd.y, cd.x};  // i·conj(w)·d2
  vk = {s2.x + h.x, s2.y + h.y};
  vm = {s2.x - h.x, -(s2.y - h.y)};  // conj(s2 - h)
}

// The split, the filter product (kk = K[k], km = K[M-k]) and the inverse split of one pair.
__device__ __forceinline__ void pair_fn(cf zk, cf zm, cf kk, cf km, cf w, cf& vk, cf& vm) {
  cf xk, xm;
  split_pair(zk, zm, w, xk, xm);
  merge_pair(cmul(xk, kk), cmul(xm, km), w, vk, vm);
}

// pair_fn for the frequency pair (f, M - f), the filter read by frequency from the stage;
// i: the pair's index along the butterfly, whose twiddle is w·W_32^i.
template <int M>
__device__ __forceinline__ void pair_at(const float2* stage, const KArgs& a, int i, int f, cf zk, cf zm, cf w,
                                        cf& vk, cf& vm) {
  fence(f);
  pair_fn(zk, zm, kspec(stage, f, a), kspec(stage, M - f, a), tw_const<false>(w, i, 32), vk, vm);
  if (i % kPairsPerFence == kPairsPerFence - 1) { fence(vk); fence(vm); }
}

// stage u[0:L) of one sequence into shared memory (16-byte chunks; src must be 16-byte aligned)
template <typename IO, int T>
__device__ __forceinline__ void prefetch_u(IO* buf, const IO* src, int L, int tx) {
  constexpr int CH = 16 / sizeof(IO);
  const int nch = (L + CH - 1) / CH;
  for (int c = tx; c < nch; c += T) {
    const int rem = (L - c * CH) * (int)sizeof(IO);
    cp_async16_zfill(buf + c * CH, src + c * CH, rem < 16 ? rem : 16);
  }
}
// ------------------------------------------------------------------------------------
// whole passes, as the backward and filter-spectrum kernels compose them (the forward kernel
// inlines its own, with the u prefetch and the filter-walk fast path)
// ------------------------------------------------------------------------------------
// Mid-pass frequency pairs per thread: thread 0 owns two self-paired frequencies (0 with M,
// and M/2) and so 17 pairs; every other thread owns 16.
constexpr int kPairSlots = 17;

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

// Forward passes p1 (global -> smem, radix R1, the upper half of z known zero) and p2: the
// sequence x[0:Lv), zero beyond, leaves them in smem ready for the mid pass. Starts with a
// barrier before its first smem write, so smem may still be read when it is called.
template <int LOGM, typename IO>
__device__ __forceinline__ void forward_passes(float* re, float* im, int tx, const float2* twFP2, const IO* x,
                                               int Lv) {
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
      if (xpair && t0 + 1 < Lv) {
        const float2 x2 = io_load2<IO>(x + t0);
        v[q][r] = {x2.x, x2.y};
      } else {
        v[q][r].x = t0 < Lv ? io_load<IO>(x + t0) : 0.f;
        v[q][r].y = t0 + 1 < Lv ? io_load<IO>(x + t0 + 1) : 0.f;
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
  __syncthreads();
  store_butterflies<T>(re, im, tx, v);
  __syncthreads();
  if constexpr (P::LR2 > 0) pass_smem<M, T, P::R2, P::R1, false>(re, im, tx, twFP2);
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

// The frequency pairs (k, M-k) of the mid pass as the forward kernel assigns them: for each,
// op(slot, k, Z[k], Z[M-k], ω_N^k, V[k], V[M-k]), where V lands in the register of the inverse
// radix-16 butterflies that read it. slot in [0, kPairSlots) numbers the thread's pairs.
template <int M, class Op>
__device__ __forceinline__ void for_each_pair(int tx, const cf (&A)[16], const cf (&Bv)[16], cf (&A2)[16],
                                              cf (&B2)[16], cf wp0, cf wp1, Op&& op) {
  constexpr int NS = M / 16;
  if (tx != 0) {
    // pairs (A[i], B[15-i]): k = tx + i·NS, M-k = j1 + (15-i)·NS
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      op(i, tx + i * NS, A[i], Bv[15 - i], tw_const<false>(wp0, i, 32), A2[i], B2[15 - i]);
      if (i % kPairsPerFence == kPairsPerFence - 1) { fence(A2[i]); fence(B2[15 - i]); }
    }
  } else {
    cf unused;
    op(0, 0, A[0], A[0], cf{1.f, 0.f}, A2[0], unused);        // k = 0 with M - k = M (Z[M] = Z[0])
    op(8, M / 2, A[8], A[8], cf{0.f, -1.f}, A2[8], unused);   // k = M/2 with itself; ω_N^(N/4) = -i
#pragma unroll
    for (int i = 1; i < 8; ++i) op(i, i * NS, A[i], A[16 - i], tw_const<false>(wp0, i, 32), A2[i], A2[16 - i]);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      op(9 + i, M / 32 + i * NS, Bv[i], Bv[15 - i], tw_const<false>(wp1, i, 32), B2[i], B2[15 - i]);
  }
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

// The mid pass's inverse radix-16 butterflies, the inverse p2 and the last inverse pass
// (smem -> global): stores y[t] for t < Lv.
template <int LOGM, typename IO>
__device__ __forceinline__ void inverse_passes(float* re, float* im, int tx, const float2* twM, const float2* twIP2,
                                               cf (&A2)[16], cf (&B2)[16], IO* y, int Lv) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T;
  const int j0 = tx, j1 = tx == 0 ? M / 32 : M / 16 - tx;
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
  if constexpr (P::LR2 > 0) pass_smem<M, T, P::R2, 16, true>(re, im, tx, twIP2);

  constexpr int R = P::R1, NB = 32 / R, NS = M / R;
  cf v[NB][R];
  last_inverse_butterflies<LOGM>(re, im, tx, twM, v, [](int) {});
  const bool ypair = (reinterpret_cast<uintptr_t>(y) & (2 * sizeof(IO) - 1)) == 0;
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T;
#pragma unroll
    for (int r = 0; r < R / 2; ++r) {
      const int t0 = 2 * (j + r * NS);
      if (ypair && t0 + 1 < Lv) {
        io_store2<IO>(y + t0, v[q][r].x, v[q][r].y);
      } else {
        if (t0 < Lv) io_store<IO>(y + t0, v[q][r].x);
        if (t0 + 1 < Lv) io_store<IO>(y + t0 + 1, v[q][r].y);
      }
    }
  }
}

// The channel's filter spectrum into the stage: its (n1/2 + 1) x n2 entries, rows padded to
// n2 + 1 float2 (as the filter walk reads them). Each thread copies, and later adjusts, the
// entries e = tx, tx + T, ...
__device__ __forceinline__ int stage_entries(const KArgs& a) { return (a.n1 / 2 + 1) * a.n2; }
__device__ __forceinline__ int stage_index(const KArgs& a, int e) { return (e >> a.ln2) * (a.n2 + 1) + (e & (a.n2 - 1)); }

// The copy in two halves, so that work can hide it: begin issues it (the caller has
// synchronized: smem is free); end waits for it, folds the skip term in when `fold` (K'[f] =
// K[f] + D/N) and synchronizes.
template <int T>
__device__ __forceinline__ void stage_filter_begin(float2* stage, const KArgs& a, int64_t c, bool valid, int tx) {
  if (!valid) return;
  const int total = stage_entries(a);
  const float2* Kc = a.K + c * (int64_t)total;
  for (int e = tx; e < total; e += T) cp_async8(stage + stage_index(a, e), Kc + e);
}
template <int T>
__device__ __forceinline__ void stage_filter_end(float2* stage, const KArgs& a, int64_t c, bool fold, int tx) {
  cp_async_wait_all();
  if (a.skip != nullptr && fold) {
    // 1/N is a power of two: exact. The real part of a stored entry is the real part of every
    // K[f] read from it, also of the conjugated ones.
    const float dsk = a.skip[c] * (1.f / (float)a.N);
    const int total = stage_entries(a);
    for (int e = tx; e < total; e += T) stage[stage_index(a, e)].x += dsk;
  }
  __syncthreads();
}

// ------------------------------------------------------------------------------------
// host side
// ------------------------------------------------------------------------------------
inline int ilog2_host(int64_t v) {
  int r = 0;
  while ((int64_t(1) << r) < v) ++r;
  return r;
}

constexpr size_t kMaxSmem = 227 * 1024;

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

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
