// monarch_fftconv: the bf16-I/O grad kernels of the fp32 backward at the sizes of part 1
// (N = 8192 .. 32768), every route (fp32/grad_kernels.cuh). One unit per io type, gating and size
// part, so that the builds run in parallel and none takes much longer than the others.
// CUDA headers only: never include torch here.

#include "fp32/grad_kernels.cuh"

namespace monarch_fftconv {
namespace fp32_grad {
template cudaError_t launch_io<__nv_bfloat16, false, 1>(const ConvBackwardParams&, cudaStream_t, size_t*);
}  // namespace fp32_grad
}  // namespace monarch_fftconv
