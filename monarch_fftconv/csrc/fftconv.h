// monarch_fftconv: the torch-free contract between the binding (binding.cpp)
// and the CUDA kernels. Nothing here may include a torch header: kernel
// translation units compile ~10x faster without them.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace monarch_fftconv {

// Matmul operand precision. Accumulation is always fp32.
enum class Precision : int { kFP32 = 0, kTF32 = 1, kBF16 = 2, kFP16 = 3 };

// Element type of u and y in device memory.
enum class IOType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Where the fp32 backward keeps a channel's running sums Σ_b conj(U_b)·DY_b (and the parked
// spectrum X_u) across its batch loop. kAuto: on chip wherever they fit in shared memory (one
// CTA per SM, N <= 16384), else in a global scratch (the sums through L2; at N = 32768 one
// CTA of 512 threads per SM, elsewhere two of 256).
// kGlobal forces the scratch route: the measured baseline, kept for the side-by-side benchmark.
enum class GradAccumulator : int { kAuto = 0, kGlobal = 1 };

// Which tensor-core kernel runs the 128 x 128 split (tc/dispatch.cu). kRoute: the engine for
// calls of its minimum sequence count or more where it applies, the mma.sync kernel otherwise;
// kEngine: the engine wherever it applies; kMma: the mma.sync kernel. The binding sets it from
// MONARCH_FFTCONV_TC_KERNEL (unset, "engine", "mma"; it refuses any other value).
enum class TensorCoreKernel : int { kRoute = 0, kEngine = 1, kMma = 2 };

// One causal convolution y = u * k (+ skip·u) over (batch, channels, seq_len).
//
// Monarch plan: fft_size N = 2·next_pow2(seq_len) = n1·n2 (n1 >= n2, powers of
// two, each <= 128). The filter spectrum is given in the Monarch (digit-
// reversed) order and only for the Hermitian half of the rows:
//   filter_spectrum[c][k1][k2] (complex, interleaved re,im as float2),
//   k1 in [0, n1/2], k2 in [0, n2), contiguous, shape (channels, n1/2+1, n2, 2),
//   = FFT_N(zero-padded k_c)[k1 + n1·k2] / N      (the 1/N is folded in).
// See docs/design.md for the derivation.
struct ConvForwardParams {
  const void* u;                  // element (b, c, t) at u[b·u_batch_stride + c·u_channel_stride + t]
  int64_t u_batch_stride;         // in elements
  int64_t u_channel_stride;       // in elements; the time stride is 1
  const float* filter_spectrum;   // (channels >> filter_row_shift, n1/2+1, n2, 2), see above
  const float* skip;              // (channels,) or nullptr: y += skip[c]·u
  void* y;                        // (batch, channels, seq_len), contiguous, io_type
  int64_t batch;
  int64_t channels;
  int64_t seq_len;                // 1 <= seq_len <= fft_size / 2
  int fft_size;                   // N
  int n1;                         // stage-1 (column) DFT size
  int n2;                         // stage-2 (row) DFT size
  IOType io_type;
  Precision precision;
  // Hyena's gates, fused into the fp32 kernel's load and store (y = postgate ⊙ conv(pregate ⊙ u)):
  // (batch, channels, seq_len), contiguous, io_type, or nullptr. Other kernels refuse them.
  const void* pregate;
  const void* postgate;
  // The fused gated training step's forward (functional.py, backends.FUSED_GATED_TRAINING):
  // z = conv(x) + D·x, before the postgate, stored here too (autograd saves it for
  // dpostgate = dy ⊙ z). (batch, channels, seq_len), contiguous, io_type, or nullptr. The fp32
  // kernel only, with the gates (its GATED instance).
  void* pre_postgate_out;
  // The fp32 kernel's mid-pass frequency pairs without thread 0's own code path (the same bits;
  // the default, MONARCH_FFTCONV_FWD_UNIFORM_PAIRS=0 turns it off). Other kernels ignore it.
  bool uniform_pairs;
  // The tensor-core kernel of a 128 x 128 call (TensorCoreKernel). Other kernels ignore it.
  TensorCoreKernel tc_kernel;
  // The tensor-core engine's fixed-cost switches (tc/engine_*.cuh; the binding reads them from
  // the environment, MONARCH_FFTCONV_ENGINE_*). Zero is each one's default. Other kernels ignore them.
  //   engine_tables_per_element: the DFT tables from one double sincospi per element (16,384),
  //     as first written, instead of one per distinct angle (128; the same bits: the default).
  //   engine_early_filter_release: the consumers release the resident filter in its channel's
  //     last job (after the hand-off) instead of at the next channel's first job (same bits).
  //   engine_pdl: launched with programmatic dependent launch, so that its prologue (tables,
  //     barriers) overlaps the tail of the kernel before it (same bits).
  bool engine_tables_per_element;
  bool engine_early_filter_release;
  bool engine_pdl;
  // conv_forward_tensor_core_workspace_bytes() bytes, 16-byte aligned, where that is not 0 (the
  // engine's filter images); otherwise unread.
  void* workspace;
  // Channel c reads spectrum row c >> filter_row_shift: 0, a row per channel; s > 0, a grouped
  // bank of G = channels >> s rows, 2^s channels a row. The ungated fp32 radix kernels only
  // (forward and grad; the gated instances refuse s > 0); every other kernel takes a row per
  // channel (0). Last: the engine takes these params as its kernel argument, laid out as before.
  int filter_row_shift;
};

// The gradients of one conv_forward call from dy = dL/dy, in fp32 arithmetic whatever the
// forward's precision (the fp32-accurate radix kernels):
//   grad_u      = correlation of dy with k' (k' = k with the skip term D added at lag 0)
//   grad_filter = Σ_b correlation of dy_b with u_b, lags 0 .. filter_len-1
//   grad_skip   = grad_filter[:, 0] (the lag-0 correlation Σ_{b,t} dy·u)
// u, the filter spectrum, the skip term and the plan are those of the forward call.
struct ConvBackwardParams {
  const void* u;                  // as in ConvForwardParams
  int64_t u_batch_stride;
  int64_t u_channel_stride;
  const void* grad;               // dy: (batch, channels, seq_len), contiguous, io_type
  const float* filter_spectrum;   // the forward's (not conjugated), layout as in ConvForwardParams
  const float* skip;              // (channels,) or nullptr
  void* grad_u;                   // (batch, channels, seq_len), contiguous, io_type
  float* grad_filter;             // (channels, filter_len), contiguous; (channels, 2, filter_len) if two_sided
  float* grad_skip;               // (channels,) or nullptr
  void* workspace;                // conv_backward_fp32_workspace_bytes() bytes, 16-byte aligned
  int64_t batch;
  int64_t channels;
  int64_t seq_len;
  int64_t filter_len;             // 1 <= filter_len <= seq_len
  int fft_size;
  int n1;
  int n2;
  IOType io_type;
  GradAccumulator accumulator;    // kAuto unless a benchmark asks
  bool uniform_pairs;             // the grad kernel's pair sweeps without thread 0's own path (on-chip route)
  bool two_sided;                 // grad_filter[c][1][s] = lag -s, Σ_b Σ_t dy[t]·u[t+s], beside lag s
  // The split backward (N = 32768 only): grad_filter and grad_skip alone; grad_u unused (may be
  // null), grad_pregate unwritten (the dispatch still asks for it beside a pregate, as the binding
  // passes it). The caller stores them itself: conv_forward_fp32 on dy with the
  // conjugated filter spectrum (the correlation with k', skip term included: conj(K + D/N) =
  // conj K + D/N); gated, with dz = postgate ⊙ dy its load and du = pregate ⊙ dx its store.
  bool filter_grad_only;
  // The gated training step (y = postgate ⊙ z, z = conv(x) + D·x, x = pregate ⊙ u), each gate
  // (batch, channels, seq_len) contiguous in io_type, or nullptr. With either gate the grad kernel
  // runs its GATED instance (fp32 io, causal only): it transforms x = pregate ⊙ u and
  // dz = postgate ⊙ dy where it transformed u and dy, so grad_filter and grad_skip are those of
  // x and dz, and it stores grad_u = pregate ⊙ dx and grad_pregate = u ⊙ dx (dx: the correlation
  // it stored as grad_u before). dpostgate = dy ⊙ z is the caller's.
  const void* pregate;
  const void* postgate;
  void* grad_pregate;             // (batch, channels, seq_len) contiguous, io_type; required with pregate
  int filter_row_shift;           // as in ConvForwardParams (ungated only); grad_filter keeps a row per channel
  // dpostgate = dy ⊙ z from the gated grad kernel's own load of dy (every route), where both are
  // given with a postgate: z the forward's pre-postgate output (ConvForwardParams::
  // pre_postgate_out), grad_postgate its gradient, both (batch, channels, seq_len) contiguous in
  // io_type. nullptr, both: dpostgate is the caller's (one elementwise pass more).
  const void* postgate_z;
  void* grad_postgate;
};

// The filter spectrum that ConvForwardParams takes, from the filter k (fp32 arithmetic):
// spectrum[c][k1][k2] = FFT_N(zero-padded k_c)[k1 + n1·k2] / N, k1 in [0, n1/2].
// Two-sided (bidirectional) filters: the spectrum of the N-point circle holding k_c[0][s] at
// lag s and k_c[1][s] at lag -s = N - s, i.e. FFT_N(k_c[0]) + conj(FFT_N(k_c[1])).
struct FilterSpectrumParams {
  const void* filter;   // (channels, filter_len), contiguous; (channels, 2, filter_len) if two_sided
  // filter's element type: fp32, or (one-sided) bf16/fp16, read and widened as the kernel loads
  // it (exact), so a half-precision filter needs no cast launch before
  IOType filter_type;
  float* spectrum;      // (channels, n1/2+1, n2, 2), contiguous
  // Null: compute every row. Otherwise a refresh of a cached spectrum: source (channels,
  // filter_len) is the filter the rows were computed from (fp32: a half filter's widened values);
  // rows whose filter differs from it, bit for bit, are recomputed and their source rows
  // updated, the others left as they are.
  float* source;
  int64_t channels;
  int64_t filter_len;   // 1 <= filter_len <= fft_size / 2
  int fft_size;
  int n1;
  int n2;
  bool two_sided;       // the filter's rows are (causal, anti-causal) pairs; no refresh (source null)
};

// The Monarch splits (n1, n2) the kernels are built for: the planner's factorisation of
// N = 256 .. 16384 (n1 >= n2, n1 <= 2·n2). The one list behind the kernels' coverage (the
// binding reports it to Python once, at load), their dispatch and their instantiation.
#define MONARCH_FFTCONV_SPLITS(X) X(16, 16) X(32, 16) X(32, 32) X(64, 32) X(64, 64) X(128, 64) X(128, 128)

// Splits only the fp32 radix kernels cover (one CTA per sequence, 512 threads), for every
// precision: N = 32768 as the planner's first factor and the row length, (32, 1024). The
// CUDA spectrum then has the planner's shape, with its columns in natural frequency order.
#define MONARCH_FFTCONV_RADIX_ONLY_SPLITS(X) X(32, 1024)

// Every kernel covers these splits (the tensor-core kernels only these).
constexpr bool covers_split(int n1, int n2) {
#define MONARCH_FFTCONV_COVERS(N1_, N2_) \
  if (n1 == N1_ && n2 == N2_) return true;
  MONARCH_FFTCONV_SPLITS(MONARCH_FFTCONV_COVERS)
  return false;
}

// The fp32 radix kernels (forward, backward, filter spectrum) cover these.
constexpr bool covers_radix_split(int n1, int n2) {
  MONARCH_FFTCONV_RADIX_ONLY_SPLITS(MONARCH_FFTCONV_COVERS)
#undef MONARCH_FFTCONV_COVERS
  return covers_split(n1, n2);
}

// Long sequences, N = 65536 .. 2^23 (L up to 4M): the four-step algorithm (docs/design.md),
// N = P·M with the inner size M (fourstep_inner_size) and the outer size P, t = m + M·p,
// f = P·k1 + k2. Three launches through one complex intermediate of (B·C, P/2+1, M):
//   outer forward:  a[s][k2][m] = W_N^(m·k2) · Σ_{p < P/2} x[s][m + M·p]·W_P^(p·k2),  k2 <= P/2
//                   (P <= 32 in registers, one thread per column; P >= 128 in shared memory)
//   inner:          per row (s, k2): FFT_M, times the filter spectrum row (or its conjugate),
//                   unnormalised inverse FFT_M, in place
//   outer inverse:  y[s][m + M·p] = Re Σ_{k2 < P} W_P^(-p·k2) · W_N^(-m·k2) · c[s][k2][m], the rows
//                   k2 > P/2 being the conjugates of P - k2 (y is real); t < L stored
// The filter spectrum is K[c][k2][k1] = FFT_N(k_c)[P·k1 + k2] / N, k2 in [0, P/2], k1 in [0, M).
constexpr int64_t kFourStepMinSize = 65536;    // below, the radix kernels run on chip
constexpr int64_t kFourStepMaxSize = 1 << 23;  // L = 4M
// M = 8192, except at N = 2^19, whose P would be 64 (neither kernel family's size): M = 4096.
constexpr int fourstep_inner_size(int64_t fft_size) { return fft_size == (int64_t(1) << 19) ? 4096 : 8192; }
// The stored rows of the spectrum and the intermediate: k2 = 0 .. P/2.
constexpr int fourstep_rows(int64_t fft_size) { return (int)(fft_size / fourstep_inner_size(fft_size) / 2 + 1); }

struct FourStepParams {
  const void* x;                  // real input (batch, channels, seq_len), time stride 1, io_type
  int64_t x_batch_stride;         // in elements
  int64_t x_channel_stride;
  const float* filter_spectrum;   // (channels, P/2+1, M, 2); unused by fourstep_spectrum
  const float* skip;              // fourstep_conv: (channels,) or null; the filter is K + skip/N
  void* y;                        // fourstep_conv: (batch, channels, seq_len) contiguous, io_type
  float* intermediate;            // (batch·channels, P/2+1, M, 2): scratch, or fourstep_spectrum's output
  float* spectrum_out;            // fourstep_conv: x's spectrum (batch·channels, P/2+1, M, 2) also
                                  // stored here (the backward's u_spectrum), or null
  int64_t batch;
  int64_t channels;
  int64_t seq_len;                // 1 <= seq_len <= fft_size / 2
  int fft_size;                   // N
  float spectrum_scale;           // fourstep_spectrum: X·spectrum_scale (1/N for a filter spectrum)
  IOType io_type;
};

struct FourStepBackwardParams {
  const void* u;                  // (batch, channels, seq_len), time stride 1, io_type
  int64_t u_batch_stride;         // in elements
  int64_t u_channel_stride;
  const void* grad;               // dy: (batch, channels, seq_len) contiguous, io_type
  const float* filter_spectrum;   // (channels, P/2+1, M, 2), as the forward used it
  const float* skip;              // (channels,) or null
  void* grad_u;                   // du: (batch, channels, seq_len) contiguous, io_type
  float* grad_filter;             // dk: (channels, filter_len) contiguous
  const float* u_spectrum;        // u's spectrum as fourstep_conv stored it (spectrum_out), or null:
                                  // computed here (two launches more)
  bool sum_in_grad;               // the grad kernel sums the filter gradient over the batch (no
                                  // batch_sum launch, no B·C product rows): the caller's decision,
                                  // fourstep_backward_sums_in_grad's advice; the workspace's size
                                  // depends on it
  void* workspace;                // fourstep_backward_workspace_bytes, 16-byte aligned
  int64_t batch;
  int64_t channels;
  int64_t seq_len;
  int64_t filter_len;             // 1 <= filter_len <= seq_len
  int fft_size;
  IOType io_type;
};

// The launches. The binding has checked the tensors and the split against the coverage;
// a launch only guards itself (cudaErrorInvalidValue) and otherwise returns the launch
// status. Both launch on `stream`, with 64-bit element indexing.

// One step of a long convolution's streaming generation (generation/conv_step.cu): with the
// generated index i = *index, for every stream e = b·C + c: inputs[e][i] = x[e];
// y[e] = pending[e][i] + first_tap[c]·x[e], also outputs[i][e] where outputs is given; with
// fold, pending[e][i+1] += second_tap[c]·x[e]; and with block_taps (a small fold level's
// Toeplitz block, n = block_n <= kConvStepMaxBlock), pending[e][i+1+m] +=
// Σ_j inputs[e][i+1-n+j]·block_taps[g][j][m], g = c / (C / groups). Every tensor contiguous, in
// T (fp32 or fp64).
constexpr int kConvStepMaxBlock = 8;  // generation.DIRECT_MAX_BLOCK: the largest Toeplitz level
template <typename T>
struct ConvStepParams {
  const T* x;             // (B, C), element (b, c) at b·x_batch_stride + c·x_channel_stride
  T* inputs;              // (B, C, to_generate)
  T* pending;             // (B, C, pending_len)
  T* outputs;             // (to_generate, B, C), or null
  T* y;                   // (B, C)
  const T* first_tap;     // (C,)
  const T* second_tap;    // (C,)
  const int64_t* index;   // the generated index i, in device memory (read where position < 0)
  int64_t* next_index;    // where position >= 0: set to i + 1 for the graphed steps that follow; or null
  const T* block_taps;    // (groups, block_n, block_n), or null: no block
  int64_t position;       // the generated index i from the host (a direct step), or -1: *index
  int64_t x_batch_stride;
  int64_t x_channel_stride;
  int64_t batch;
  int64_t channels;
  int64_t to_generate;
  int64_t pending_len;
  int64_t groups;         // divides channels (1 <= groups)
  int block_n;            // 0 without block_taps, else 1 .. kConvStepMaxBlock
  bool fold;
};
cudaError_t conv_step(const ConvStepParams<float>& params, cudaStream_t stream);
cudaError_t conv_step(const ConvStepParams<double>& params, cudaStream_t stream);

// A middle fold level's block of a streaming generation (generation/conv_step.cu), as a direct
// Toeplitz product instead of two FFTs: with the generated index i = *index (or `position`, from
// the host, where it is >= 0: the C++ stepper's direct middle levels), for every stream
// e = b·C + c and m < n, pending[e][i+1+m] += Σ_j inputs[e][i+1-n+j]·taps[g][n+m-j] (j ascending,
// one fused multiply-add a term), g = c / (C / groups); taps (groups, taps_len) holds the filter's
// k[0 .. taps_len) (k[0] unused), taps_len >= 2n. n is a power of two in [kConvBlockMinBlock,
// kConvBlockMaxBlock]. Every tensor contiguous, in T (fp32 or fp64).
constexpr int kConvBlockMinBlock = 16;   // one above kConvStepMaxBlock: the smaller levels are conv_step's
constexpr int kConvBlockMaxBlock = 256;  // generation.KERNEL_MAX_BLOCK
template <typename T>
struct ConvBlockParams {
  const T* inputs;        // (B, C, to_generate)
  T* pending;             // (B, C, pending_len)
  const T* taps;          // (groups, taps_len)
  const int64_t* index;   // the generated index i, in device memory (read where position < 0)
  int64_t position;       // the generated index i from the host, or -1: *index
  int64_t batch;
  int64_t channels;
  int64_t to_generate;
  int64_t pending_len;
  int64_t groups;         // divides channels (1 <= groups)
  int64_t taps_len;       // >= 2 * block_n
  int block_n;
};
cudaError_t conv_block(const ConvBlockParams<float>& params, cudaStream_t stream);
cudaError_t conv_block(const ConvBlockParams<double>& params, cudaStream_t stream);

// Fused tensor-core Monarch kernel: precisions kTF32, kBF16, kFP16.
// The workspace conv_forward_tensor_core needs for this call (ConvForwardParams::workspace):
// 0 unless the call takes the engine in a build with its filter images.
size_t conv_forward_tensor_core_workspace_bytes(const ConvForwardParams& params);
cudaError_t conv_forward_tensor_core(const ConvForwardParams& params, cudaStream_t stream);

// Fused fp32-accurate radix kernel: precision kFP32, every radix split.
cudaError_t conv_forward_fp32(const ConvForwardParams& params, cudaStream_t stream);

// One launch, every precision (the tensor-core kernels take the same fp32 spectrum).
cudaError_t filter_spectrum_fp32(const FilterSpectrumParams& params, cudaStream_t stream);

// The backward (two kernels: the per-sequence gradients with per-chunk filter-gradient
// spectra, then their fixed-order sum and inverse per channel). Deterministic. The workspace
// size depends on the call's shape and the current device; 0 on an invalid call.
size_t conv_backward_fp32_workspace_bytes(const ConvBackwardParams& params);
cudaError_t conv_backward_fp32(const ConvBackwardParams& params, cudaStream_t stream);

// Four-step: y = the convolution (or correlation) of x with the filter spectrum, through the
// intermediate; and the spectrum alone, X[s][k2][k1] = FFT_N(x_s)[P·k1 + k2]·spectrum_scale,
// into the intermediate (the filter gradient's inputs).
cudaError_t fourstep_conv(const FourStepParams& params, cudaStream_t stream);
cudaError_t fourstep_spectrum(const FourStepParams& params, cudaStream_t stream);

// Four-step backward: du (the correlation of dy with the filter) and dk (Σ_b of the
// correlations of dy_b with u_b, truncated to filter_len); deterministic. dD is the binding's
// (a reduction of u·dy). The workspace holds two intermediates (B·C sequences each; the first C
// only, with a kept u_spectrum and the sums in the grad kernel); 0 on an invalid size.
size_t fourstep_backward_workspace_bytes(const FourStepBackwardParams& params);
cudaError_t fourstep_backward(const FourStepBackwardParams& params, cudaStream_t stream);
// Whether summing over the batch in the grad kernel (sum_in_grad) suits the call on the current
// device: one batch, or (c, k2) rows for two waves of the grad kernel's slots at least (the sum
// serialises a filter row's B rows in one slot). Decide once, before the workspace's size.
bool fourstep_backward_sums_in_grad(const FourStepBackwardParams& params);

}  // namespace monarch_fftconv
