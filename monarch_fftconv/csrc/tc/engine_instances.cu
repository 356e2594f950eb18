// monarch_fftconv: instances of the Hopper tensor-core engine's forward, tc/engine_kernel.cuh:
// split 128 x 128, bf16 and fp16 operands, fp32 I/O (and bf16/fp16 I/O with MONARCH_FFTCONV_ENGINE_HALF_IO).
// CUDA + CuTe headers only: never include torch here.

#include "tc/engine_kernel.cuh"

namespace monarch_fftconv {
namespace engine {

template cudaError_t launch<Precision::kBF16, IOType::kFloat32>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch<Precision::kFP16, IOType::kFloat32>(const ConvForwardParams&, cudaStream_t);
template size_t workspace_bytes<Precision::kBF16, IOType::kFloat32>(const ConvForwardParams&);
template size_t workspace_bytes<Precision::kFP16, IOType::kFloat32>(const ConvForwardParams&);
#if MONARCH_FFTCONV_ENGINE_HALF_IO  // 2-byte u and y (engine_traits.cuh)
template cudaError_t launch<Precision::kBF16, IOType::kBFloat16>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch<Precision::kBF16, IOType::kFloat16>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch<Precision::kFP16, IOType::kBFloat16>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch<Precision::kFP16, IOType::kFloat16>(const ConvForwardParams&, cudaStream_t);
#endif

}  // namespace engine
}  // namespace monarch_fftconv
