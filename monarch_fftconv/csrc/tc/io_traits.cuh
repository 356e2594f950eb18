// monarch_fftconv: the io element types of u and y in global memory as the tensor-core Monarch
// kernels read and write them (tc/sm80_kernel.cuh, tc/engine_kernel.cuh): IoTraits<IOType>,
// read-only-cache loads (__ldg, 16-byte vectors unpacked) and plain stores. The fp32 radix
// library has its own, streaming (fp32/radix_memory.cuh): its policy differs.
//
// CUDA headers only: never include torch here.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fftconv.h"

namespace monarch_fftconv {
namespace tc {

template <IOType T> struct IoTraits;
template <> struct IoTraits<IOType::kFloat32> {
  using T = float;
  static constexpr int kVec = 4;  // elements per 16-byte load
  __device__ __forceinline__ static void unpack(const uint4& r, float (&v)[kVec]) {
    v[0] = __uint_as_float(r.x); v[1] = __uint_as_float(r.y);
    v[2] = __uint_as_float(r.z); v[3] = __uint_as_float(r.w);
  }
  __device__ __forceinline__ static float load(const void* p, int64_t i) {
    return __ldg(static_cast<const float*>(p) + i);
  }
  __device__ __forceinline__ static void store(void* p, int64_t i, float v) {
    static_cast<float*>(p)[i] = v;
  }
  __device__ __forceinline__ static void store2(void* p, int64_t i, float a, float b) {
    *reinterpret_cast<float2*>(static_cast<float*>(p) + i) = make_float2(a, b);
  }
  __device__ __forceinline__ static float2 load2(const void* p, int64_t i) {
    return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(p) + i));
  }
};
template <> struct IoTraits<IOType::kBFloat16> {
  using T = __nv_bfloat16;
  static constexpr int kVec = 8;
  __device__ __forceinline__ static void unpack(const uint4& r, float (&v)[kVec]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[2 * q] = __uint_as_float(w[q] << 16);
      v[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
    }
  }
  __device__ __forceinline__ static float load(const void* p, int64_t i) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  __device__ __forceinline__ static void store(void* p, int64_t i, float v) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
  __device__ __forceinline__ static void store2(void* p, int64_t i, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p) + i) =
        __floats2bfloat162_rn(a, b);
  }
  __device__ __forceinline__ static float2 load2(const void* p, int64_t i) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
        static_cast<const __nv_bfloat16*>(p) + i));
  }
};
template <> struct IoTraits<IOType::kFloat16> {
  using T = __half;
  static constexpr int kVec = 8;
  __device__ __forceinline__ static void unpack(const uint4& r, float (&v)[kVec]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[2 * q] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[q] & 0xffffu)));
      v[2 * q + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[q] >> 16)));
    }
  }
  __device__ __forceinline__ static float load(const void* p, int64_t i) {
    return __half2float(static_cast<const __half*>(p)[i]);
  }
  __device__ __forceinline__ static void store(void* p, int64_t i, float v) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
  __device__ __forceinline__ static void store2(void* p, int64_t i, float a, float b) {
    *reinterpret_cast<__half2*>(static_cast<__half*>(p) + i) = __floats2half2_rn(a, b);
  }
  __device__ __forceinline__ static float2 load2(const void* p, int64_t i) {
    return __half22float2(*reinterpret_cast<const __half2*>(static_cast<const __half*>(p) + i));
  }
};

}  // namespace tc
}  // namespace monarch_fftconv
