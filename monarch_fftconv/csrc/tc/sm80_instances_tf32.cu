// monarch_fftconv: the tf32 instances of the fused tensor-core Monarch kernel.
// One unit per precision so that the builds run in parallel.
// CUDA + CuTe headers only: never include torch here.

#include "tc/sm80_kernel.cuh"

namespace monarch_fftconv {
namespace tc {
#define MONARCH_TC_INSTANCE(N1_, N2_) MONARCH_TC_INSTANTIATE_SPLIT(N1_, N2_, Precision::kTF32)
MONARCH_FFTCONV_SPLITS(MONARCH_TC_INSTANCE)
#undef MONARCH_TC_INSTANCE
}  // namespace tc
}  // namespace monarch_fftconv
