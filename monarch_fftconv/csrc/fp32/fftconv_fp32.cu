// monarch_fftconv: the fused fp32-accurate causal FFT convolution's forward: the checks of a
// call and its entry point (the algorithm, the kernels and their launchers:
// fp32/forward_kernels.cuh; the instances: fp32/forward_{uniform,own_path}_<io>.cu, a unit per
// io type and path, which build in parallel).
//
// CUDA headers only: never include torch here.

#include "fp32/forward_kernels.cuh"

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

// The uniform pair sweep where the caller asks for it (p.uniform_pairs) and its filter walks hold
// (n1 | M/16), else thread 0's own path. Both give the same bits.
template <typename IO>
cudaError_t dispatch_size(const ConvForwardParams& p, cudaStream_t stream) {
  return with_plan(p.fft_size, cudaErrorInvalidValue, [&](auto logm) {
    return takes_uniform_pairs<decltype(logm)::value>(p) ? fp32_forward::launch_uniform_pairs<IO>(p, stream)
                                                         : fp32_forward::launch_own_path<IO>(p, stream);
  });
}

}  // namespace fp32_detail
}  // namespace

// The binding has checked the call against the coverage (MONARCH_FFTCONV_SPLITS); this
// only guards the launch itself.
cudaError_t conv_forward_fp32(const ConvForwardParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  const bool valid = p.precision == Precision::kFP32 && covers_radix_split(p.n1, p.n2) && p.u && p.y &&
                     p.filter_spectrum && reinterpret_cast<uintptr_t>(p.filter_spectrum) % 8 == 0 &&
                     smem_bytes_for(p.fft_size, p.n1, p.n2) <= kMaxSmem;
  if (!valid) return cudaErrorInvalidValue;
  switch (p.io_type) {
    case IOType::kFloat32: return dispatch_size<float>(p, stream);
    case IOType::kBFloat16: return dispatch_size<__nv_bfloat16>(p, stream);
    case IOType::kFloat16: return dispatch_size<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace monarch_fftconv
