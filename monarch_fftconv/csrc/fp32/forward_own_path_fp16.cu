// monarch_fftconv: the forward kernels on thread 0's own path with fp16 I/O (fp32/forward_kernels.cuh:
// the sizes the uniform pair sweep does not cover, and MONARCH_FFTCONV_FWD_UNIFORM_PAIRS=0), gated
// and ungated, every size. One unit per io type, so that the builds run in parallel.
// CUDA headers only: never include torch here.

#include "fp32/forward_instances.cuh"

namespace monarch_fftconv {
namespace fp32_forward {
template cudaError_t launch_own_path<__half>(const ConvForwardParams&, cudaStream_t);
}  // namespace fp32_forward
}  // namespace monarch_fftconv
