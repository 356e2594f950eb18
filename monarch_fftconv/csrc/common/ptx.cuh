// monarch_fftconv: the small PTX wrappers more than one kernel family uses.
//
// CUDA headers only: never include torch here.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace monarch_fftconv {

// A shared-memory address in the 32-bit shared window: one register (a generic pointer takes
// two), the form ldmatrix, cp.async and st.shared take.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Stores to shared memory through shared-window addresses (smem_address): one register per
// address, so a kernel can keep a plane's base and add constant offsets for the other.
__device__ __forceinline__ void st_shared(uint32_t address, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared(uint32_t address, uint2 v) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(address), "r"(v.x), "r"(v.y) : "memory");
}

// Ask L2 for the 128-byte line holding p; holds no register and never faults the kernel.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Asks L2 for the bytes [p, p + bytes), one 128-byte line a thread at a time over `threads`
// threads (thread `t` of them): every line of the span, the last partial one included.
__device__ __forceinline__ void prefetch_span_l2(const void* p, int64_t bytes, int t, int threads) {
  const char* base = static_cast<const char*>(p);
  const int64_t end = bytes + ((reinterpret_cast<uintptr_t>(base) & 127) ? 128 : 0);
  for (int64_t at = (int64_t)t * 128; at < end; at += (int64_t)threads * 128) prefetch_l2(base + (at < bytes ? at : bytes - 1));
}

}  // namespace monarch_fftconv
