// monarch_fftconv: complex arithmetic on float2 (x the real part, y the imaginary part), as the
// tensor-core kernels' fp32 epilogues and twiddle tables use it (tc/). The fp32 radix library
// keeps its own complex type, cf, whose products are written with explicit FMAs
// (fp32/radix_dft.cuh): a different rounding contract, so the two are not merged.
#pragma once

#include <cuda_runtime.h>

namespace monarch_fftconv {

__device__ __forceinline__ float2 cmul(float2 a, float2 b) {
  return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ float2 cmul_conj(float2 a, float2 b) {  // a * conj(b)
  return make_float2(a.x * b.x + a.y * b.y, a.y * b.x - a.x * b.y);
}

}  // namespace monarch_fftconv
