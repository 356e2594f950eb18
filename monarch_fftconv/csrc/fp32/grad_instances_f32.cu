// monarch_fftconv: the fp32-I/O grad kernels of the fp32 backward, every size and route
// (fp32/grad_kernels.cuh). One unit per io type and gating, so that the builds run in parallel.
// CUDA headers only: never include torch here.

#include "fp32/grad_kernels.cuh"

namespace monarch_fftconv {
namespace fp32_grad {
template cudaError_t launch_io<float, false>(const ConvBackwardParams&, cudaStream_t, size_t*);
}  // namespace fp32_grad
}  // namespace monarch_fftconv
