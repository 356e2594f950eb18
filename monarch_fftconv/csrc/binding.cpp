// The one translation unit that speaks to torch. It registers the CUDA implementations of
// the `monarch_fftconv::*` ops (whose schemas, CPU implementations, fake kernels and
// autograd live in monarch_fftconv/ops.py), checks their tensors once, fills the torch-free
// parameter structs of fftconv.h and launches on the current stream. It also reports the
// kernels' coverage, which Python reads once when it loads this library.
//
// Per-op ATen headers, c10 CUDA and the autograd Function header only (no torch/all.h):
// keeps the JIT build fast. One Python class, DirectStepper, is bound through pybind11 (the
// library is also importable as a module for it): generation's per-token call, where the
// dispatcher's own cost is most of the work.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fftconv.h"

namespace mf = monarch_fftconv;

namespace {

// Error messages, built as one std::string with no std::ostream: every TORCH_CHECK here takes a
// string literal or message(...). Why: on the GPU image the JIT build's g++ (/opt/gcc) links
// libstdc++ into this library, and formatting a number through an ostream here ran the copy's
// ostream::_M_insert<long> with its own locale facet ids: every error with a number in its text
// (a shape, a length) killed the process with SIGSEGV instead of raising (found in session 20
// with a native backtrace; the strings-only env_switch errors raised). std::to_string and
// string appends use no locale, and a single string passes through c10::str untouched.
// tests/test_binding_messages.py holds every check in this file to that.
std::string text(const char* part) { return part; }
std::string text(const std::string& part) { return part; }
template <class Int, std::enable_if_t<std::is_integral_v<Int>, int> = 0>
std::string text(Int part) { return std::to_string(part); }
std::string text(at::ScalarType part) { return c10::toString(part); }
std::string text(const c10::Device& part) { return part.str(); }
std::string text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

template <class... Parts>
std::string message(const Parts&... parts) {
  return (std::string() + ... + text(parts));
}

mf::IOType io_type_of(const at::Tensor& u) {
  switch (u.scalar_type()) {
    case at::kFloat: return mf::IOType::kFloat32;
    case at::kBFloat16: return mf::IOType::kBFloat16;
    case at::kHalf: return mf::IOType::kFloat16;
    default:
      TORCH_CHECK_TYPE(false,
                       message("monarch_fftconv: u must be float32, bfloat16 or float16, got ", u.scalar_type()));
  }
}

// The precision names of monarch_fftconv.policy.PRECISIONS.
mf::Precision precision_of(c10::string_view name) {
  if (name == "fp32") return mf::Precision::kFP32;
  if (name == "tf32") return mf::Precision::kTF32;
  if (name == "bf16") return mf::Precision::kBF16;
  if (name == "fp16") return mf::Precision::kFP16;
  TORCH_CHECK_VALUE(false, message("monarch_fftconv: unknown precision '", std::string(name), "'"));
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// 2^q for 0 <= q < 63 (a fold level's block size), else 0. A loop, not a shift: this file has no
// `<<` at all (tests/test_binding_messages.py reads every one as a stream write).
int64_t power_of_two(int64_t q) {
  if (q < 0 || q >= 63) return 0;
  int64_t n = 1;
  for (int64_t level = 0; level < q; ++level) n *= 2;
  return n;
}

struct Split {
  int64_t n1, n2, fft_size;
};

// The plan travels in the spectrum's shape, (C, n1/2 + 1, n2, 2): N = n1·n2 must be the
// planner's N = 2·next_pow2(L) and (n1, n2) a split the kernels are built for: a radix split
// (N <= 32768), or the four-step (P, M) for longer sequences.
Split check_plan(const at::Tensor& u, const at::Tensor& spectrum) {
  const int64_t channels = u.size(1), seq_len = u.size(2);
  // One row per channel, or per group of channels (grouped filters: G rows, G dividing C).
  const bool rows_fit = spectrum.dim() == 4 && (spectrum.size(0) == channels ||
                                                (spectrum.size(0) > 0 && channels % spectrum.size(0) == 0));
  TORCH_CHECK_VALUE(rows_fit && spectrum.size(1) >= 2 && spectrum.size(3) == 2,
                    message("monarch_fftconv: the filter spectrum must be (G, n1/2+1, n2, 2) with G dividing C=",
                            channels, ", got ", spectrum.sizes()));
  const int64_t n1 = 2 * (spectrum.size(1) - 1), n2 = spectrum.size(2), fft_size = n1 * n2;
  TORCH_CHECK_VALUE(is_pow2(fft_size) && fft_size / 4 < seq_len && seq_len <= fft_size / 2,
                    message("monarch_fftconv: the spectrum's plan N=", fft_size, " (", n1, "x", n2,
                            ") does not fit L=", seq_len, " (N must be 2·next_pow2(L))"));
  if (fft_size >= mf::kFourStepMinSize) {
    TORCH_CHECK_VALUE(fft_size <= mf::kFourStepMaxSize && n2 == mf::fourstep_inner_size(fft_size),
                      message("monarch_fftconv: no CUDA kernel for the four-step split ", n1, "x", n2));
  } else {
    TORCH_CHECK_VALUE(mf::covers_radix_split(static_cast<int>(n1), static_cast<int>(n2)),
                      message("monarch_fftconv: no CUDA kernel for the split ", n1, "x", n2));
  }
  TORCH_CHECK_VALUE(spectrum.device() == u.device(),
                    message("monarch_fftconv: u and the filter spectrum are on ", u.device(), " and ",
                            spectrum.device()));
  return {n1, n2, fft_size};
}

// Channels per spectrum row: 1, or C / G for a grouped spectrum of G rows (check_plan has
// checked that G divides C).
int64_t channels_per_filter(const at::Tensor& u, const at::Tensor& spectrum) {
  return spectrum.size(0) > 0 && spectrum.size(0) < u.size(1) ? u.size(1) / spectrum.size(0) : 1;
}

// A grouped spectrum's rows repeated over their groups (a row per channel), as the kernels take
// it; a per-channel spectrum as it is.
at::Tensor per_channel_rows(const at::Tensor& spectrum, int64_t group_size) {
  return group_size > 1 ? spectrum.repeat_interleave(group_size, 0) : spectrum;
}

// The spectrum as a call's kernel reads it, and the row shift it reads it with
// (ConvForwardParams::filter_row_shift): the plain (ungated) fp32 radix kernels (radix_fp32) take
// a grouped bank as it is where its group size is a power of two, channel c reading row c >> shift
// (fp32/radix_pairs.cuh, filter_row; docs/design.md, "Groups in the ops"); every other kernel, and
// other group sizes, take it repeated to a row per channel.
std::pair<at::Tensor, int> kernel_rows(const at::Tensor& spectrum, int64_t group_size, bool radix_fp32) {
  if (group_size > 1 && radix_fp32 && is_pow2(group_size)) {
    int shift = 0;  // log2(group_size)
    for (int64_t channels = 1; channels < group_size; channels *= 2) ++shift;
    return {spectrum, shift};
  }
  return {per_channel_rows(spectrum, group_size), 0};
}

// u as the kernels take it: (B, C, L), contiguous in time (copied once if it is not).
at::Tensor time_contiguous(const at::Tensor& u) {
  TORCH_CHECK_VALUE(u.dim() == 3, message("monarch_fftconv: u must be (B, C, L), got ", u.sizes()));
  return u.stride(2) == 1 ? u : u.contiguous();
}

// The skip term D as the kernels take it: (C,) contiguous float32 on u's device.
std::optional<at::Tensor> skip_term(const std::optional<at::Tensor>& skip_in, const at::Tensor& u) {
  if (!skip_in) return std::nullopt;
  at::Tensor skip = skip_in->to(at::kFloat).contiguous();
  TORCH_CHECK_VALUE(skip.dim() == 1 && skip.size(0) == u.size(1) && skip.device() == u.device(),
                    message("monarch_fftconv: the skip term D must be (C,) on u's device, got ", skip.sizes()));
  return skip;
}

cudaStream_t current_stream(const at::Tensor& u) {
  return c10::cuda::getCurrentCUDAStream(u.device().index()).stream();
}

void check_launch(cudaError_t status) {
  TORCH_CHECK(status == cudaSuccess, message("monarch_fftconv: kernel launch failed: ", cudaGetErrorString(status)));
}

// ------------------------------------------------------------------ four-step (N > 32768)
// The caller holds a device guard for x's device over the allocation and the launch. The
// intermediate is (B·C, P/2+1, M) complex fp32: scratch, or the spectrum itself.
mf::FourStepParams fourstep_params(const at::Tensor& x, int64_t fft_size, at::Tensor& intermediate) {
  const int64_t inner = mf::fourstep_inner_size(fft_size), rows = mf::fourstep_rows(fft_size);
  intermediate = at::empty({x.size(0), x.size(1), rows, inner, 2}, x.options().dtype(at::kFloat));
  mf::FourStepParams p{};
  p.x = x.data_ptr();
  p.x_batch_stride = x.stride(0);
  p.x_channel_stride = x.stride(1);
  p.intermediate = intermediate.data_ptr<float>();
  p.batch = x.size(0);
  p.channels = x.size(1);
  p.seq_len = x.size(2);
  p.fft_size = static_cast<int>(fft_size);
  p.io_type = io_type_of(x);
  return p;
}

// A gate of the gated op: u's shape, dtype and device (the Python caller routes only such
// calls here), contiguous like y.
std::optional<at::Tensor> gate_term(const std::optional<at::Tensor>& gate, const at::Tensor& u, const char* name) {
  if (!gate) return std::nullopt;
  TORCH_CHECK_VALUE(gate->sizes() == u.sizes() && gate->scalar_type() == u.scalar_type() && gate->device() == u.device(),
                    message("monarch_fftconv: ", name, " must have u's shape ", u.sizes(), ", dtype ", u.scalar_type(),
                            " and device ", u.device(), ", got ", gate->sizes(), " ", gate->scalar_type(), " on ",
                            gate->device()));
  return gate->contiguous();
}

// A forward launch's tensors and plan (the precision, gates and switches are the caller's):
// u with its batch and channel strides, the per-channel float32 spectrum, y like u, contiguous.
mf::ConvForwardParams forward_params(const at::Tensor& u, const at::Tensor& spectrum,
                                     const std::optional<at::Tensor>& skip, at::Tensor& y, const Split& split) {
  mf::ConvForwardParams p{};
  p.u = u.data_ptr();
  p.u_batch_stride = u.stride(0);
  p.u_channel_stride = u.stride(1);
  p.filter_spectrum = spectrum.data_ptr<float>();
  p.skip = skip ? skip->data_ptr<float>() : nullptr;
  p.y = y.data_ptr();
  p.batch = u.size(0);
  p.channels = u.size(1);
  p.seq_len = u.size(2);
  p.fft_size = static_cast<int>(split.fft_size);
  p.n1 = static_cast<int>(split.n1);
  p.n2 = static_cast<int>(split.n2);
  p.io_type = io_type_of(u);
  return p;
}

// u may have any batch and channel strides; a u that is not contiguous in time, and a
// spectrum or skip term that is not contiguous float32, are copied once (the kernels
// compute in fp32 whatever the caller's dtype).
at::Tensor conv_forward_gated_z(const at::Tensor& u_in, const at::Tensor& spectrum_in,
                                const std::optional<at::Tensor>& skip_in, const std::optional<at::Tensor>& pregate_in,
                                const std::optional<at::Tensor>& postgate_in, c10::string_view precision,
                                at::Tensor* z_out, at::Tensor* u_spectrum_out = nullptr);

// The shape of u's kept four-step spectrum X at FFT size N: (B, C, P/2+1, M, 2) float32, the
// forward's output and the backward's input (fftconv_keeping_spectrum, fftconv_backward_from_spectrum).
std::vector<int64_t> kept_spectrum_sizes(const at::Tensor& u, int64_t fft_size) {
  return {u.size(0), u.size(1), mf::fourstep_rows(fft_size), mf::fourstep_inner_size(fft_size), 2};
}
bool forward_uniform_pairs_from_env();  // beside the other switches, below
mf::TensorCoreKernel tc_kernel_from_env();  // the same
void engine_switches_from_env(mf::ConvForwardParams& p);  // the same
bool fourstep_sum_in_grad_from_env();  // the same

at::Tensor conv_forward(const at::Tensor& u_in, const at::Tensor& spectrum_in,
                        const std::optional<at::Tensor>& skip_in, c10::string_view precision) {
  return conv_forward_gated_z(u_in, spectrum_in, skip_in, std::nullopt, std::nullopt, precision, nullptr);
}

// The op gated_conv_forward (inference): conv_forward_gated_z without z.
at::Tensor conv_forward_gated(const at::Tensor& u_in, const at::Tensor& spectrum_in,
                              const std::optional<at::Tensor>& skip_in, const std::optional<at::Tensor>& pregate_in,
                              const std::optional<at::Tensor>& postgate_in, c10::string_view precision) {
  return conv_forward_gated_z(u_in, spectrum_in, skip_in, pregate_in, postgate_in, precision, nullptr);
}

// y = postgate ⊙ (conv(x) + D·x), x = pregate ⊙ u (each gate optional): fused into the fp32
// radix kernel's load and store where that kernel runs the call; elsewhere (the tensor-core
// kernels, four-step) the gates are elementwise ATen ops around the conv. With z_out (the gated
// training step's forward), z = conv(x) + D·x before the postgate is also returned there: the
// fused kernel stores it beside y. With u_spectrum_out (fftconv_keeping_spectrum; no gates), u's
// four-step spectrum X, (B, C, P/2+1, M, 2) float32, as the inner kernel computed it; empty below
// N = 65536.
at::Tensor conv_forward_gated_z(const at::Tensor& u_in, const at::Tensor& spectrum_in,
                                const std::optional<at::Tensor>& skip_in, const std::optional<at::Tensor>& pregate_in,
                                const std::optional<at::Tensor>& postgate_in, c10::string_view precision,
                                at::Tensor* z_out, at::Tensor* u_spectrum_out) {
  const at::Tensor u = time_contiguous(u_in);
  at::Tensor spectrum = spectrum_in.to(at::kFloat).contiguous();
  const Split split = check_plan(u, spectrum);
  const std::optional<at::Tensor> skip = skip_term(skip_in, u);
  const std::optional<at::Tensor> pregate = gate_term(pregate_in, u, "pregate");
  const std::optional<at::Tensor> postgate = gate_term(postgate_in, u, "postgate");
  TORCH_CHECK(u_spectrum_out == nullptr || !(pregate || postgate || z_out),
              "monarch_fftconv: u's spectrum is kept for calls without gates only");
  // Splits no tensor-core kernel covers run the fp32-accurate kernel whatever the precision
  // asked for: more accurate than asked, and the only kernel there. (The name is checked first,
  // at every size.)
  const mf::Precision asked = precision_of(precision);
  const mf::Precision kernel_precision =
      mf::covers_split(static_cast<int>(split.n1), static_cast<int>(split.n2)) ? asked : mf::Precision::kFP32;
  // z (the training step's) is stored by the fp32-io kernel only (kGatedStoresZ)
  const bool radix = split.fft_size < mf::kFourStepMinSize && kernel_precision == mf::Precision::kFP32 &&
                     (z_out == nullptr || u.scalar_type() == at::kFloat);
  if ((pregate || postgate || z_out) && !radix) {  // the gates around the conv, as ATen ops
    const at::Tensor x = pregate ? u.mul(*pregate) : u;
    at::Tensor conv = conv_forward_gated_z(x, spectrum, skip, std::nullopt, std::nullopt, precision, nullptr);
    if (z_out != nullptr) {
      *z_out = conv;
      return postgate ? conv.mul(*postgate) : conv.clone();
    }
    return postgate ? conv.mul_(*postgate) : conv;
  }

  const c10::cuda::CUDAGuard guard(u.device());
  at::Tensor y = at::empty(u.sizes(), u.options());
  if (z_out != nullptr) *z_out = at::empty(u.sizes(), u.options());
  const bool fourstep = split.fft_size >= mf::kFourStepMinSize;
  if (u_spectrum_out != nullptr) {
    *u_spectrum_out = at::empty(fourstep ? kept_spectrum_sizes(u, split.fft_size) : std::vector<int64_t>{0},
                                u.options().dtype(at::kFloat));
  }
  if (y.numel() == 0) return y;

  // The plain fp32 radix instances (radix without gates or z; not the GATED ones: filter_row)
  // read grouped rows by shift.
  int row_shift = 0;
  std::tie(spectrum, row_shift) =
      kernel_rows(spectrum, channels_per_filter(u, spectrum), radix && !(pregate || postgate || z_out));
  mf::ConvForwardParams p = forward_params(u, spectrum, skip, y, split);
  p.filter_row_shift = row_shift;
  p.precision = kernel_precision;
  p.pregate = pregate ? pregate->data_ptr() : nullptr;
  p.postgate = postgate ? postgate->data_ptr() : nullptr;
  p.pre_postgate_out = z_out != nullptr ? z_out->data_ptr() : nullptr;
  if (fourstep) {  // fp32 for every precision
    at::Tensor intermediate;
    mf::FourStepParams f = fourstep_params(u, split.fft_size, intermediate);
    f.filter_spectrum = p.filter_spectrum;
    f.skip = p.skip;
    f.y = p.y;
    f.spectrum_out = u_spectrum_out != nullptr ? u_spectrum_out->data_ptr<float>() : nullptr;
    check_launch(mf::fourstep_conv(f, current_stream(u)));
    return y;
  }
  if (p.precision == mf::Precision::kFP32) {
    p.uniform_pairs = forward_uniform_pairs_from_env();
    check_launch(mf::conv_forward_fp32(p, current_stream(u)));
  } else {
    p.tc_kernel = tc_kernel_from_env();
    engine_switches_from_env(p);
    at::Tensor workspace;  // the engine's filter images, where the engine runs the call; stream-ordered
    if (const size_t bytes = mf::conv_forward_tensor_core_workspace_bytes(p); bytes > 0) {
      workspace = at::empty({static_cast<int64_t>(bytes)}, u.options().dtype(at::kByte));
      p.workspace = workspace.data_ptr();
    }
    check_launch(mf::conv_forward_tensor_core(p, current_stream(u)));
  }
  return y;
}

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// The planner's split of N (the kernels' lists, fftconv.h).
Split split_for(int64_t fft_size) {
#define MONARCH_FFTCONV_MATCH(N1_, N2_) \
  if (fft_size == N1_ * N2_) return {N1_, N2_, fft_size};
  MONARCH_FFTCONV_SPLITS(MONARCH_FFTCONV_MATCH)
  MONARCH_FFTCONV_RADIX_ONLY_SPLITS(MONARCH_FFTCONV_MATCH)
#undef MONARCH_FFTCONV_MATCH
  if (mf::kFourStepMinSize <= fft_size && fft_size <= mf::kFourStepMaxSize) {
    const int64_t inner = mf::fourstep_inner_size(fft_size);
    return {fft_size / inner, inner, fft_size};
  }
  TORCH_CHECK_VALUE(false, message("monarch_fftconv: no CUDA kernel for N=", fft_size));
}

// A one-sided filter as the radix spectrum kernel reads it: a contiguous bf16/fp16 k as it is
// (the kernel widens each tap as it loads it: the same values; the ATen cast it replaces cost
// 18-20 us a call at 16x256xL on an H100, session 25), anything else as a contiguous fp32 copy.
at::Tensor radix_readable_filter(const at::Tensor& k) {
  const bool half_k = k.scalar_type() == at::kBFloat16 || k.scalar_type() == at::kHalf;
  return half_k && k.is_contiguous() ? k : k.to(at::kFloat).contiguous();
}

// The radix spectrum kernel on k (contiguous: fp32, or one-sided bf16/fp16; C >= 1 rows: (C, Lk),
// or (C, 2, Lk) two-sided) into spectrum; with a source, a refresh (FilterSpectrumParams). The
// caller holds a device guard.
void launch_radix_spectrum(const at::Tensor& k, const at::Tensor& spectrum, float* source, const Split& split) {
  mf::FilterSpectrumParams p{};
  p.filter = k.data_ptr();
  p.filter_type = io_type_of(k);  // fp32, or a one-sided bf16/fp16 k (filter_spectrum)
  p.spectrum = spectrum.data_ptr<float>();
  p.source = source;
  p.channels = k.size(0);
  p.filter_len = k.size(-1);
  p.two_sided = k.dim() == 3;
  p.fft_size = static_cast<int>(split.fft_size);
  p.n1 = static_cast<int>(split.n1);
  p.n2 = static_cast<int>(split.n2);
  check_launch(mf::filter_spectrum_fp32(p, current_stream(k)));
}

// k's spectrum in the layout conv_forward takes, for sequences of length seq_len: one launch,
// fp32 for every precision.
at::Tensor filter_spectrum(const at::Tensor& k_in, int64_t seq_len, c10::string_view precision) {
  precision_of(precision);  // a known name; the spectrum is fp32 whatever it is
  TORCH_CHECK_VALUE(k_in.dim() == 2 && k_in.size(1) >= 1 && k_in.size(1) <= seq_len,
                    message("monarch_fftconv: the filter must be (C, Lk) with 1 <= Lk <= L=", seq_len, ", got ",
                            k_in.sizes()));
  const Split split = split_for(2 * next_pow2(seq_len));
  const at::Tensor k = split.fft_size < mf::kFourStepMinSize ? radix_readable_filter(k_in)
                                                              : k_in.to(at::kFloat).contiguous();
  const c10::cuda::CUDAGuard guard(k.device());
  if (split.fft_size >= mf::kFourStepMinSize) {  // k as one batch of C sequences; 1/N folded in
    at::Tensor spectrum;
    mf::FourStepParams p = fourstep_params(k.unsqueeze(0), split.fft_size, spectrum);
    p.spectrum_scale = 1.f / static_cast<float>(split.fft_size);
    if (k.size(0) > 0) check_launch(mf::fourstep_spectrum(p, current_stream(k)));
    return spectrum.squeeze(0);
  }
  at::Tensor spectrum = at::empty({k.size(0), split.n1 / 2 + 1, split.n2, 2}, k.options().dtype(at::kFloat));
  if (k.size(0) > 0) launch_radix_spectrum(k, spectrum, nullptr, split);
  return spectrum;
}

// A bidirectional filter bank's spectrum, K_fwd + conj(K_rev) (k: (C, 2, Lk)), in conv_forward's
// layout: one launch of the radix spectrum kernel on the two-sided circle. The four-step layout
// has no two-sided kernel: the two halves' spectra, the second conjugated and added (ATen).
at::Tensor filter_spectrum_two_sided(const at::Tensor& k_in, int64_t seq_len, c10::string_view precision) {
  precision_of(precision);  // a known name; the spectrum is fp32 whatever it is
  TORCH_CHECK_VALUE(k_in.dim() == 3 && k_in.size(1) == 2 && k_in.size(2) >= 1 && k_in.size(2) <= seq_len,
                    message("monarch_fftconv: a bidirectional filter must be (C, 2, Lk) with 1 <= Lk <= L=", seq_len,
                            ", got ", k_in.sizes()));
  const Split split = split_for(2 * next_pow2(seq_len));
  const at::Tensor k = k_in.to(at::kFloat).contiguous();
  const c10::cuda::CUDAGuard guard(k.device());
  if (split.fft_size >= mf::kFourStepMinSize) {
    at::Tensor spectrum = filter_spectrum(k.select(1, 0), seq_len, precision);
    const at::Tensor anti_causal = filter_spectrum(k.select(1, 1), seq_len, precision);
    spectrum.select(-1, 0).add_(anti_causal.select(-1, 0));
    spectrum.select(-1, 1).sub_(anti_causal.select(-1, 1));
    return spectrum;
  }
  at::Tensor spectrum = at::empty({k.size(0), split.n1 / 2 + 1, split.n2, 2}, k.options());
  if (k.size(0) > 0) launch_radix_spectrum(k, spectrum, nullptr, split);
  return spectrum;
}

// One generation step in one launch (generation.py's steps; ConvStepParams): writes x into
// inputs[:, :, i], with fold level 0's block into pending[:, :, i + 1], and with block_taps
// (G, n, n) a small level's block into pending[:, :, i+1 .. i+n]; returns y = pending[:, :, i] +
// first_tap·x, also stored in outputs[i] where outputs is given. i is the generated index in
// `index` (device memory: the graphed steps), or `position` (>= 0: a direct step, which also sets
// `index` to i + 1 and reads x where it lies, any strides).
template <typename T>
void launch_conv_step_as(const at::Tensor& x, const at::Tensor& inputs, const at::Tensor& pending,
                         const std::optional<at::Tensor>& outputs, const at::Tensor& y, const at::Tensor& first_tap,
                         const at::Tensor& second_tap, const at::Tensor& index, int64_t position, bool fold,
                         const std::optional<at::Tensor>& block_taps) {
  mf::ConvStepParams<T> p{};
  p.x = x.data_ptr<T>();
  p.x_batch_stride = x.stride(0);
  p.x_channel_stride = x.stride(1);
  p.inputs = inputs.data_ptr<T>();
  p.pending = pending.data_ptr<T>();
  p.outputs = outputs ? outputs->data_ptr<T>() : nullptr;
  p.y = y.data_ptr<T>();
  p.first_tap = first_tap.data_ptr<T>();
  p.second_tap = second_tap.data_ptr<T>();
  p.index = index.data_ptr<int64_t>();
  p.position = position;
  p.next_index = position >= 0 ? index.data_ptr<int64_t>() : nullptr;
  p.block_taps = block_taps ? block_taps->data_ptr<T>() : nullptr;
  p.batch = x.size(0);
  p.channels = x.size(1);
  p.to_generate = inputs.size(2);
  p.pending_len = pending.size(2);
  p.groups = block_taps ? block_taps->size(0) : 1;
  p.block_n = block_taps ? static_cast<int>(block_taps->size(1)) : 0;
  p.fold = fold;
  check_launch(mf::conv_step(p, current_stream(x)));
}

// launch_conv_step_as in the state's dtype (float32 or float64: every caller has checked it).
void launch_conv_step(const at::Tensor& x, const at::Tensor& inputs, const at::Tensor& pending,
                      const std::optional<at::Tensor>& outputs, const at::Tensor& y, const at::Tensor& first_tap,
                      const at::Tensor& second_tap, const at::Tensor& index, int64_t position, bool fold,
                      const std::optional<at::Tensor>& block_taps) {
  const auto launch = inputs.scalar_type() == at::kFloat ? &launch_conv_step_as<float> : &launch_conv_step_as<double>;
  launch(x, inputs, pending, outputs, y, first_tap, second_tap, index, position, fold, block_taps);
}

// Tensors read beside a generation state: contiguous, on its device, in its dtype.
void check_like_state(std::initializer_list<at::Tensor> tensors, const at::Tensor& inputs, const char* op) {
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK_VALUE(t.is_contiguous() && t.device() == inputs.device() && t.scalar_type() == inputs.scalar_type(),
                      message("monarch_fftconv: ", op, "'s tensors must be contiguous, on one device, in the "
                              "inputs' dtype"));
  }
}

// The generation state every step and block op reads (conv_step, conv_step_at, conv_block,
// DirectStepper): inputs (B, C, T) in float32 or float64, pending (B, C, >= T) and a one-element
// int64 index, contiguous and on inputs' device. One home for these checks; each op adds its own.
void check_generation_state(const at::Tensor& inputs, const at::Tensor& pending, const at::Tensor& index,
                            const char* op) {
  const auto dtype = inputs.scalar_type();
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kDouble,
                    message("monarch_fftconv: ", op, " computes in float32 or float64, got ", dtype));
  TORCH_CHECK_VALUE(inputs.dim() == 3 && pending.dim() == 3 && pending.size(0) == inputs.size(0) &&
                        pending.size(1) == inputs.size(1) && pending.size(2) >= inputs.size(2) &&
                        index.numel() == 1 && index.scalar_type() == at::kLong,
                    message("monarch_fftconv: ", op, " takes inputs (B, C, T), pending (B, C, >= T) and an int64 "
                            "index; got ", inputs.sizes(), ", ", pending.sizes(), ", ", index.sizes(), " ",
                            index.scalar_type()));
  TORCH_CHECK_VALUE(index.device() == inputs.device(),
                    message("monarch_fftconv: ", op, "'s index must be on inputs' device"));
  check_like_state({inputs, pending}, inputs, op);
}

// conv_step and conv_step_at: the checks, then the launch. position < 0: i from `index`, x
// contiguous; else i = position, x of any strides.
at::Tensor conv_step_checked(const at::Tensor& x, const at::Tensor& inputs, const at::Tensor& pending,
                             const std::optional<at::Tensor>& outputs, const at::Tensor& first_tap,
                             const at::Tensor& second_tap, const at::Tensor& index, int64_t position, bool fold,
                             const std::optional<at::Tensor>& block_taps, const char* op) {
  check_generation_state(inputs, pending, index, op);
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(0) == inputs.size(0) && x.size(1) == inputs.size(1) &&
                        x.scalar_type() == inputs.scalar_type() && x.device() == inputs.device() &&
                        first_tap.sizes() == at::IntArrayRef{x.size(1)} && second_tap.sizes() == first_tap.sizes(),
                    message("monarch_fftconv: ", op, " takes x (B, C) in inputs' dtype on inputs' device and taps "
                            "(C,); got x ", x.sizes(), " ", x.scalar_type(), " and inputs ", inputs.sizes(), " ",
                            inputs.scalar_type(), ", taps ", first_tap.sizes(), ", ", second_tap.sizes()));
  if (position >= 0) {
    TORCH_CHECK_VALUE(position < inputs.size(2), message("monarch_fftconv: ", op, "'s position must be in [0, ",
                                                         inputs.size(2), "), got ", position));
  } else {
    check_like_state({x}, inputs, op);  // read at [b, c] without strides
  }
  check_like_state({first_tap, second_tap}, inputs, op);
  if (outputs) {
    TORCH_CHECK_VALUE(outputs->dim() == 3 && outputs->size(0) == inputs.size(2) && outputs->size(1) == x.size(0) &&
                          outputs->size(2) == x.size(1),
                      message("monarch_fftconv: ", op, "'s outputs must be (T, B, C), got ", outputs->sizes()));
    check_like_state({*outputs}, inputs, op);
  }
  if (block_taps) {
    const bool cube = block_taps->dim() == 3;
    const int64_t n = cube ? block_taps->size(1) : 0, groups = cube ? block_taps->size(0) : 0;
    TORCH_CHECK_VALUE(n >= 1 && n <= mf::kConvStepMaxBlock && block_taps->size(2) == n && groups >= 1 &&
                          x.size(1) % groups == 0 && n <= pending.size(2),
                      message("monarch_fftconv: ", op, "'s block_taps must be (G, n, n) with 1 <= n <= ",
                              mf::kConvStepMaxBlock, " and G dividing C=", x.size(1), ", got ",
                              block_taps->sizes()));
    check_like_state({*block_taps}, inputs, op);
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({x.size(0), x.size(1)}, inputs.options());
  launch_conv_step(x, inputs, pending, outputs, y, first_tap, second_tap, index, position, fold, block_taps);
  return y;
}

at::Tensor conv_step(const at::Tensor& x, const at::Tensor& inputs, const at::Tensor& pending,
                     const std::optional<at::Tensor>& outputs, const at::Tensor& first_tap,
                     const at::Tensor& second_tap, const at::Tensor& index, bool fold,
                     const std::optional<at::Tensor>& block_taps) {
  return conv_step_checked(x, inputs, pending, outputs, first_tap, second_tap, index, -1, fold, block_taps,
                           "conv_step");
}

at::Tensor conv_step_at(const at::Tensor& x, const at::Tensor& inputs, const at::Tensor& pending,
                        const std::optional<at::Tensor>& outputs, const at::Tensor& first_tap,
                        const at::Tensor& second_tap, const at::Tensor& index, int64_t position, bool fold,
                        const std::optional<at::Tensor>& block_taps) {
  TORCH_CHECK_VALUE(position >= 0, message("monarch_fftconv: conv_step_at's position must be >= 0, got ", position));
  return conv_step_checked(x, inputs, pending, outputs, first_tap, second_tap, index, position, fold, block_taps,
                           "conv_step_at");
}

// A middle fold level's block: pending[:, :, i+1 .. i+n] += the direct Toeplitz product of the
// last n inputs (inputs[:, :, i+1-n .. i]) with the group's taps k[1 .. 2n-1] (taps (G, >= 2n)),
// i the generated index in `index` (device memory), n a power of two in [kConvBlockMinBlock,
// kConvBlockMaxBlock].
template <typename T>
void launch_conv_block_as(const at::Tensor& inputs, const at::Tensor& pending, const at::Tensor& taps,
                          const at::Tensor& index, int64_t n, int64_t position) {
  mf::ConvBlockParams<T> p{};
  p.inputs = inputs.data_ptr<T>();
  p.pending = pending.data_ptr<T>();
  p.taps = taps.data_ptr<T>();
  p.index = index.data_ptr<int64_t>();
  p.position = position;
  p.batch = inputs.size(0);
  p.channels = inputs.size(1);
  p.to_generate = inputs.size(2);
  p.pending_len = pending.size(2);
  p.groups = taps.size(0);
  p.taps_len = taps.size(1);
  p.block_n = static_cast<int>(n);
  check_launch(mf::conv_block(p, current_stream(inputs)));
}

// launch_conv_block_as in the state's dtype (float32 or float64: every caller has checked it);
// position < 0: i from `index`.
void launch_conv_block(const at::Tensor& inputs, const at::Tensor& pending, const at::Tensor& taps,
                       const at::Tensor& index, int64_t n, int64_t position = -1) {
  const auto launch = inputs.scalar_type() == at::kFloat ? &launch_conv_block_as<float> : &launch_conv_block_as<double>;
  launch(inputs, pending, taps, index, n, position);
}

void conv_block(const at::Tensor& inputs, const at::Tensor& pending, const at::Tensor& taps, const at::Tensor& index,
                int64_t n) {
  check_generation_state(inputs, pending, index, "conv_block");
  TORCH_CHECK_VALUE(n >= mf::kConvBlockMinBlock && n <= mf::kConvBlockMaxBlock && (n & (n - 1)) == 0,
                    message("monarch_fftconv: conv_block's n must be a power of two in [", mf::kConvBlockMinBlock,
                            ", ", mf::kConvBlockMaxBlock, "], got ", n));
  TORCH_CHECK_VALUE(taps.dim() == 2 && taps.size(0) >= 1 && inputs.size(1) % taps.size(0) == 0 &&
                        taps.size(1) >= 2 * n,
                    message("monarch_fftconv: conv_block takes taps (G, >= 2n) with G dividing C=", inputs.size(1),
                            "; got ", taps.sizes(), ", n = ", n));
  check_like_state({taps}, inputs, "conv_block");
  const c10::cuda::CUDAGuard guard(inputs.device());
  launch_conv_block(inputs, pending, taps, index, n);
}

// ------------------------------------------------------------------ DirectStepper
// FFTConv.step's direct tokens without the dispatcher (generation.DIRECT_STEPPER). Session 25 (an
// H200 host): of a direct token's 18.5 us of host time the conv_step_at op took 9.0, its schema's
// parsing and dispatch more than the launch, and the step's Python checks ~5. A stepper is made
// once at prefill with the state's tensors (checked then, as conv_step_at checks them each call);
// a token is then one Python call: the cheap checks, the fold level, one launch of the step
// kernel, y_t as the view outputs[i] (the kernel writes y there, once); for a middle level (the
// conv_block kernel) the step kernel and conv_block at the host's position, the two kernels of the
// level's graph in their order without the copy of x_t or a graph launch (session 27, H100, B16
// C1024 L65536: a middle token 0.051-0.059 -> 0.038-0.043 ms against the graphs launched from
// here). It serves the plain case only and returns None for
// anything else (not a tensor, another shape, dtype or device, the stream full, the filter
// replaced or written, an inference state outside inference mode, an FFT level): generation.py's
// path then takes the token, with its checks, its one home for every error message, and its
// cuFFT plan check.
class DirectStepper {
 public:
  DirectStepper(at::Tensor inputs, at::Tensor pending, at::Tensor outputs, at::Tensor first_tap, at::Tensor second_tap,
                at::Tensor index, std::vector<at::Tensor> toeplitz, int64_t prompt_len, at::Tensor filter,
                std::optional<at::Tensor> middle_taps, std::vector<int64_t> middle_levels)
      : inputs_(std::move(inputs)), pending_(std::move(pending)), outputs_(std::move(outputs)),
        first_tap_(std::move(first_tap)), second_tap_(std::move(second_tap)), index_(std::move(index)),
        toeplitz_(std::move(toeplitz)), filter_(std::move(filter)), middle_taps_(std::move(middle_taps)),
        prompt_len_(prompt_len) {
    const auto dtype = inputs_.scalar_type();
    check_generation_state(inputs_, pending_, index_, "DirectStepper");
    // (No Toeplitz block at all is a state of one token: its one step folds nothing.)
    TORCH_CHECK_VALUE(inputs_.is_cuda() && prompt_len_ >= 0,
                      message("monarch_fftconv: DirectStepper takes a CUDA state and a prompt length >= 0; got "
                              "inputs on ", inputs_.device(), ", prompt length ", prompt_len_));
    const int64_t batch = inputs_.size(0), channels = inputs_.size(1), to_generate = inputs_.size(2);
    TORCH_CHECK_VALUE(outputs_.dim() == 3 && outputs_.size(0) == to_generate && outputs_.size(1) == batch &&
                          outputs_.size(2) == channels && first_tap_.sizes() == at::IntArrayRef{channels} &&
                          second_tap_.sizes() == first_tap_.sizes(),
                      message("monarch_fftconv: DirectStepper takes outputs (T, B, C) and taps (C,) for inputs (B, "
                              "C, T); got ", outputs_.sizes(), ", ", first_tap_.sizes(), ", ", second_tap_.sizes(),
                              " for ", inputs_.sizes()));
    check_like_state({outputs_, first_tap_, second_tap_}, inputs_, "DirectStepper");
    int64_t n = 1;  // level q's block: n = 2^q
    for (size_t q = 0; q < toeplitz_.size(); ++q, n *= 2) {
      const at::Tensor& block = toeplitz_[q];
      TORCH_CHECK_VALUE(n <= mf::kConvStepMaxBlock && block.dim() == 3 && block.size(1) == n && block.size(2) == n &&
                            block.size(0) >= 1 && channels % block.size(0) == 0,
                        message("monarch_fftconv: DirectStepper's Toeplitz block of level ", q, " must be (G, ", n,
                                ", ", n, ") with G dividing C=", channels, " and n <= ", mf::kConvStepMaxBlock,
                                "; got ", block.sizes()));
      check_like_state({block}, inputs_, "DirectStepper");
    }
    for (const int64_t q : middle_levels) {
      const int64_t n = power_of_two(q);
      TORCH_CHECK_VALUE(middle_taps_ && q >= 1 && n >= mf::kConvBlockMinBlock && n <= mf::kConvBlockMaxBlock &&
                            middle_taps_->dim() == 2 && middle_taps_->size(1) >= 2 * n &&
                            middle_taps_->size(0) >= 1 && channels % middle_taps_->size(0) == 0 &&
                            middle_taps_->is_contiguous() && middle_taps_->device() == inputs_.device() &&
                            middle_taps_->scalar_type() == dtype,
                        message("monarch_fftconv: DirectStepper's middle level ", q, " needs taps (G, >= 2n) with n "
                                "in [", mf::kConvBlockMinBlock, ", ", mf::kConvBlockMaxBlock, "] in the inputs' dtype"));
      if (q >= static_cast<int64_t>(middle_.size())) middle_.resize(q + 1, false);
      middle_[q] = true;
    }
    filter_is_inference_ = filter_.is_inference();
    filter_version_ = filter_is_inference_ ? 0 : filter_._version();
    filter_data_ = filter_.data_ptr();
    filter_dtype_ = filter_.scalar_type();
    filter_sizes_ = filter_.sizes().vec();
    filter_strides_ = filter_.strides().vec();
  }

  // y_t (a view of outputs[i]) for the token x_t at `position`, with `filter` the layer's filter
  // as it is now; or None: generation.py takes the token.
  py::object step(py::handle x_object, int64_t position, py::handle filter_object) const {
    // A plain tensor whose memory holds its values, outside any dispatch mode: subclasses (their
    // __torch_function__), wrappers (functorch's, fake and functional tensors), lazy negation or
    // conjugation, zero tensors and a TorchDispatchMode take the Python path, whose op resolves
    // them as the dispatcher does.
    if (!THPVariable_CheckExact(x_object.ptr()) || !THPVariable_Check(filter_object.ptr()) ||
        c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
      return py::none();
    }
    const at::Tensor& x = THPVariable_Unpack(x_object.ptr());
    if (!x.has_storage() || x.layout() != at::kStrided || x.is_neg() || x.is_conj() || x._is_zerotensor() ||
        x.key_set().has(c10::DispatchKey::Functionalize)) {
      return py::none();
    }
    const int64_t i = position - prompt_len_, to_generate = inputs_.size(2);
    if (i < 0 || i >= to_generate || !filter_unchanged(THPVariable_Unpack(filter_object.ptr())) || x.dim() != 2 ||
        x.size(0) != inputs_.size(0) || x.size(1) != inputs_.size(1) || x.scalar_type() != inputs_.scalar_type() ||
        x.device() != inputs_.device() || (inputs_.is_inference() && !c10::InferenceMode::is_enabled())) {
      return py::none();
    }
    // The fold after step i is level q = log2 of the largest power of two dividing i + 1 (none,
    // -1, after the last step). Levels below the Toeplitz blocks' count are the step kernel's
    // alone; a middle level is the step kernel and conv_block; an FFT level is _replay's.
    const int q = i + 1 < to_generate ? __builtin_ctzll(static_cast<unsigned long long>(i + 1)) : -1;
    const bool alone = q < static_cast<int>(toeplitz_.size());
    const bool middle = !alone && q < static_cast<int>(middle_.size()) && middle_[q];
    if (!alone && !middle) return py::none();  // an FFT level: _replay's, with its plan check
    const c10::cuda::CUDAGuard guard(inputs_.device());
    if (middle && capturing()) return py::none();  // the Python path replays the level's graph: refused then
    at::Tensor y = outputs_.select(0, i);  // the kernel writes y there, once
    if (alone) {
      launch_step(x, y, i, q == 0, q > 0 ? std::optional<at::Tensor>(toeplitz_[q]) : std::nullopt);
    } else {
      // The level's graph's two kernels in its order (the same arithmetic: the same bits).
      launch_step(x, y, i, false, std::nullopt);
      launch_block(power_of_two(q), i);
    }
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
  }

 private:
  // The step kernel at host position i: x read where it lies, y into outputs[i] (given as y),
  // the device index left at i + 1.
  void launch_step(const at::Tensor& x, const at::Tensor& y, int64_t i, bool fold,
                   const std::optional<at::Tensor>& block) const {
    launch_conv_step(x, inputs_, pending_, std::nullopt, y, first_tap_, second_tap_, index_, i, fold, block);
  }

  // Whether the current stream is being captured into a graph (the Python path replays a middle
  // level's graph through CUDAGraph.replay, which refuses then: so does the stepper).
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t error = cudaStreamIsCapturing(current_stream(inputs_), &status);
    TORCH_CHECK(error == cudaSuccess, message("monarch_fftconv: cudaStreamIsCapturing failed: ", cudaGetErrorString(error)));
    return status != cudaStreamCaptureStatusNone;
  }

  // A middle level's block (n = 2^q) at host position i.
  void launch_block(int64_t n, int64_t i) const {
    launch_conv_block(inputs_, pending_, *middle_taps_, index_, n, i);
  }

  // generation._Watch's check: the same tensor, its values where they were (a `.data`
  // assignment or a dtype conversion keeps the TensorImpl but moves them), and (where it keeps
  // one) the same version.
  bool filter_unchanged(const at::Tensor& filter) const {
    return filter.unsafeGetTensorImpl() == filter_.unsafeGetTensorImpl() && filter.data_ptr() == filter_data_ &&
           filter.scalar_type() == filter_dtype_ && filter.sizes() == filter_sizes_ &&
           filter.strides() == filter_strides_ && (filter_is_inference_ || filter._version() == filter_version_);
  }

  at::Tensor inputs_, pending_, outputs_, first_tap_, second_tap_, index_;
  std::vector<at::Tensor> toeplitz_;  // level q's (G, 2^q, 2^q) block: the levels the kernel folds alone
  at::Tensor filter_;
  std::optional<at::Tensor> middle_taps_;  // (G, >= 2n): the middle levels' taps (ConvState.middle_taps)
  std::vector<bool> middle_;            // level q is a middle level (conv_step, then conv_block)
  int64_t prompt_len_;
  bool filter_is_inference_ = false;
  int64_t filter_version_ = 0;
  const void* filter_data_ = nullptr;  // where the filter's values were at prefill
  at::ScalarType filter_dtype_ = at::kFloat;
  std::vector<int64_t> filter_sizes_, filter_strides_;
};

// A cached spectrum brought up to date with k, in place and in one launch, with no host
// sync: the rows whose filter differs from `source` (the fp32 filter, or a half filter's
// widened values, they were computed from)
// are recomputed and source takes their values. The radix layout only (N <= 32768): the
// four-step spectrum has no refresh, its callers do not cache.
void refresh_filter_spectrum(const at::Tensor& k_in, const at::Tensor& source, const at::Tensor& spectrum,
                             int64_t seq_len, c10::string_view precision) {
  precision_of(precision);  // a known name; the spectrum is fp32 whatever it is
  TORCH_CHECK_VALUE(k_in.dim() == 2 && k_in.size(1) >= 1 && k_in.size(1) <= seq_len,
                    message("monarch_fftconv: the filter must be (C, Lk) with 1 <= Lk <= L=", seq_len, ", got ",
                            k_in.sizes()));
  const Split split = split_for(2 * next_pow2(seq_len));
  TORCH_CHECK_VALUE(split.fft_size < mf::kFourStepMinSize,
                    message("monarch_fftconv: no spectrum refresh at N=", split.fft_size));
  const at::Tensor k = radix_readable_filter(k_in);  // a half filter compared and transformed widened
  const auto is = [&](const at::Tensor& t, at::IntArrayRef shape) {
    return t.scalar_type() == at::kFloat && t.is_contiguous() && t.device() == k.device() && t.sizes() == shape;
  };
  TORCH_CHECK_VALUE(is(source, k.sizes()) && is(spectrum, {k.size(0), split.n1 / 2 + 1, split.n2, 2}),
                    message("monarch_fftconv: a refresh takes a contiguous float32 source of the filter's shape ",
                            k.sizes(), " and spectrum of the plan's, on its device; got ", source.sizes(), " and ",
                            spectrum.sizes()));
  const c10::cuda::CUDAGuard guard(k.device());
  if (k.size(0) > 0) launch_radix_spectrum(k, spectrum, source.data_ptr<float>(), split);
}

// The fused gated training step's forward (ops.gated_fftconv): (y, z, the spectrum), y =
// postgate ⊙ z, z = conv(x) + D·x, x = pregate ⊙ u; z (saved by the autograd for dpostgate =
// dy ⊙ z) only with a postgate, else empty. Two launches where the fp32 kernel runs the call
// (its GATED instance stores z beside y), ATen gates around the conv elsewhere.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_fftconv(const at::Tensor& u, const at::Tensor& k,
                                                             const std::optional<at::Tensor>& skip,
                                                             const std::optional<at::Tensor>& pregate,
                                                             const std::optional<at::Tensor>& postgate,
                                                             c10::string_view precision) {
  TORCH_CHECK_VALUE(u.dim() == 3, message("monarch_fftconv: u must be (B, C, L), got ", u.sizes()));
  at::Tensor spectrum = filter_spectrum(k, u.size(2), precision);
  at::Tensor z;
  at::Tensor y = conv_forward_gated_z(u, spectrum, skip, pregate, postgate, precision, postgate ? &z : nullptr);
  if (!postgate) z = at::empty({0}, u.options());
  return {y, z, spectrum};
}

// (y, the spectrum it used): the whole forward in two launches, no Python on the way.
std::tuple<at::Tensor, at::Tensor> fftconv(const at::Tensor& u, const at::Tensor& k,
                                           const std::optional<at::Tensor>& skip, c10::string_view precision) {
  TORCH_CHECK_VALUE(u.dim() == 3, message("monarch_fftconv: u must be (B, C, L), got ", u.sizes()));
  at::Tensor spectrum = filter_spectrum(k, u.size(2), precision);
  return {conv_forward(u, spectrum, skip, precision), spectrum};
}

// (y, S, X): fftconv's (y, S) and, at the four-step sizes, u's spectrum X as the forward's inner
// kernel computed it, (B, C, P/2+1, M, 2) float32, for fftconv_backward_from_spectrum (which then
// skips two of its launches); below N = 65536, X is empty. The autograd calls it under
// MONARCH_FFTCONV_KEEP_SPECTRUM=1, holding X from the forward to the backward.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fftconv_keeping_spectrum(const at::Tensor& u, const at::Tensor& k,
                                                                        const std::optional<at::Tensor>& skip,
                                                                        c10::string_view precision) {
  TORCH_CHECK_VALUE(u.dim() == 3, message("monarch_fftconv: u must be (B, C, L), got ", u.sizes()));
  at::Tensor spectrum = filter_spectrum(k, u.size(2), precision);
  at::Tensor u_spectrum;
  at::Tensor y = conv_forward_gated_z(u, spectrum, skip, std::nullopt, std::nullopt, precision, nullptr, &u_spectrum);
  return {y, spectrum, u_spectrum};
}

// The tensors and shape of a backward call, into either backward's parameter struct
// (ConvBackwardParams, FourStepBackwardParams: the same field names).
template <class BackwardParams>
void fill_backward(BackwardParams& p, const at::Tensor& grad, const at::Tensor& u, const at::Tensor& spectrum,
                   const std::optional<at::Tensor>& skip, at::Tensor& du, at::Tensor& dk) {
  p.u = u.data_ptr();
  p.u_batch_stride = u.stride(0);
  p.u_channel_stride = u.stride(1);
  p.grad = grad.data_ptr();
  p.filter_spectrum = spectrum.data_ptr<float>();
  p.skip = skip ? skip->data_ptr<float>() : nullptr;
  p.grad_u = du.data_ptr();
  p.grad_filter = dk.data_ptr<float>();
  p.batch = u.size(0);
  p.channels = u.size(1);
  p.seq_len = u.size(2);
  p.filter_len = dk.size(-1);  // dk (C, Lk), or (C, 2, Lk) two-sided
  p.io_type = io_type_of(u);
}

// The four-step backward into du and dk (eight launches, two intermediates in one
// workspace); dD = Σ_{b,t} u·dy in fp32, by ATen (deterministic).
void fourstep_backward(const at::Tensor& grad, const at::Tensor& u, const at::Tensor& spectrum,
                       const std::optional<at::Tensor>& skip, int64_t fft_size, at::Tensor& du, at::Tensor& dk,
                       at::Tensor& dskip, const at::Tensor* u_spectrum = nullptr) {
  mf::FourStepBackwardParams p{};
  fill_backward(p, grad, u, spectrum, skip, du, dk);
  p.fft_size = static_cast<int>(fft_size);
  p.u_spectrum = u_spectrum != nullptr ? u_spectrum->data_ptr<float>() : nullptr;
  p.sum_in_grad = fourstep_sum_in_grad_from_env() && mf::fourstep_backward_sums_in_grad(p);  // decided once
  const size_t workspace_bytes = mf::fourstep_backward_workspace_bytes(p);
  TORCH_CHECK(workspace_bytes > 0, message("monarch_fftconv: no four-step backward for N=", p.fft_size));
  const at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, u.options().dtype(at::kByte));
  p.workspace = workspace.data_ptr();
  check_launch(mf::fourstep_backward(p, current_stream(u)));
  if (skip) dskip.copy_(u.to(at::kFloat).mul(grad.to(at::kFloat)).sum(at::IntArrayRef{0, 2}));
}

// A two-way setting read from the environment at each call: unset or `usual` gives false, `other`
// true; any other value is a ValueError naming both.
bool env_switch(const char* name, const char* usual, const char* other) {
  const char* value = std::getenv(name);
  const std::string choice = value == nullptr ? "" : value;
  if (choice.empty() || choice == usual) return false;
  if (choice == other) return true;
  TORCH_CHECK_VALUE(false,
                    message("monarch_fftconv: ", name, " must be '", usual, "' or '", other, "', got '", choice, "'"));
}

// Where the fused backward keeps its per-channel sums (mf::GradAccumulator), from
// MONARCH_FFTCONV_GRAD_ACCUMULATOR, read at each call: unset or "auto" (on chip where it fits),
// "global" (the scratch route, for the side-by-side benchmark). Read once per call, so the
// workspace query and the launch see the same route.
mf::GradAccumulator grad_accumulator_from_env() {
  return env_switch("MONARCH_FFTCONV_GRAD_ACCUMULATOR", "auto", "global") ? mf::GradAccumulator::kGlobal
                                                                           : mf::GradAccumulator::kAuto;
}

// Whether the fused backward's pair sweeps run thread 0 in the other threads' code path
// (ConvBackwardParams::uniform_pairs), from MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS, read at each
// call: unset or "1" (the default since session 20: the grad kernel measured 1.22-1.28x faster,
// same bits), "0" (thread 0's own path, for side-by-side benchmarks).
bool grad_uniform_pairs_from_env() { return !env_switch("MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS", "1", "0"); }

// Whether the fp32 forward kernel's mid pass runs thread 0 in the other threads' code path
// (ConvForwardParams::uniform_pairs: the same bits), from MONARCH_FFTCONV_FWD_UNIFORM_PAIRS, read
// at each call that runs that kernel: unset or "1" (the uniform sweep, the default since session
// 23: the forward kernel measured 1.06-1.15x faster on an H100, same bits), "0" (thread 0's own
// path, for side-by-side benchmarks).
bool forward_uniform_pairs_from_env() { return !env_switch("MONARCH_FFTCONV_FWD_UNIFORM_PAIRS", "1", "0"); }

// Whether the backward splits where its fused grad kernel keeps its sums in a global scratch
// (N = 32768, gated or not; ConvBackwardParams::filter_grad_only), from
// MONARCH_FFTCONV_GRAD_SPLIT, read at each call: unset or "1" (the default since session 33: the
// filter sums alone in the grad kernel, du by the forward kernel on dy with the conjugated
// spectrum, 1.42x faster training steps on an H200; docs/performance.md, "Session 33"), "0" (the
// one fused grad kernel, for side-by-side benchmarks). The same arithmetic in another order: not
// the same bits.
bool grad_split_from_env() { return !env_switch("MONARCH_FFTCONV_GRAD_SPLIT", "1", "0"); }

// Whether a training step's forward keeps u's spectrum for its backward at the four-step sizes
// (fftconv_keeping_spectrum, fftconv_backward_from_spectrum), from MONARCH_FFTCONV_KEEP_SPECTRUM,
// read at each forward that records a graph: unset or "0" (recomputed in the backward), "1"
// (kept: two launches fewer per backward, and (P/2+1)·M complex fp32 per sequence held from the
// forward to the backward, 2.25-2.5x u in fp32; docs/design.md). The same bits either way.
bool keep_spectrum_from_env() { return env_switch("MONARCH_FFTCONV_KEEP_SPECTRUM", "0", "1"); }

// Whether the four-step backward sums the filter gradient over the batch in its grad kernel
// (FourStepBackwardParams::sum_in_grad: no batch_sum launch, no B·C rows of products; where the
// call has (c, k2) rows for two waves of the kernel), from MONARCH_FFTCONV_FOURSTEP_SUM_IN_GRAD,
// read at each backward call: unset or "1" (the default since session 35: the step 0.8-2.3%
// faster on an H100 at 8x256x65536 and 4x256x131072, the same bits; docs/performance.md,
// "Session 35"), "0" (the products by B·C rows and batch_sum, for side-by-side benchmarks).
bool fourstep_sum_in_grad_from_env() { return !env_switch("MONARCH_FFTCONV_FOURSTEP_SUM_IN_GRAD", "1", "0"); }

// The tensor-core kernel a 128 x 128 call takes (ConvForwardParams::tc_kernel), from
// MONARCH_FFTCONV_TC_KERNEL, read at each tensor-core call: unset (the route), "engine" or "mma";
// any other value is refused, before a launch, so that a misspelt name fails instead of running
// the mma.sync kernel.
mf::TensorCoreKernel tc_kernel_from_env() {
  const char* value = std::getenv("MONARCH_FFTCONV_TC_KERNEL");
  const std::string choice = value == nullptr ? "" : value;
  if (choice.empty()) return mf::TensorCoreKernel::kRoute;
  if (choice == "engine") return mf::TensorCoreKernel::kEngine;
  TORCH_CHECK_VALUE(choice == "mma",
                    message("monarch_fftconv: MONARCH_FFTCONV_TC_KERNEL must be 'engine' or 'mma' or unset, got '",
                            choice, "'"));
  return mf::TensorCoreKernel::kMma;
}

// The tensor-core engine's fixed-cost switches (ConvForwardParams::engine_*), read at each
// tensor-core call (other kernels ignore them), each one's default first:
//   MONARCH_FFTCONV_ENGINE_TABLES: "angles" (the DFT tables from their 128 distinct angles) or
//     "elements" (one sincospi per element, as first written; the same bits);
//   MONARCH_FFTCONV_ENGINE_EARLY_FILTER_RELEASE: "0" or "1" (the filter released after its
//     channel's last job's hand-off, not at the next channel's first job; the same bits);
//   MONARCH_FFTCONV_ENGINE_PDL: "0" or "1" (programmatic dependent launch; the same bits).
void engine_switches_from_env(mf::ConvForwardParams& p) {
  p.engine_tables_per_element = env_switch("MONARCH_FFTCONV_ENGINE_TABLES", "angles", "elements");
  p.engine_early_filter_release = env_switch("MONARCH_FFTCONV_ENGINE_EARLY_FILTER_RELEASE", "0", "1");
  p.engine_pdl = env_switch("MONARCH_FFTCONV_ENGINE_PDL", "0", "1");
}

// (du in u's dtype, dk float32 (C, filter_len) or, two-sided, (C, 2, filter_len) with lag -s in
// dk[c][1][s], dD float32 (C,) or empty): the fused fp32 backward, for every precision
// (gradients in fp32 arithmetic are within every budget).
// With gates (the gated training step: gated_fftconv_backward has checked them, a causal fp32-io
// call on the radix kernels), the gated grad kernel: du = pregate ⊙ dx and *dpregate = u ⊙ dx,
// and *dpostgate = dy ⊙ z where z is given (with a postgate).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_impl(const at::Tensor& grad_in, const at::Tensor& u_in,
                                                             const at::Tensor& spectrum_in,
                                                             const std::optional<at::Tensor>& skip_in,
                                                             int64_t filter_len, c10::string_view precision,
                                                             bool two_sided,
                                                             const std::optional<at::Tensor>& pregate = std::nullopt,
                                                             const std::optional<at::Tensor>& postgate = std::nullopt,
                                                             at::Tensor* dpregate = nullptr,
                                                             const at::Tensor* u_spectrum = nullptr,
                                                             const std::optional<at::Tensor>& postgate_z = std::nullopt,
                                                             at::Tensor* dpostgate = nullptr) {
  precision_of(precision);  // a known name; the arithmetic is fp32 whatever it is
  const mf::GradAccumulator accumulator = grad_accumulator_from_env();  // checked on every route
  const bool uniform_pairs = grad_uniform_pairs_from_env();
  const bool split_asked = grad_split_from_env();
  const at::Tensor u = time_contiguous(u_in);
  const at::Tensor spectrum = spectrum_in.to(at::kFloat).contiguous();
  const Split split = check_plan(u, spectrum);
  const std::optional<at::Tensor> skip = skip_term(skip_in, u);
  TORCH_CHECK_VALUE(grad_in.sizes() == u.sizes() && grad_in.device() == u.device(),
                    message("monarch_fftconv: the gradient must be ", u.sizes(), " on ", u.device(), ", got ",
                            grad_in.sizes()));
  const int64_t batch = u.size(0), channels = u.size(1), seq_len = u.size(2);
  TORCH_CHECK_VALUE(1 <= filter_len && filter_len <= seq_len,
                    message("monarch_fftconv: filter_len must be in [1, ", seq_len, "], got ", filter_len));
  const at::Tensor grad = grad_in.to(u.scalar_type()).contiguous();

  const c10::cuda::CUDAGuard guard(u.device());
  const auto fp32 = u.options().dtype(at::kFloat);
  const int64_t rows = spectrum.size(0), group_size = channels_per_filter(u, spectrum);
  at::Tensor du = at::empty(u.sizes(), u.options());
  at::Tensor dk = two_sided ? at::empty({rows, 2, filter_len}, fp32) : at::empty({rows, filter_len}, fp32);
  at::Tensor dskip = at::empty({skip ? channels : 0}, fp32);
  if (dpregate != nullptr) *dpregate = pregate ? at::empty(u.sizes(), u.options()) : at::empty({0}, u.options());
  if (dpostgate != nullptr) *dpostgate = postgate_z ? at::empty(u.sizes(), u.options()) : at::empty({0}, u.options());
  if (batch == 0) {  // sums over no sequences
    dk.zero_();
    dskip.zero_();
    return {du, dk, dskip};
  }

  // A grouped spectrum: the radix grad kernel reads its G rows by shift where C/G is a power of
  // two, every other kernel a repeat (kernel_rows); the kernels write the channels' filter
  // gradients into a per-channel buffer, summed into dk's G rows at the end in channel order
  // (deterministic); ungrouped, they write dk itself.
  const bool gated = pregate || postgate;  // the GATED grad and forward instances take a row per channel
  const auto [kernel_spectrum, row_shift] =
      kernel_rows(spectrum, group_size, split.fft_size < mf::kFourStepMinSize && !gated);
  at::Tensor dk_channels = group_size == 1 ? dk
                           : two_sided     ? at::empty({channels, 2, filter_len}, fp32)
                                           : at::empty({channels, filter_len}, fp32);
  const auto group_sum = [&] {
    if (group_size > 1) dk.copy_(dk_channels.view({rows, group_size, -1}).sum(1).view(dk.sizes()));
  };
  if (split.fft_size >= mf::kFourStepMinSize) {
    if (!two_sided) {
      fourstep_backward(grad, u, kernel_spectrum, skip, split.fft_size, du, dk_channels, dskip, u_spectrum);
    } else {
      // The four-step kernels store the causal lags only, into a contiguous (C, Lk): the
      // negative ones are the causal lags of the time-reversed dy and u, a second backward
      // whose du is discarded.
      at::Tensor dk_causal = at::empty({channels, filter_len}, fp32), dk_anti = at::empty({channels, filter_len}, fp32);
      at::Tensor du_unused = at::empty(u.sizes(), u.options()), no_skip = at::empty({0}, fp32);
      fourstep_backward(grad, u, kernel_spectrum, skip, split.fft_size, du, dk_causal, dskip);
      fourstep_backward(grad.flip(-1).contiguous(), u.flip(-1).contiguous(), kernel_spectrum, std::nullopt,
                        split.fft_size, du_unused, dk_anti, no_skip);
      dk_channels.select(1, 0).copy_(dk_causal);
      dk_channels.select(1, 1).copy_(dk_anti);
    }
    group_sum();
    return {du, dk, dskip};
  }

  mf::ConvBackwardParams p{};
  fill_backward(p, grad, u, kernel_spectrum, skip, du, dk_channels);
  p.filter_row_shift = row_shift;
  p.grad_skip = skip ? dskip.data_ptr<float>() : nullptr;
  p.fft_size = static_cast<int>(split.fft_size);
  p.n1 = static_cast<int>(split.n1);
  p.n2 = static_cast<int>(split.n2);
  p.accumulator = accumulator;
  p.uniform_pairs = uniform_pairs;
  p.two_sided = two_sided;
  p.pregate = pregate ? pregate->data_ptr() : nullptr;
  p.postgate = postgate ? postgate->data_ptr() : nullptr;
  p.grad_pregate = pregate && dpregate != nullptr ? dpregate->data_ptr() : nullptr;
  if (postgate_z && dpostgate != nullptr) {  // dy, as the kernel reads it (grad: u's dtype, contiguous)
    p.postgate_z = postgate_z->data_ptr();
    p.grad_postgate = dpostgate->data_ptr();
  }
  // The split backward where it is asked for and the kernels have it (their answer: a workspace
  // size; N = 32768): the grad kernel's filter sums alone, then du = the correlation of dy with
  // k' by the forward kernel, on the conjugated spectrum (the skip term folds in the same).
  p.filter_grad_only = split_asked;
  size_t workspace_bytes = mf::conv_backward_fp32_workspace_bytes(p);
  if (p.filter_grad_only && workspace_bytes == 0) {
    p.filter_grad_only = false;
    workspace_bytes = mf::conv_backward_fp32_workspace_bytes(p);
  }
  TORCH_CHECK(workspace_bytes > 0, "monarch_fftconv: no backward kernel for this call");
  // from the caching allocator, on this stream: freed when the kernels are done with it
  at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, u.options().dtype(at::kByte));
  p.workspace = workspace.data_ptr();
  check_launch(mf::conv_backward_fp32(p, current_stream(u)));
  if (p.filter_grad_only) {  // du into its own buffer: the fused kernel's peak memory + the conjugated copy
    workspace.reset();  // stream-ordered: its block may serve the copy below
    const at::Tensor conjugated = at::view_as_real(at::view_as_complex(kernel_spectrum).conj_physical());  // one pass
    mf::ConvForwardParams f = forward_params(grad, conjugated, skip, du, split);
    f.filter_row_shift = row_shift;
    f.precision = mf::Precision::kFP32;
    f.uniform_pairs = forward_uniform_pairs_from_env();
    // Gated: the forward's load gate is the postgate, dx = corr(postgate ⊙ dy, k'). With a
    // pregate its store gate is u, so y = u ⊙ dx = dpregate and z = dx lands in du, then
    // du = pregate ⊙ dx in place: no buffer beyond the fused kernel's.
    f.pregate = p.postgate;
    at::Tensor u_rows;  // u as the forward's gate: contiguous (B, C, L)
    if (p.pregate != nullptr) {
      u_rows = u.contiguous();
      f.postgate = u_rows.data_ptr();
      f.y = dpregate->data_ptr();
      f.pre_postgate_out = du.data_ptr();
    }
    check_launch(mf::conv_forward_fp32(f, current_stream(u)));
    if (p.pregate != nullptr) du.mul_(*pregate);
  }
  group_sum();
  return {du, dk, dskip};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fftconv_backward(const at::Tensor& grad, const at::Tensor& u,
                                                                const at::Tensor& spectrum,
                                                                const std::optional<at::Tensor>& skip,
                                                                int64_t filter_len, c10::string_view precision) {
  return backward_impl(grad, u, spectrum, skip, filter_len, precision, false);
}

// fftconv_backward given u's spectrum as fftconv_keeping_spectrum returned it: the same
// (du, dk, dD), bit for bit, without recomputing it (the four-step sizes; below, u_spectrum is
// empty and the call is fftconv_backward's). u_spectrum is read, not written.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fftconv_backward_from_spectrum(
    const at::Tensor& grad, const at::Tensor& u, const at::Tensor& u_spectrum, const at::Tensor& spectrum,
    const std::optional<at::Tensor>& skip, int64_t filter_len, c10::string_view precision) {
  TORCH_CHECK_VALUE(u.dim() == 3, message("monarch_fftconv: u must be (B, C, L), got ", u.sizes()));
  const Split split = check_plan(u, spectrum);
  if (split.fft_size < mf::kFourStepMinSize) {
    TORCH_CHECK_VALUE(u_spectrum.numel() == 0,
                      message("monarch_fftconv: u_spectrum must be empty below N=", mf::kFourStepMinSize, " (N=",
                              split.fft_size, "), got ", u_spectrum.sizes()));
    return backward_impl(grad, u, spectrum, skip, filter_len, precision, false);
  }
  const std::vector<int64_t> expected = kept_spectrum_sizes(u, split.fft_size);
  TORCH_CHECK_VALUE(u_spectrum.sizes() == at::IntArrayRef(expected) && u_spectrum.scalar_type() == at::kFloat &&
                        u_spectrum.is_contiguous() && u_spectrum.device() == u.device(),
                    message("monarch_fftconv: u_spectrum must be contiguous float32 ", at::IntArrayRef(expected),
                            " on ", u.device(), " (fftconv_keeping_spectrum's), got ", u_spectrum.sizes(), " ",
                            u_spectrum.scalar_type(), " on ", u_spectrum.device()));
  return backward_impl(grad, u, spectrum, skip, filter_len, precision, false, std::nullopt, std::nullopt, nullptr,
                       &u_spectrum);
}

// The fused gated training step's backward (ops.gated_fftconv_backward): (du, dk, dD, dpregate,
// dpostgate), dpregate empty without a pregate, dpostgate = dy ⊙ z empty without z (given only
// with a postgate; the autograd's multiply then). Causal calls of fp32 io on the radix kernels
// (N <= 32768) run the gated grad kernel (the gates in its loads and store, dpostgate from its
// own read of dy); every other call, or one without gates, the ungated backward with ATen gates
// around it: x = pregate ⊙ u, dz = postgate ⊙ dy, then du = pregate ⊙ dx, dpregate = u ⊙ dx,
// dpostgate = dy ⊙ z.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_fftconv_backward(
    const at::Tensor& grad_in, const at::Tensor& u_in, const at::Tensor& spectrum,
    const std::optional<at::Tensor>& skip, const std::optional<at::Tensor>& pregate_in,
    const std::optional<at::Tensor>& postgate_in, int64_t filter_len, c10::string_view precision,
    const std::optional<at::Tensor>& z_in) {
  TORCH_CHECK_VALUE(u_in.dim() == 3, message("monarch_fftconv: u must be (B, C, L), got ", u_in.sizes()));
  const at::Tensor u = time_contiguous(u_in);
  const std::optional<at::Tensor> pregate = gate_term(pregate_in, u, "pregate");
  const std::optional<at::Tensor> postgate = gate_term(postgate_in, u, "postgate");
  const std::optional<at::Tensor> z = gate_term(z_in, u, "z");
  TORCH_CHECK_VALUE(!z || postgate, "monarch_fftconv: z (for dpostgate) is given only with a postgate");
  TORCH_CHECK_VALUE(grad_in.sizes() == u.sizes() && grad_in.device() == u.device(),
                    message("monarch_fftconv: the gradient must be ", u.sizes(), " on ", u.device(), ", got ",
                            grad_in.sizes()));
  const Split split = check_plan(u, spectrum);
  const bool fused = (pregate || postgate) && split.fft_size < mf::kFourStepMinSize && u.scalar_type() == at::kFloat;
  if (fused) {
    at::Tensor dpregate, dpostgate;
    auto [du, dk, dskip] = backward_impl(grad_in, u, spectrum, skip, filter_len, precision, false, pregate, postgate,
                                         &dpregate, nullptr, z, &dpostgate);
    return {du, dk, dskip, dpregate, dpostgate};
  }
  const at::Tensor grad = grad_in.to(u.scalar_type());
  const at::Tensor x = pregate ? u.mul(*pregate) : u;
  const at::Tensor dz = postgate ? grad.mul(*postgate) : grad;
  auto [dx, dk, dskip] = backward_impl(dz, x, spectrum, skip, filter_len, precision, false);
  at::Tensor dpostgate = z ? grad.mul(*z) : at::empty({0}, u.options());
  if (!pregate) return {dx, dk, dskip, at::empty({0}, u.options()), dpostgate};
  return {dx.mul(*pregate), dk, dskip, dx.mul(u), dpostgate};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fftconv_backward_two_sided(
    const at::Tensor& grad, const at::Tensor& u, const at::Tensor& spectrum, const std::optional<at::Tensor>& skip,
    int64_t filter_len, c10::string_view precision) {
  return backward_impl(grad, u, spectrum, skip, filter_len, precision, true);
}

// ------------------------------------------------------------------ autograd on CUDA
// The same autograd as ops.py registers in Python (which serves the CPU), in C++ for CUDA
// tensors (AutogradCUDA takes precedence over the Python Autograd kernel): a training step
// then runs no Python between the op call and the kernels, forward or backward. Both
// directions go through the dispatcher below autograd, so torch.compile's fake tensors
// reach the fake kernels.
bool needs_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
bool needs_grad(const std::optional<at::Tensor>& t) { return t && needs_grad(*t); }

template <class... Inputs>
void refuse_gradients(const char* op, const Inputs&... inputs) {
  TORCH_CHECK(!at::GradMode::is_enabled() || !(needs_grad(inputs) || ...),
              message("monarch_fftconv::", op,
                      " is not differentiable (fftconv is; double backward is not supported)"));
}

// The op `name`'s kernel below autograd, through the dispatcher (torch.compile's fake tensors
// take their fake kernels there).
template <class Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FftconvFunction : public torch::autograd::Function<FftconvFunction> {
 public:
  // keep: u's spectrum is kept for the backward (fftconv_autograd decides, where grad mode is the caller's)
  static variable_list forward(AutogradContext* ctx, const at::Tensor& u, const at::Tensor& k,
                               const std::optional<at::Tensor>& skip, c10::string_view precision, bool keep) {
    static const auto op = op_handle<std::tuple<at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view)>(
        "monarch_fftconv::fftconv");
    static const auto keeping_op = op_handle<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view)>(
        "monarch_fftconv::fftconv_keeping_spectrum");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor y, spectrum, u_spectrum;  // u_spectrum: undefined unless kept (empty below N = 65536)
    if (keep) std::tie(y, spectrum, u_spectrum) = keeping_op.call(u, k, skip, precision);
    else std::tie(y, spectrum) = op.call(u, k, skip, precision);
    ctx->mark_non_differentiable({spectrum});
    ctx->set_materialize_grads(false);  // no zero-filled spectrum-sized gradient per backward
    ctx->save_for_backward({u, spectrum, skip ? *skip : at::Tensor(), u_spectrum});
    ctx->saved_data["filter_len"] = k.sym_size(1);  // symbolic under torch.compile(dynamic=True)
    ctx->saved_data["filter_dtype"] = static_cast<int64_t>(k.scalar_type());
    ctx->saved_data["precision"] = std::string(precision);
    return {y, spectrum};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = op_handle<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::SymInt,
        c10::string_view)>("monarch_fftconv::fftconv_backward");
    static const auto from_spectrum_op = op_handle<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
        c10::SymInt, c10::string_view)>("monarch_fftconv::fftconv_backward_from_spectrum");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &u = saved[0], &spectrum = saved[1], &skip = saved[2], &u_spectrum = saved[3];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const std::string precision = ctx->saved_data["precision"].toStringRef();
    // Below autograd: the backward op has no derivative, and its Python autograd shim costs
    // tens of µs per step. A double backward (create_graph) is refused instead.
    refuse_gradients("fftconv_backward", grads[0], u, skip);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const std::optional<at::Tensor> skip_given = skip.defined() ? std::optional(skip) : std::nullopt;
    const c10::SymInt filter_len = ctx->saved_data["filter_len"].toSymInt();
    auto [du, dk, dskip] =
        u_spectrum.defined() ? from_spectrum_op.call(grads[0], u, u_spectrum, spectrum, skip_given, filter_len, precision)
                             : op.call(grads[0], u, spectrum, skip_given, filter_len, precision);
    const auto filter_dtype = static_cast<at::ScalarType>(ctx->saved_data["filter_dtype"].toInt());
    // needs_input_grad counts tensor inputs only: the skip term is input 2 when it is given.
    return {ctx->needs_input_grad(0) ? du.to(u.scalar_type()) : at::Tensor(),
            ctx->needs_input_grad(1) ? dk.to(filter_dtype) : at::Tensor(),
            skip.defined() && ctx->needs_input_grad(2) ? dskip.to(skip.scalar_type()) : at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// conv_forward has no derivative formula (the module's inference path): on CUDA a C++ kernel
// at the autograd key refuses inputs that need a gradient and otherwise redispatches below
// autograd, skipping the Python shim torch.library installs for it (tens of µs per call).
// The ops with an int argument keep the shim: under torch.compile(dynamic=True) the int may
// be symbolic, which a C++ kernel taking int64_t cannot receive.
at::Tensor conv_forward_autograd(const at::Tensor& u, const at::Tensor& spectrum, const std::optional<at::Tensor>& skip,
                                 c10::string_view precision) {
  static const auto op = op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                              c10::string_view)>("monarch_fftconv::conv_forward");
  refuse_gradients("conv_forward", u, spectrum, skip);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(u, spectrum, skip, precision);
}

// The gated inference call (gated_conv_forward) and the gated training step's forward
// (gated_fftconv, called inside functional.py's autograd Function, where grad mode is off): the
// same refusal and redispatch, so a gated call, like a plain one, runs no Python at the autograd key.
at::Tensor gated_conv_forward_autograd(const at::Tensor& u, const at::Tensor& spectrum,
                                       const std::optional<at::Tensor>& skip, const std::optional<at::Tensor>& pregate,
                                       const std::optional<at::Tensor>& postgate, c10::string_view precision) {
  static const auto op =
      op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                           const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view)>(
          "monarch_fftconv::gated_conv_forward");
  refuse_gradients("gated_conv_forward", u, spectrum, skip, pregate, postgate);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(u, spectrum, skip, pregate, postgate, precision);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_fftconv_autograd(
    const at::Tensor& u, const at::Tensor& k, const std::optional<at::Tensor>& skip,
    const std::optional<at::Tensor>& pregate, const std::optional<at::Tensor>& postgate, c10::string_view precision) {
  static const auto op = op_handle<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&, c10::string_view)>("monarch_fftconv::gated_fftconv");
  refuse_gradients("gated_fftconv", u, k, skip, pregate, postgate);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(u, k, skip, pregate, postgate, precision);
}

// refresh_filter_spectrum (inference_cache's call on CUDA, once a forward): no derivative, and
// the mutable op's autograd fallback cost twice conv_forward's host time (21 µs, session 36's
// profile). This kernel refuses written buffers that need a gradient (k may: the refresh records
// nothing, as the CPU's reference does), redispatches below autograd and ADInplaceOrView, and
// bumps the two buffers' versions as the skipped ADInplaceOrView step would. seq_len is never
// symbolic here: compiled graphs do not take the cache. Under inference_mode the autograd keys
// are off and the CUDA kernel is called directly.
void refresh_filter_spectrum_autograd(const at::Tensor& k, const at::Tensor& source, const at::Tensor& spectrum,
                                      int64_t seq_len, c10::string_view precision) {
  static const auto op = op_handle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::SymInt,
                                        c10::string_view)>("monarch_fftconv::refresh_filter_spectrum");
  refuse_gradients("refresh_filter_spectrum", source, spectrum);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.call(k, source, spectrum, c10::SymInt(seq_len), precision);
  }
  torch::autograd::impl::bump_version(source);
  torch::autograd::impl::bump_version(spectrum);
}

std::tuple<at::Tensor, at::Tensor> fftconv_autograd(const at::Tensor& u, const at::Tensor& k,
                                                    const std::optional<at::Tensor>& skip,
                                                    c10::string_view precision) {
  // Only for a backward to come (apply runs the forward under no_grad too, and in it grad mode is off).
  const bool keep = at::GradMode::is_enabled() && (needs_grad(u) || needs_grad(k) || needs_grad(skip)) &&
                    keep_spectrum_from_env();
  const variable_list out = FftconvFunction::apply(u, k, skip, precision, keep);
  return {out[0], out[1]};
}

// (splits every kernel covers, splits only the fp32 radix kernels cover, each as a flat
// [n1, n2, n1, n2, ...] list; the four-step kernels' [N, inner size M, N, M, ...]; the io
// dtypes): what the kernels cover.
std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<std::string>>
kernel_coverage() {
  std::vector<int64_t> splits, radix_only;
#define MONARCH_FFTCONV_LIST(N1_, N2_) splits.insert(splits.end(), {N1_, N2_});
  MONARCH_FFTCONV_SPLITS(MONARCH_FFTCONV_LIST)
#undef MONARCH_FFTCONV_LIST
#define MONARCH_FFTCONV_LIST(N1_, N2_) radix_only.insert(radix_only.end(), {N1_, N2_});
  MONARCH_FFTCONV_RADIX_ONLY_SPLITS(MONARCH_FFTCONV_LIST)
#undef MONARCH_FFTCONV_LIST
  std::vector<int64_t> fourstep;
  for (int64_t n = mf::kFourStepMinSize; n <= mf::kFourStepMaxSize; n *= 2) fourstep.insert(fourstep.end(), {n, mf::fourstep_inner_size(n)});
  return {splits, radix_only, fourstep, {"float32", "bfloat16", "float16"}};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(monarch_fftconv, m) {
  m.def("_kernel_coverage() -> (int[] splits, int[] radix_only_splits, int[] fourstep, str[] io_dtypes)",
        &kernel_coverage);
}

TORCH_LIBRARY_IMPL(monarch_fftconv, CUDA, m) {
  m.impl("filter_spectrum", &filter_spectrum);
  m.impl("filter_spectrum_two_sided", &filter_spectrum_two_sided);
  m.impl("conv_step", &conv_step);
  m.impl("conv_step_at", &conv_step_at);
  m.impl("conv_block", &conv_block);
  m.impl("refresh_filter_spectrum", &refresh_filter_spectrum);
  m.impl("conv_forward", &conv_forward);
  m.impl("gated_conv_forward", &conv_forward_gated);
  m.impl("fftconv", &fftconv);
  m.impl("fftconv_backward", &fftconv_backward);
  m.impl("fftconv_keeping_spectrum", &fftconv_keeping_spectrum);
  m.impl("fftconv_backward_from_spectrum", &fftconv_backward_from_spectrum);
  m.impl("fftconv_backward_two_sided", &fftconv_backward_two_sided);
  m.impl("gated_fftconv", &gated_fftconv);
  m.impl("gated_fftconv_backward", &gated_fftconv_backward);
}

TORCH_LIBRARY_IMPL(monarch_fftconv, AutogradCUDA, m) {
  m.impl("fftconv", &fftconv_autograd);
  m.impl("conv_forward", &conv_forward_autograd);
  m.impl("gated_conv_forward", &gated_conv_forward_autograd);
  m.impl("gated_fftconv", &gated_fftconv_autograd);
  m.impl("refresh_filter_spectrum", &refresh_filter_spectrum_autograd);
}

// The library as a Python module (generation.py imports it for this class; the ops above need no
// import). TORCH_EXTENSION_NAME: the JIT build's name, or `_C` for the ahead-of-time one.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  // DirectStepper's constructor and step signatures: generation.py asks for this value, so that a
  // build with other signatures (an older ahead-of-time one) is not called.
  module.attr("DIRECT_STEPPER_ABI") = 3;
  py::class_<DirectStepper>(module, "DirectStepper", py::module_local())
      .def(py::init<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>,
                    int64_t, at::Tensor, std::optional<at::Tensor>, std::vector<int64_t>>(),
           py::arg("inputs"), py::arg("pending"), py::arg("outputs"), py::arg("first_tap"), py::arg("second_tap"),
           py::arg("index"), py::arg("toeplitz"), py::arg("prompt_len"), py::arg("filter"), py::arg("middle_taps"),
           py::arg("middle_levels"))
      .def("step", &DirectStepper::step, py::arg("x_t"), py::arg("position"), py::arg("filter"));
}
