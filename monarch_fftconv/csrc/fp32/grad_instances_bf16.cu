// monarch_fftconv: the bf16-I/O grad kernels of the fp32 backward, every size and route
// (fp32/grad_kernels.cuh). One unit per io type and gating, so that the builds run in parallel.
// CUDA headers only: never include torch here.

#include "fp32/grad_kernels.cuh"

namespace monarch_fftconv {
namespace fp32_grad {
template cudaError_t launch_io<__nv_bfloat16, false>(const ConvBackwardParams&, cudaStream_t, size_t*);
}  // namespace fp32_grad
}  // namespace monarch_fftconv
