// monarch_fftconv, the fp32 radix library (fp32/radix.cuh): complex values and in-register
// DFTs. The cf type and its arithmetic (explicit FMAs), the scheduling fences, the compile-
// time W_32 table, the radix-2 butterflies and radix-R DFTs in registers (R <= 32), and the
// short product trees of the inter-pass twiddles.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
