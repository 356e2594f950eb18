// monarch_fftconv: instances of the Hopper (wgmma) Monarch kernel, tc/sm90_kernel.cuh:
// split 128 x 128, bf16 and fp16 operands, every io type.
// CUDA + CuTe headers only: never include torch here.

#include "tc/sm90_kernel.cuh"

namespace monarch_fftconv {
namespace sm90 {

#define MONARCH_SM90_INSTANCE(P_, IO_)                                               \
  template cudaError_t launch<P_, IO_, 2>(const ConvForwardParams&, cudaStream_t); \
  template cudaError_t launch<P_, IO_, 1>(const ConvForwardParams&, cudaStream_t);
#define MONARCH_SM90_ALL_IO(P_)                        \
  MONARCH_SM90_INSTANCE(P_, IOType::kFloat32)          \
  MONARCH_SM90_INSTANCE(P_, IOType::kBFloat16)         \
  MONARCH_SM90_INSTANCE(P_, IOType::kFloat16)
MONARCH_SM90_ALL_IO(Precision::kBF16)
MONARCH_SM90_ALL_IO(Precision::kFP16)
#undef MONARCH_SM90_ALL_IO
#undef MONARCH_SM90_INSTANCE

}  // namespace sm90
}  // namespace monarch_fftconv
