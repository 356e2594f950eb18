// The one translation unit that speaks to torch: it validates tensors, fills the torch-free
// ConvForwardParams of fftconv.h, and launches on the current stream. Per-op ATen headers
// and c10 CUDA headers only (no torch/all.h): keeps the JIT build fast.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>

#include "fftconv.h"

namespace mf = monarch_fftconv;

namespace {

mf::IOType io_type_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return mf::IOType::kFloat32;
    case at::kBFloat16: return mf::IOType::kBFloat16;
    case at::kHalf: return mf::IOType::kFloat16;
    default:
      TORCH_CHECK_TYPE(false, "monarch_fftconv: u must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

mf::Precision precision_of(int64_t code) {
  TORCH_CHECK_VALUE(code >= 0 && code <= 3, "monarch_fftconv: unknown precision code ", code);
  return static_cast<mf::Precision>(code);
}

// Shape-only params (null pointers): enough for the *_supports queries.
mf::ConvForwardParams shape_params(int64_t fft_size, int64_t n1, int64_t n2, int64_t precision, int64_t io_type,
                                   int64_t seq_len) {
  mf::ConvForwardParams p{};
  p.batch = 1;
  p.channels = 1;
  p.seq_len = seq_len;
  p.fft_size = static_cast<int>(fft_size);
  p.n1 = static_cast<int>(n1);
  p.n2 = static_cast<int>(n2);
  p.io_type = static_cast<mf::IOType>(io_type);
  p.precision = precision_of(precision);
  return p;
}

bool supports(const mf::ConvForwardParams& p) {
  return p.precision == mf::Precision::kFP32 ? mf::conv_forward_fp32_supports(p)
                                             : mf::conv_forward_tensor_core_supports(p);
}

bool supports_op(int64_t fft_size, int64_t n1, int64_t n2, int64_t precision, int64_t io_type, int64_t seq_len) {
  return supports(shape_params(fft_size, n1, n2, precision, io_type, seq_len));
}

at::Tensor conv_forward(const at::Tensor& u, const at::Tensor& spectrum, const std::optional<at::Tensor>& skip,
                        int64_t fft_size, int64_t n1, int64_t n2, int64_t precision) {
  TORCH_CHECK_VALUE(u.dim() == 3, "monarch_fftconv: u must be (B, C, L), got ", u.sizes());
  TORCH_CHECK_VALUE(u.stride(2) == 1, "monarch_fftconv: u must be contiguous along time");
  const int64_t batch = u.size(0), channels = u.size(1), seq_len = u.size(2);
  TORCH_CHECK_VALUE(batch > 0 && channels > 0 && seq_len > 0, "monarch_fftconv: empty input ", u.sizes());
  TORCH_CHECK_VALUE(2 * seq_len <= fft_size && n1 * n2 == fft_size, "monarch_fftconv: inconsistent plan: L=",
                    seq_len, " N=", fft_size, " n1=", n1, " n2=", n2);
  TORCH_CHECK_TYPE(spectrum.scalar_type() == at::kFloat, "monarch_fftconv: filter spectrum must be float32");
  TORCH_CHECK_VALUE(spectrum.is_contiguous() && spectrum.dim() == 4 && spectrum.size(0) == channels &&
                        spectrum.size(1) == n1 / 2 + 1 && spectrum.size(2) == n2 && spectrum.size(3) == 2,
                    "monarch_fftconv: filter spectrum must be contiguous (C, n1/2+1, n2, 2) = (", channels, ", ",
                    n1 / 2 + 1, ", ", n2, ", 2), got ", spectrum.sizes());
  TORCH_CHECK_VALUE(spectrum.device() == u.device(), "monarch_fftconv: u and the filter spectrum are on ",
                    u.device(), " and ", spectrum.device());
  if (skip) {
    TORCH_CHECK_VALUE(skip->scalar_type() == at::kFloat && skip->is_contiguous() && skip->dim() == 1 &&
                          skip->size(0) == channels && skip->device() == u.device(),
                      "monarch_fftconv: skip term D must be a contiguous float32 (C,) tensor on u's device");
  }

  const c10::cuda::CUDAGuard guard(u.device());
  at::Tensor y = at::empty({batch, channels, seq_len}, u.options());

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
  TORCH_CHECK_VALUE(supports(p), "monarch_fftconv: no CUDA kernel for N=", fft_size, " precision code ", precision,
                    " and dtype ", u.scalar_type());

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(u.device().index()).stream();
  const cudaError_t status = p.precision == mf::Precision::kFP32 ? mf::conv_forward_fp32(p, stream)
                                                                 : mf::conv_forward_tensor_core(p, stream);
  TORCH_CHECK(status == cudaSuccess, "monarch_fftconv: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace

TORCH_LIBRARY(monarch_fftconv_cuda, m) {
  m.def("conv_forward(Tensor u, Tensor filter_spectrum, Tensor? skip, int fft_size, int n1, int n2, int precision)"
        " -> Tensor");
  m.def("supports(int fft_size, int n1, int n2, int precision, int io_type, int seq_len) -> bool", &supports_op);
}

TORCH_LIBRARY_IMPL(monarch_fftconv_cuda, CUDA, m) { m.impl("conv_forward", &conv_forward); }
