// monarch_fftconv: the definitions of the fp32 forward's per-io-type launchers
// (fp32_forward::launch_uniform_pairs and launch_own_path, declared in fp32/forward_kernels.cuh),
// included only by the units that instantiate them (fp32/forward_{uniform,own_path}_<io>.cu), so
// that no other unit compiles the kernels.
// CUDA headers only: never include torch here.
#pragma once

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

template <typename IO>
cudaError_t launch_own_path(const ConvForwardParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  return with_plan(p.fft_size, cudaErrorInvalidValue,
                   [&](auto logm) { return launch_gating<decltype(logm)::value, IO, false>(p, stream); });
}
}  // namespace fp32_forward
}  // namespace monarch_fftconv
