// monarch_fftconv: dispatch of the fused tensor-core Monarch convolution
// (kernel in tc/sm80_kernel.cuh, instantiated per precision by
// tc/sm80_instances_{tf32,bf16,fp16}.cu, which build in parallel).
//
// CUDA + CuTe headers only: never include torch here.

#include "fftconv.h"

namespace monarch_fftconv {
namespace tc {

// Defined in tc/sm80_kernel.cuh; instantiated in the precision units.
template <int N1, int N2, Precision P, IOType IO>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream);

using LaunchFn = cudaError_t (*)(const ConvForwardParams&, cudaStream_t);

}  // namespace tc

namespace engine {
// Defined in tc/engine_kernel.cuh; instantiated in tc/engine_instances.cu.
template <Precision P, IOType IO>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream);
template <Precision P, IOType IO>
size_t workspace_bytes(const ConvForwardParams& p);

// The tensor-core engine (docs/design.md, "The next tensor-core engine"): split 128 x 128,
// bf16/fp16 operands, fp32, bf16 or fp16 I/O; calls of kEngineMinSequences or more, or any size
// on request (MONARCH_FFTCONV_TC_KERNEL=engine). Any other call keeps the mma.sync kernel.
template <Precision P>
tc::LaunchFn pick_io(IOType io) {
  switch (io) {
    case IOType::kFloat32: return &launch<P, IOType::kFloat32>;
    case IOType::kBFloat16: return &launch<P, IOType::kBFloat16>;
    case IOType::kFloat16: return &launch<P, IOType::kFloat16>;
    default: return nullptr;
  }
}
inline tc::LaunchFn pick(const ConvForwardParams& p) {
  switch (p.precision) {
    case Precision::kBF16: return pick_io<Precision::kBF16>(p.io_type);
    case Precision::kFP16: return pick_io<Precision::kFP16>(p.io_type);
    default: return nullptr;
  }
}
// The workspace of the call engine::pick gives (its filter images), or 0.
inline size_t pick_workspace_bytes(const ConvForwardParams& p) {
  // The same for every I/O type: the images hold the filter in the operand type.
  switch (p.precision) {
    case Precision::kBF16: return workspace_bytes<Precision::kBF16, IOType::kFloat32>(p);
    case Precision::kFP16: return workspace_bytes<Precision::kFP16, IOType::kFloat32>(p);
    default: return 0;
  }
}
}  // namespace engine

namespace {

// Calls of at least this many sequences (B·C) take the engine where it applies (split 128 x 128,
// bf16/fp16 operands, any I/O type) unless MONARCH_FFTCONV_TC_KERNEL names a kernel: measured
// faster than the fp32 kernel from there (H100, session 20, fp32 I/O: 1.10x at 16x256x8192, 1.21x
// at 32x256, 1.24x at 64x768; a tie at 2048 sequences, slower below; session 36, bf16 I/O: 1.24x at
// 16x256x8192, 1.41x at 64x768). Smaller calls keep the mma.sync kernel.
// backends.ENGINE_MIN_SEQUENCES mirrors it (tests/test_build.py checks).
constexpr int64_t kEngineMinSequences = 4096;

// p.tc_kernel (MONARCH_FFTCONV_TC_KERNEL, which the binding reads per call) names a kernel for
// side-by-side measurements and tests: kEngine the engine at any size where it applies; kMma the
// mma.sync kernel at any size; kRoute the route above. (The Hopper wgmma kernel that "sm90" named
// was deleted in session 21: the engine replaced it, and it never beat the mma.sync kernel.)
// Split 128 x 128: the Hopper kernel a call takes, or nullptr for the mma.sync kernel.
tc::LaunchFn pick_hopper(const ConvForwardParams& p) {
  if (p.n1 != 128 || p.n2 != 128) return nullptr;
  switch (p.tc_kernel) {
    // Every precision engine::pick runs, bf16 and fp16 (backends.ENGINE_ROUTE_PRECISIONS names the
    // same two): fp16 is back since session 30, its filter peak near 2^-7 (engine_traits.cuh's
    // kFilterPeakExponent); in session 29 the route took bf16 alone, as a peak near 1 overflowed
    // fp16 on inputs of mean 4-8 (docs/design.md, "fp16's range").
    // Every I/O type since session 36 (2-byte I/O 1.24x / 1.41x the fp32 kernel's at 16x256x8192
    // / 64x768x8192 on an H100; backends.engine_applies says the same).
    case TensorCoreKernel::kRoute:
      return p.batch * p.channels >= kEngineMinSequences ? engine::pick(p) : nullptr;
    case TensorCoreKernel::kEngine: return engine::pick(p);
    default: return nullptr;
  }
}

}  // namespace

namespace tc {

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

size_t conv_forward_tensor_core_workspace_bytes(const ConvForwardParams& params) {
  return pick_hopper(params) != nullptr ? engine::pick_workspace_bytes(params) : 0;
}

cudaError_t conv_forward_tensor_core(const ConvForwardParams& params, cudaStream_t stream) {
  tc::LaunchFn launch = pick_hopper(params);
  if (launch == nullptr) launch = tc::pick(params);
  const bool valid = launch != nullptr && params.u != nullptr && params.y != nullptr &&
                     params.filter_spectrum != nullptr && params.batch * params.channels <= int64_t(0x7fffffff) &&
                     reinterpret_cast<uintptr_t>(params.filter_spectrum) % 8 == 0 &&
                     params.pregate == nullptr && params.postgate == nullptr;  // gates: the fp32 kernel's only
  return valid ? launch(params, stream) : cudaErrorInvalidValue;
}

}  // namespace monarch_fftconv
