// The one translation unit that speaks to torch. It registers the CUDA implementation of
// the `monarch_fftconv::conv_forward` op (whose schema, CPU implementation and fake kernel
// live in monarch_fftconv/ops.py), checks its tensors once, fills the torch-free
// ConvForwardParams of fftconv.h and launches on the current stream. It also reports the
// kernels' coverage, which Python reads once when it loads this library.
//
// Per-op ATen headers and c10 CUDA headers only (no torch/all.h): keeps the JIT build fast.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fftconv.h"

namespace mf = monarch_fftconv;

namespace {

mf::IOType io_type_of(const at::Tensor& u) {
  switch (u.scalar_type()) {
    case at::kFloat: return mf::IOType::kFloat32;
    case at::kBFloat16: return mf::IOType::kBFloat16;
    case at::kHalf: return mf::IOType::kFloat16;
    default:
      TORCH_CHECK_TYPE(false, "monarch_fftconv: u must be float32, bfloat16 or float16, got ", u.scalar_type());
  }
}

// The precision names of monarch_fftconv.policy.PRECISIONS.
mf::Precision precision_of(c10::string_view name) {
  if (name == "fp32") return mf::Precision::kFP32;
  if (name == "tf32") return mf::Precision::kTF32;
  if (name == "bf16") return mf::Precision::kBF16;
  if (name == "fp16") return mf::Precision::kFP16;
  TORCH_CHECK_VALUE(false, "monarch_fftconv: unknown precision '", std::string(name), "'");
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The plan travels in the spectrum's shape, (C, n1/2 + 1, n2, 2): N = n1·n2 must be the
// planner's N = 2·next_pow2(L) and (n1, n2) a split the kernels are built for.
// u may have any batch and channel strides; a u that is not contiguous in time, and a
// spectrum or skip term that is not contiguous float32, are copied once (the kernels
// compute in fp32 whatever the caller's dtype).
at::Tensor conv_forward(const at::Tensor& u_in, const at::Tensor& spectrum_in,
                        const std::optional<at::Tensor>& skip_in, c10::string_view precision) {
  TORCH_CHECK_VALUE(u_in.dim() == 3, "monarch_fftconv: u must be (B, C, L), got ", u_in.sizes());
  const at::Tensor u = u_in.stride(2) == 1 ? u_in : u_in.contiguous();
  const at::Tensor spectrum = spectrum_in.to(at::kFloat).contiguous();
  const int64_t batch = u.size(0), channels = u.size(1), seq_len = u.size(2);
  TORCH_CHECK_VALUE(spectrum.dim() == 4 && spectrum.size(0) == channels && spectrum.size(1) >= 2 &&
                        spectrum.size(3) == 2,
                    "monarch_fftconv: the filter spectrum must be (C, n1/2+1, n2, 2) with C=", channels, ", got ",
                    spectrum.sizes());
  const int64_t n1 = 2 * (spectrum.size(1) - 1), n2 = spectrum.size(2), fft_size = n1 * n2;
  TORCH_CHECK_VALUE(is_pow2(fft_size) && fft_size / 4 < seq_len && seq_len <= fft_size / 2,
                    "monarch_fftconv: the spectrum's plan N=", fft_size, " (", n1, "x", n2,
                    ") does not fit L=", seq_len, " (N must be 2·next_pow2(L))");
  TORCH_CHECK_VALUE(mf::covers_split(static_cast<int>(n1), static_cast<int>(n2)),
                    "monarch_fftconv: no CUDA kernel for the split ", n1, "x", n2);
  TORCH_CHECK_VALUE(spectrum.device() == u.device(), "monarch_fftconv: u and the filter spectrum are on ", u.device(),
                    " and ", spectrum.device());
  const std::optional<at::Tensor> skip =
      skip_in ? std::optional(skip_in->to(at::kFloat).contiguous()) : std::nullopt;
  if (skip) {
    TORCH_CHECK_VALUE(skip->dim() == 1 && skip->size(0) == channels && skip->device() == u.device(),
                      "monarch_fftconv: the skip term D must be (C,) on u's device, got ", skip->sizes());
  }

  const c10::cuda::CUDAGuard guard(u.device());
  at::Tensor y = at::empty({batch, channels, seq_len}, u.options());
  if (y.numel() == 0) return y;

  mf::ConvForwardParams p{};
  p.u = u.data_ptr();
  p.u_batch_stride = u.stride(0);
  p.u_channel_stride = u.stride(1);
  p.filter_spectrum = spectrum.data_ptr<float>();
  p.skip = skip ? skip->data_ptr<float>() : nullptr;
  p.y = y.data_ptr();
  p.batch = batch;
  p.channels = channels;
  p.seq_len = seq_len;
  p.fft_size = static_cast<int>(fft_size);
  p.n1 = static_cast<int>(n1);
  p.n2 = static_cast<int>(n2);
  p.io_type = io_type_of(u);
  p.precision = precision_of(precision);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(u.device().index()).stream();
  const cudaError_t status = p.precision == mf::Precision::kFP32 ? mf::conv_forward_fp32(p, stream)
                                                                 : mf::conv_forward_tensor_core(p, stream);
  TORCH_CHECK(status == cudaSuccess, "monarch_fftconv: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

// (splits as a flat [n1, n2, n1, n2, ...] list, the io dtypes): what the kernels cover,
// for every precision.
std::tuple<std::vector<int64_t>, std::vector<std::string>> kernel_coverage() {
  std::vector<int64_t> splits;
#define MONARCH_FFTCONV_LIST(N1_, N2_) splits.insert(splits.end(), {N1_, N2_});
  MONARCH_FFTCONV_SPLITS(MONARCH_FFTCONV_LIST)
#undef MONARCH_FFTCONV_LIST
  return {splits, {"float32", "bfloat16", "float16"}};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(monarch_fftconv, m) {
  m.def("_kernel_coverage() -> (int[] splits, str[] io_dtypes)", &kernel_coverage);
}

TORCH_LIBRARY_IMPL(monarch_fftconv, CUDA, m) { m.impl("conv_forward", &conv_forward); }
