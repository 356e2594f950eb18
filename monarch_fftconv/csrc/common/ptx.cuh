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

// Ask L2 for the 128-byte line holding p; holds no register and never faults the kernel.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

}  // namespace monarch_fftconv
