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

}  // namespace monarch_fftconv
