// monarch_fftconv: the fused fp32-accurate backward's entry points: the checks of a call, then
// the instances of its io type and size part (the kernels and their data flow:
// fp32/grad_kernels.cuh; the instances: fp32/grad_instances_*_part<n>.cu, one unit per io type,
// gating and size part, which build in parallel).
//
// CUDA headers only: never include torch here.

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fftconv.h"
#include "fp32/radix_plan.cuh"

namespace monarch_fftconv {
namespace fp32_grad {
// Defined in fp32/grad_kernels.cuh; instantiated in the fp32/grad_instances_*_part<PART>.cu units.
template <typename IO, bool GATED, int PART>
cudaError_t launch_io(const ConvBackwardParams& p, cudaStream_t stream, size_t* workspace_bytes);
}  // namespace fp32_grad

namespace {

// The instances of the call's size part.
template <typename IO, bool GATED>
cudaError_t launch_io_part(const ConvBackwardParams& p, cudaStream_t stream, size_t* workspace_bytes) {
  return fp32_detail::size_part_of(p.fft_size) == 0 ? fp32_grad::launch_io<IO, GATED, 0>(p, stream, workspace_bytes)
                                                    : fp32_grad::launch_io<IO, GATED, 1>(p, stream, workspace_bytes);
}

// The instances of the call's io type; a gated call's only where they are built (fp32 io:
// fp32/grad_kernels.cuh, kGatedGradIO; the binding sends no other).
cudaError_t launch_io_type(const ConvBackwardParams& p, bool gated, cudaStream_t stream, size_t* workspace_bytes) {
  switch (p.io_type) {
    case IOType::kFloat32:
      return gated ? launch_io_part<float, true>(p, stream, workspace_bytes)
                   : launch_io_part<float, false>(p, stream, workspace_bytes);
    case IOType::kBFloat16:
      return gated ? cudaErrorInvalidValue : launch_io_part<__nv_bfloat16, false>(p, stream, workspace_bytes);
    case IOType::kFloat16:
      return gated ? cudaErrorInvalidValue : launch_io_part<__half, false>(p, stream, workspace_bytes);
  }
  return cudaErrorInvalidValue;
}

// workspace_bytes != nullptr: only size the workspace.
cudaError_t grad_dispatch(const ConvBackwardParams& p, cudaStream_t stream, size_t* workspace_bytes) {
  const bool valid = covers_radix_split(p.n1, p.n2) && p.batch > 0 && p.channels > 0 && p.filter_len >= 1 &&
                     p.filter_len <= p.seq_len && 2 * p.seq_len <= p.fft_size &&
                     fp32_detail::smem_bytes_for(p.fft_size, p.n1, p.n2) <= fp32_detail::kMaxSmem;
  if (!valid) return cudaErrorInvalidValue;
  // The gated step: causal only, its dpregate given with its pregate.
  const bool gated = p.pregate != nullptr || p.postgate != nullptr;
  if (gated && (p.two_sided || (p.pregate && !p.grad_pregate))) return cudaErrorInvalidValue;
  // dpostgate in the kernel: z and its gradient together, beside a postgate
  if ((p.postgate_z != nullptr) != (p.grad_postgate != nullptr) || (p.grad_postgate && !p.postgate))
    return cudaErrorInvalidValue;
  if (workspace_bytes == nullptr &&
      !(p.u && p.grad && (p.grad_u || p.filter_grad_only) && p.grad_filter && p.workspace && p.filter_spectrum &&
        reinterpret_cast<uintptr_t>(p.filter_spectrum) % 8 == 0 && reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0))
    return cudaErrorInvalidValue;
  return launch_io_type(p, gated, stream, workspace_bytes);
}

}  // namespace

size_t conv_backward_fp32_workspace_bytes(const ConvBackwardParams& p) {
  size_t bytes = 0;
  return grad_dispatch(p, nullptr, &bytes) == cudaSuccess ? bytes : 0;
}

cudaError_t conv_backward_fp32(const ConvBackwardParams& p, cudaStream_t stream) {
  return grad_dispatch(p, stream, nullptr);
}

}  // namespace monarch_fftconv
