// monarch_fftconv: dispatch of the fused tensor-core Monarch convolution
// (kernel in monarch_tensor_core_kernel.cuh, instantiated per precision by
// monarch_tc_{tf32,bf16,fp16}.cu, which build in parallel).
//
// CUDA + CuTe headers only: never include torch here.

#include "monarch_tensor_core.cuh"

namespace monarch_fftconv {
namespace tc {

// Defined in monarch_tensor_core_kernel.cuh; instantiated in the precision units.
template <int N1, int N2, Precision P, IOType IO>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream);

using LaunchFn = cudaError_t (*)(const ConvForwardParams&, cudaStream_t);

template <int N1, int N2, Precision P>
constexpr LaunchFn pick_io(IOType io) {
  return io == IOType::kFloat32    ? &launch<N1, N2, P, IOType::kFloat32>
         : io == IOType::kBFloat16 ? &launch<N1, N2, P, IOType::kBFloat16>
                                   : &launch<N1, N2, P, IOType::kFloat16>;
}

template <int N1, int N2>
LaunchFn pick_prec(Precision prec, IOType io) {
  switch (prec) {
    case Precision::kTF32: return pick_io<N1, N2, Precision::kTF32>(io);
    case Precision::kBF16: return pick_io<N1, N2, Precision::kBF16>(io);
    case Precision::kFP16: return pick_io<N1, N2, Precision::kFP16>(io);
    default: return nullptr;
  }
}

// The dispatch table over the kernels' splits (MONARCH_FFTCONV_SPLITS, fftconv.h).
LaunchFn pick(const ConvForwardParams& p) {
  switch (p.n1 * 1000 + p.n2) {
#define MONARCH_TC_CASE(N1_, N2_) \
  case N1_ * 1000 + N2_: return pick_prec<N1_, N2_>(p.precision, p.io_type);
    MONARCH_FFTCONV_SPLITS(MONARCH_TC_CASE)
#undef MONARCH_TC_CASE
    default: return nullptr;
  }
}

}  // namespace tc

cudaError_t conv_forward_tensor_core(const ConvForwardParams& params, cudaStream_t stream) {
  const tc::LaunchFn launch = tc::pick(params);
  const bool valid = launch != nullptr && params.u != nullptr && params.y != nullptr &&
                     params.filter_spectrum != nullptr && params.batch * params.channels <= int64_t(0x7fffffff) &&
                     reinterpret_cast<uintptr_t>(params.filter_spectrum) % 8 == 0;
  return valid ? launch(params, stream) : cudaErrorInvalidValue;
}

}  // namespace monarch_fftconv
