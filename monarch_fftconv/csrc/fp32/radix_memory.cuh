// monarch_fftconv, the fp32 radix library (fp32/radix.cuh): memory. Shared-memory indexing
// (structure of arrays, padded index), the io conversions of u and y (streaming loads and
// stores), and the asynchronous copies (cp.async, the u prefetch; the L2 prefetch is in
// common/ptx.cuh).
#pragma once

#include "common/ptx.cuh"
#include "fp32/radix_dft.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace monarch_fftconv {
namespace {  // internal linkage: each kernel translation unit has its own copy
namespace fp32_detail {

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

// out[t] = kept[t]·x[t] for t < n, by `threads` threads from thread tx, a pass of its own in pairs
// (where all three rows are 8-byte aligned): kept read through L2 (a pass soon reads it again),
// x read and out written as streams. The gated grad kernel's dpostgate = dy ⊙ z.
__device__ __forceinline__ void multiply_rows(float* out, const float* kept, const float* x, int n, int tx,
                                              int threads) {
  const uintptr_t any = reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(kept) |
                        reinterpret_cast<uintptr_t>(x);
  int t = tx;
  if ((any & 7) == 0) {
#pragma unroll 4
    for (int i = tx; i < n / 2; i += threads) {
      const float2 k2 = __ldg(reinterpret_cast<const float2*>(kept) + i);
      const float2 x2 = __ldcs(reinterpret_cast<const float2*>(x) + i);
      __stcs(reinterpret_cast<float2*>(out) + i, make_float2(k2.x * x2.x, k2.y * x2.y));
    }
    t = (n & ~1) + tx;  // an odd row's last element
  }
  for (; t < n; t += threads) __stcs(out + t, __ldg(kept + t) * __ldcs(x + t));
}

// Two consecutive elements x[t0], x[t0 + 1] (zero at and past Lv) in two steps: their bits as
// memory holds them (a float2, or one 32-bit word of two 16-bit halves), then the floats. The
// load's branch (paired or element by element at a row's end) only moves bits; the conversion
// follows once the branches merge. Converted inside the branch, each 16-bit load was waited
// for before the next one issued (a PRMT on the scoreboard after every LDG: the bf16 grad
// kernel took 967 us against fp32's 581, ncu, docs/performance.md session 18).
template <typename IO> struct PairBits { using type = unsigned; };  // 16-bit: low half x[t0]
template <> struct PairBits<float> { using type = float2; };
template <typename IO> using pair_bits_t = typename PairBits<IO>::type;

// paired: x + t0 is aligned for one two-element access (t0 even and x aligned to two elements)
template <typename IO>
__device__ __forceinline__ pair_bits_t<IO> load_pair_bits(const IO* x, int t0, int Lv, bool paired) {
  if constexpr (sizeof(IO) == 4) {
    if (paired && t0 + 1 < Lv) return __ldcs(reinterpret_cast<const float2*>(x + t0));
    float2 w;  // element by element, x[t0] first
    w.x = t0 < Lv ? __ldcs(x + t0) : 0.f;
    w.y = t0 + 1 < Lv ? __ldcs(x + t0 + 1) : 0.f;
    return w;
  } else {
    if (paired && t0 + 1 < Lv) return __ldcs(reinterpret_cast<const unsigned*>(x + t0));
    const unsigned short* h = reinterpret_cast<const unsigned short*>(x);
    const unsigned lo = t0 < Lv ? __ldcs(h + t0) : 0u, hi = t0 + 1 < Lv ? __ldcs(h + t0 + 1) : 0u;
    return lo | (hi << 16);
  }
}
template <typename IO> __device__ __forceinline__ float2 pair_bits_to_float2(pair_bits_t<IO> w);
template <> __device__ __forceinline__ float2 pair_bits_to_float2<float>(float2 w) { return w; }
template <> __device__ __forceinline__ float2 pair_bits_to_float2<__nv_bfloat16>(unsigned w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));  // bf16 is fp32's top half
}
template <> __device__ __forceinline__ float2 pair_bits_to_float2<__half>(unsigned w) {
  return __half22float2(bits_as<__half2>(w));
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
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

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

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
