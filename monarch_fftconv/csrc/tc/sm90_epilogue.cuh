// monarch_fftconv: the Hopper Monarch kernel's epilogues' helpers (tc/sm90_kernel.cuh), fp32 on
// the accumulators (their complex products: common/complex.cuh): the N-point twiddles from
// two tables and their per-row recurrence (RowTwiddles, for_each_pair_by_row), the rounding
// to the operand type, the stores into the 128-byte-swizzled operand buffers, and the Nyquist
// row's 128-point FFT.
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>

#include "common/complex.cuh"
#include "common/ptx.cuh"

namespace monarch_fftconv {
namespace sm90 {

using namespace cute;

// exp(-2 pi i e / 16384) for 0 <= e < 16384, from two 128-entry tables.
__device__ __forceinline__ float2 twiddle(const float2* w128, const float2* tw_lo, int e) {
  return cmul(w128[e >> 7], tw_lo[e & 127]);
}

// Two floats rounded to the operand type, lo in the low half: one cvt instruction.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, cute::bfloat16_t>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(h);
  }
}

// One warp: a 128-point complex DFT (radix-2 Stockham, natural order in and out), forward
// (exp(-2 pi i / 128)) or inverse (unnormalised). Reads `in`, ping-pongs between buf[0] and
// buf[1]; returns the buffer that holds the result. Used for the Nyquist row only.
template <bool Inverse>
__device__ __forceinline__ const float2* fft128_warp(const float2* in, float2 (*buf)[128], const float2* w128,
                                                     int lane) {
  const float2* src = in;
  int out = 0;
#pragma unroll
  for (int span = 1; span < 128; span *= 2) {  // span: length of the sub-transforms already done
    float2* dst = buf[out];
#pragma unroll
    for (int i = lane; i < 64; i += 32) {
      const int k = i & (span - 1);
      const float2 w = w128[k * (64 / span)];
      const float2 u0 = src[i];
      const float2 u1 = Inverse ? cmul_conj(src[i + 64], w) : cmul(src[i + 64], w);
      const int j = 2 * i - k;
      dst[j] = make_float2(u0.x + u1.x, u0.y + u1.y);
      dst[j + span] = make_float2(u0.x - u1.x, u0.y - u1.y);
    }
    __syncwarp();
    src = dst;
    out ^= 1;
  }
  return src;
}

// The twiddles of one accumulator row, by recurrence along its columns: the thread's columns
// are n0 + 8j and n0 + 8j + 1 (the GMMA accumulator layout), so w(s + 8) = w(s)·exp(-2 pi i 8 k1 / N).
// The fp32 rounding of 8 steps (~1e-6) is far below the 16-bit operands'.
struct RowTwiddles {
  float2 cur, step1, step8;
  __device__ __forceinline__ RowTwiddles(const float2* w128, const float2* tw_lo, int k1, int s0)
      : cur(twiddle(w128, tw_lo, k1 * s0)), step1(twiddle(w128, tw_lo, k1)), step8(twiddle(w128, tw_lo, 8 * k1)) {}
  // The twiddles of columns s and s + 1, then advance by 8 columns.
  __device__ __forceinline__ void next(float2& w0, float2& w1) {
    w0 = cur;
    w1 = cmul(cur, step1);
    cur = cmul(cur, step8);
  }
};

// Stores to shared memory through 32-bit shared-window addresses (smem_address, common/ptx.cuh):
// one register per address, and the imaginary plane is the real one's address + a constant.
__device__ __forceinline__ void st_shared(uint32_t address, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared(uint32_t address, uint2 v) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(address), "r"(v.x), "r"(v.y) : "memory");
}

// Element offset of (i, j) in a GMMA 128-byte-swizzled layout of 16-bit elements: the layout's
// unswizzled offset, then the swizzle (16-byte chunk ^= 128-byte row, mod 8). Calling the
// composed layout itself would swizzle element offsets as if they were bytes; the smem tensors
// apply the swizzle to addresses, which this matches (checked against them on the host).
template <class SwizzledLayout>
__device__ __forceinline__ uint32_t swizzled_offset(SwizzledLayout const& layout, int i, int j) {
  return Swizzle<3, 3, 3>{}(uint32_t(layout.layout_b()(i, j)));
}

// Visits this thread's accumulator pairs row by row: fn(k1, s, i, twiddles) for the values i and
// i + 1 at (k1, s) and (k1, s + 1). The GMMA accumulator layout gives each thread two rows, m0
// (values 4j, 4j + 1) and m0 + 8 (values 4j + 2, 4j + 3), and columns n0 + 8j, n0 + 8j + 1: the
// order RowTwiddles::next walks, so fn takes the pair's twiddles with twiddles.next(w0, w1).
template <class Coord, class Fn>
__device__ __forceinline__ void for_each_pair_by_row(const Coord& coord, int col0, const float2* w128,
                                                     const float2* tw_lo, Fn&& fn) {
  constexpr int kValues = decltype(size(coord))::value;
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    const int k1 = get<0>(coord(2 * row));
    RowTwiddles twiddles(w128, tw_lo, k1, col0 + get<1>(coord(2 * row)));
#pragma unroll
    for (int i = 2 * row; i < kValues; i += 4) fn(k1, col0 + get<1>(coord(i)), i, twiddles);
  }
}

}  // namespace sm90
}  // namespace monarch_fftconv
