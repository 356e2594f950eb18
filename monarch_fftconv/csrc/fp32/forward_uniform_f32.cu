// monarch_fftconv: the uniform pair sweep's forward kernels with fp32 I/O (fp32/forward_kernels.cuh;
// the default route where built, MONARCH_FFTCONV_FWD_UNIFORM_PAIRS=0 takes thread 0's own path),
// gated and ungated, every size where they are built. One unit per io type, so that the builds
// run in parallel.
// CUDA headers only: never include torch here.

#include "fp32/forward_instances.cuh"

namespace monarch_fftconv {
namespace fp32_forward {
template cudaError_t launch_uniform_pairs<float>(const ConvForwardParams&, cudaStream_t);
}  // namespace fp32_forward
}  // namespace monarch_fftconv
