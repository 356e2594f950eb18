// monarch_fftconv: instances of the Hopper tensor-core engine's forward, tc/engine_kernel.cuh:
// split 128 x 128, bf16 and fp16 operands, fp32, bf16 and fp16 I/O.
// CUDA + CuTe headers only: never include torch here.

#include "tc/engine_kernel.cuh"

namespace monarch_fftconv {
namespace engine {

// dispatch.cu sizes every call's filter-image workspace with the fp32-I/O traits: an image holds
// the filter in the operand type, whatever u's.
template <Precision P>
constexpr bool kImageBytesOfEveryIo =
    EngineTraits<P, IOType::kBFloat16>::kImageBytes == EngineTraits<P, IOType::kFloat32>::kImageBytes &&
    EngineTraits<P, IOType::kFloat16>::kImageBytes == EngineTraits<P, IOType::kFloat32>::kImageBytes;
static_assert(kImageBytesOfEveryIo<Precision::kBF16> && kImageBytesOfEveryIo<Precision::kFP16>,
              "an image's size does not depend on the I/O type (engine::pick_workspace_bytes)");

template cudaError_t launch<Precision::kBF16, IOType::kFloat32>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch<Precision::kFP16, IOType::kFloat32>(const ConvForwardParams&, cudaStream_t);
template size_t workspace_bytes<Precision::kBF16, IOType::kFloat32>(const ConvForwardParams&);
template size_t workspace_bytes<Precision::kFP16, IOType::kFloat32>(const ConvForwardParams&);
template cudaError_t launch<Precision::kBF16, IOType::kBFloat16>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch<Precision::kBF16, IOType::kFloat16>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch<Precision::kFP16, IOType::kBFloat16>(const ConvForwardParams&, cudaStream_t);
template cudaError_t launch<Precision::kFP16, IOType::kFloat16>(const ConvForwardParams&, cudaStream_t);

}  // namespace engine
}  // namespace monarch_fftconv
