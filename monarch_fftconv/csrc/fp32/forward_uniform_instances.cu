// monarch_fftconv: the uniform pair sweep's forward kernels (fp32/forward_kernels.cuh; the default
// route where built, MONARCH_FFTCONV_FWD_UNIFORM_PAIRS=0 takes thread 0's own path), every io type,
// gating and size where they are built. A unit of its own, so that it builds in parallel with
// fp32/fftconv_fp32.cu (thread 0's own-path kernels: sizes the sweep does not cover, and =0).
// CUDA headers only: never include torch here.

#include "fp32/forward_kernels.cuh"

namespace monarch_fftconv {
namespace fp32_forward {
template <typename IO>
cudaError_t launch_uniform_pairs(const ConvForwardParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  return with_plan(p.fft_size, cudaErrorInvalidValue, [&](auto logm) {
    constexpr int LOGM = decltype(logm)::value;
    if constexpr (uniform_pairs_built(Plan<LOGM>::M)) {  // instantiated only where built
      if (takes_uniform_pairs<LOGM>(p)) return launch_gating<LOGM, IO, true>(p, stream);
    }
    return cudaErrorInvalidValue;
  });
}

template cudaError_t launch_uniform_pairs<float>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch_uniform_pairs<__nv_bfloat16>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch_uniform_pairs<__half>(const ConvForwardParams&, cudaStream_t);
}  // namespace fp32_forward
}  // namespace monarch_fftconv
