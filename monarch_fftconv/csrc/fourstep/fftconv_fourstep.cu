// monarch_fftconv: long sequences, N = P·M > 32768, by the four-step algorithm.
//
// One FFT of N points does not fit on chip, so it is cut in two: t = m + M·p (m < M inner,
// p < P outer), f = P·k1 + k2. Then
//   X[P·k1 + k2] = Σ_m W_M^(m·k1) · [ W_N^(m·k2) · Σ_p x[m + M·p]·W_P^(p·k2) ]
// The bracket is the outer stage: a P-point DFT down each column m (stride M in memory),
// times the twiddle. The outer sum is the inner stage: an M-point FFT along each row k2,
// which is contiguous. Three kernels, one complex intermediate (B·C, P/2+1, M) in HBM:
//
//   outer forward   per column (s, m): the P/2 samples x[m + M·p], p < P/2 (the rest is the
//                   zero padding), a P-point DFT, the twiddles, rows k2 = 0 .. P/2 stored (x
//                   is real: the rows above are conjugates)
//   inner           one CTA slot per row (s, k2): the fp32 radix kernels' Stockham passes
//                   (fp32/radix.cuh, plan of M), the filter product between the last forward
//                   and the first inverse pass, the unnormalised inverse; in place
//   outer inverse   per column: the twiddles' conjugates, the rows k2 > P/2 as conjugates of
//                   P - k2, an inverse P-point DFT, the real part of the first P/2 outputs
//                   stored where t < L
// The outer kernels come in two forms: for P <= 32 one thread per column, the DFT in
// registers; for P >= 128 a CTA per tile of consecutive columns, two real columns packed
// into each slot of the radix plan of P in shared memory. M = 8192 (4096 at N = 2^19:
// fourstep_inner_size).
// The filter spectrum K[c][k2][k1] = FFT_N(k_c)[P·k1 + k2] / N carries the 1/N; every transform
// here is unnormalised. Arithmetic is fp32 throughout, the intermediate fp32. The filter
// spectrum itself is the outer forward and the inner forward half run on k (InnerMode::kSpectrum).
//
// Each sequence is independent: nothing is shared between two sequences' arithmetic.
//
// The kernels: fourstep/args.cuh (their arguments), fourstep/outer.cuh (the outer stage),
// fourstep/inner.cuh (the inner stage); this unit holds the launches and the entry points.

#include "fp32/radix.cuh"
#include "fourstep/args.cuh"
#include "fourstep/outer.cuh"
#include "fourstep/inner.cuh"

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

// f(std::integral_constant<int, I>{}) for the I with 2^I = value, I in [LO, HI]
template <int LO, int HI, class F>
cudaError_t with_log2(int64_t value, F&& f) {
  if constexpr (LO > HI) {
    return cudaErrorInvalidValue;
  } else {
    if (value == (int64_t(1) << LO)) return f(std::integral_constant<int, LO>{});
    return with_log2<LO + 1, HI>(value, f);
  }
}

template <class F>
cudaError_t with_io(IOType io, F&& f) {
  switch (io) {
    case IOType::kFloat32: return f(float{});
    case IOType::kBFloat16: return f(__nv_bfloat16{});
    case IOType::kFloat16: return f(__half{});
  }
  return cudaErrorInvalidValue;
}

bool valid_params(const FourStepParams& p) {
  return kFourStepMinSize <= p.fft_size && p.fft_size <= kFourStepMaxSize && (p.fft_size & (p.fft_size - 1)) == 0 &&
         p.batch > 0 && p.channels > 0 && 1 <= p.seq_len && 2 * p.seq_len <= p.fft_size && p.x && p.intermediate &&
         reinterpret_cast<uintptr_t>(p.intermediate) % 16 == 0;
}

FourStepArgs make_args(const FourStepParams& p) {
  FourStepArgs g{};
  g.x = p.x;
  g.xbs = p.x_batch_stride;
  g.xcs = p.x_channel_stride;
  g.K = reinterpret_cast<const float2*>(p.filter_spectrum);
  g.y = p.y;
  g.a = reinterpret_cast<float2*>(p.intermediate);
  g.spectrum_out = reinterpret_cast<float2*>(p.spectrum_out);
  g.B = p.batch;
  g.C = p.channels;
  g.L = p.seq_len;
  g.N = (int)p.fft_size;
  g.M = fourstep_inner_size(p.fft_size);
  g.logM = ilog2_host(g.M);
  g.columns = p.batch * p.channels * g.M;
  g.R = fourstep_rows(p.fft_size);
  g.skip = p.skip;
  return g;
}

// The sequence area of one slot of Plan<LOGM> (no filter stage) and the CTA's smem.
template <int LOGM>
int slot_floats() { return area_floats<LOGM>(2, 1); }
template <int LOGM>
size_t slots_smem(int S) {
  using Pl = Plan<LOGM>;
  return (size_t)Pl::SPB * 2 * S * sizeof(float) + (size_t)Pl::N_TW * sizeof(float2);
}

template <int LOGM, InnerMode MODE>
cudaError_t launch_inner(const FourStepArgs& g, cudaStream_t stream) {
  using Pl = Plan<LOGM>;
  constexpr auto kern = &inner_kernel<LOGM, MODE>;
  const int S = slot_floats<LOGM>();
  const size_t smem = slots_smem<LOGM>(S);
  int ctas = 0, sms = 0;
  cudaError_t err = residency<kern>(Pl::THREADS, smem, ctas, sms);
  if (err != cudaSuccess) return err;
  const int64_t rows = (g.columns >> g.logM) * g.R;
  int64_t grid = (int64_t)ctas * sms;
  const int64_t needed = (rows + Pl::SPB - 1) / Pl::SPB;
  if (grid > needed) grid = needed;
  kern<<<(unsigned)grid, dim3(Pl::T, Pl::SPB), smem, stream>>>(g, S);
  return cudaGetLastError();
}

template <InnerMode MODE>
cudaError_t launch_inner_any(const FourStepArgs& g, cudaStream_t stream) {
  return with_log2<12, 13>(g.M, [&](auto logm) { return launch_inner<decltype(logm)::value, MODE>(g, stream); });
}

// The inner kernel's slots resident at once for inner size M (0 where the residency query fails).
template <InnerMode MODE>
int64_t inner_slots(int64_t M) {
  int64_t slots = 0;
  with_log2<12, 13>(M, [&](auto logm) {
    constexpr int LOGM = decltype(logm)::value;
    using Pl = Plan<LOGM>;
    int ctas = 0, sms = 0;
    const cudaError_t err =
        residency<&inner_kernel<LOGM, MODE>>(Pl::THREADS, slots_smem<LOGM>(slot_floats<LOGM>()), ctas, sms);
    if (err == cudaSuccess) slots = (int64_t)ctas * sms * Pl::SPB;
    else (void)cudaGetLastError();  // no slots known: the caller takes the other route; no error left set
    return err;
  });
  return slots;
}

// The filter gradient's spectrum, summed over the batch in a fixed order (deterministic):
// a[c] = scale · Σ_b a[b·C + c] for every (k2, k1), into the first C sequences of a.
__global__ void __launch_bounds__(kOuterThreads) batch_sum_kernel(float2* a, int64_t B, int64_t per_batch, float scale) {
  const int64_t e = (int64_t)blockIdx.x * kOuterThreads + threadIdx.x;
  if (e >= per_batch) return;
  float2 sum = __ldcs(a + e);
  for (int64_t b = 1; b < B; ++b) {
    const float2 z = __ldcs(a + b * per_batch + e);
    sum.x += z.x;
    sum.y += z.y;
  }
  a[e] = make_float2(sum.x * scale, sum.y * scale);
}

// The outer stage, forward or inverse, for the call's P and io type.
template <bool INVERSE>
cudaError_t launch_outer(const FourStepArgs& g, IOType io, cudaStream_t stream) {
  const int64_t outer = g.N / g.M;
  return with_io(io, [&](auto io_value) -> cudaError_t {
    using IO = decltype(io_value);
    if (outer <= 32) {
      const unsigned blocks = (unsigned)((g.columns + kOuterThreads - 1) / kOuterThreads);
      return with_log2<3, 5>(outer, [&](auto logp) {
        constexpr int P = 1 << decltype(logp)::value;
        if constexpr (INVERSE) outer_inverse_reg_kernel<P, IO><<<blocks, kOuterThreads, 0, stream>>>(g);
        else outer_forward_reg_kernel<P, IO><<<blocks, kOuterThreads, 0, stream>>>(g);
        return cudaGetLastError();
      });
    }
    return with_log2<7, 10>(outer, [&](auto logp) {
      constexpr int LOGP = decltype(logp)::value;
      using Pl = Plan<LOGP>;
      const int S = slot_floats<LOGP>();
      const size_t smem = slots_smem<LOGP>(S);
      constexpr auto kern = INVERSE ? &outer_inverse_smem_kernel<LOGP, IO> : &outer_forward_smem_kernel<LOGP, IO>;
      int ctas = 0, sms = 0;
      const cudaError_t err = residency<kern>(Pl::THREADS, smem, ctas, sms);  // sets the smem limit once
      if (err != cudaSuccess) return err;
      FourStepArgs prefetching = g;
      prefetching.tile_stride = (int64_t)ctas * sms;
      kern<<<(unsigned)(g.columns / ColumnTile<LOGP>::COLUMNS), dim3(Pl::T, Pl::SPB), smem, stream>>>(prefetching, S);
      return cudaGetLastError();
    });
  });
}

}  // namespace fp32_detail
}  // namespace

cudaError_t fourstep_conv(const FourStepParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  if (!valid_params(p) || !p.y || !p.filter_spectrum || reinterpret_cast<uintptr_t>(p.filter_spectrum) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.spectrum_out) % 8 != 0)
    return cudaErrorInvalidValue;
  const FourStepArgs g = make_args(p);
  cudaError_t err = launch_outer<false>(g, p.io_type, stream);
  if (err == cudaSuccess)
    err = g.spectrum_out == nullptr ? launch_inner_any<InnerMode::kConv>(g, stream)
                                    : launch_inner_any<InnerMode::kConvKeep>(g, stream);
  if (err == cudaSuccess) err = launch_outer<true>(g, p.io_type, stream);
  return err;
}

cudaError_t fourstep_spectrum(const FourStepParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  if (!valid_params(p)) return cudaErrorInvalidValue;
  FourStepArgs g = make_args(p);
  g.spectrum_out = nullptr;  // kSpectrum stores the spectrum as its output
  g.scale = p.spectrum_scale;
  const cudaError_t err = launch_outer<false>(g, p.io_type, stream);
  return err == cudaSuccess ? launch_inner_any<InnerMode::kSpectrum>(g, stream) : err;
}

bool fourstep_backward_sums_in_grad(const FourStepBackwardParams& p) {
  if (p.fft_size < kFourStepMinSize || p.fft_size > kFourStepMaxSize) return false;
  if (p.batch == 1) return true;
  const int64_t items = p.channels * fourstep_rows(p.fft_size);
  using fp32_detail::InnerMode;
  const int64_t slots = fp32_detail::inner_slots<InnerMode::kGradSum>(fourstep_inner_size(p.fft_size));
  return slots > 0 && items >= 2 * slots;
}

size_t fourstep_backward_workspace_bytes(const FourStepBackwardParams& p) {
  if (p.fft_size < kFourStepMinSize || p.fft_size > kFourStepMaxSize) return 0;
  const int64_t per_sequence = fourstep_rows(p.fft_size) * (int64_t)fourstep_inner_size(p.fft_size);
  // the first: X (then its first C rows the filter gradient's sum), or only that sum where X is kept
  // and the grad kernel sums; the second: dy's pipeline
  const int64_t first = p.u_spectrum != nullptr && p.sum_in_grad ? p.channels : p.batch * p.channels;
  return (size_t)(first + p.batch * p.channels) * per_sequence * sizeof(float2);
}

// Eight launches through two intermediates, X (u's spectrum, then the filter gradient's) and
// the dy pipeline's:
//   X  = spectrum(u)                                   outer forward, inner kSpectrum
//   du = correlation(dy, K): outer forward of dy, inner kGrad (X <- conj(X)·DY on the way,
//        the product with conj K, the inverse), outer inverse
//   G  = Σ_b conj(X_b)·DY_b / N                        batch_sum, into X's first C rows
//   dk = the first filter_len samples of G's inverse   inner kInverse, outer inverse (fp32)
// Given u_spectrum (the forward's X, kept), the first two launches go: kGrad reads X there and
// writes the products into the workspace's first intermediate, leaving u_spectrum as it was.
// Where the grad kernel sums (sum_in_grad), kGradSum accumulates G itself, a
// slot taking a (c, k2)'s B rows in turn, into the first intermediate's first C rows (over X's
// rows b = 0, each read by its own slot before the store): no product rows, no batch_sum.
// The filter gradient is the spectrum's adjoint applied to w ⊙ G, w the row weights (rows
// 0 and P/2 once, the others twice, as the outer inverse counts them); the adjoint divides
// by w again, so G goes through the outer inverse as it is (docs/design.md).
cudaError_t fourstep_backward(const FourStepBackwardParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  const size_t workspace_bytes = fourstep_backward_workspace_bytes(p);
  if (workspace_bytes == 0 || p.batch <= 0 || p.channels <= 0 || p.seq_len < 1 ||
      2 * p.seq_len > p.fft_size || p.filter_len < 1 || p.filter_len > p.seq_len || !p.u || !p.grad ||
      !p.filter_spectrum || !p.grad_u || !p.grad_filter || !p.workspace ||
      reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0 || reinterpret_cast<uintptr_t>(p.u_spectrum) % 8 != 0)
    return cudaErrorInvalidValue;
  FourStepParams fp{};
  fp.filter_spectrum = p.filter_spectrum;
  fp.skip = p.skip;
  fp.batch = p.batch;
  fp.channels = p.channels;
  fp.seq_len = p.seq_len;
  fp.fft_size = p.fft_size;
  fp.io_type = p.io_type;
  const int64_t per_batch = p.channels * fourstep_rows(p.fft_size) * (int64_t)fourstep_inner_size(p.fft_size);
  const size_t dy_bytes = (size_t)(p.batch * per_batch) * sizeof(float2);
  const float grad_scale = 1.f / (float)p.fft_size;  // G's 1/N, by kGradSum or batch_sum
  float2* spectra = reinterpret_cast<float2*>(p.workspace);
  float2* dy_rows = reinterpret_cast<float2*>(static_cast<char*>(p.workspace) + (workspace_bytes - dy_bytes));

  // X = spectrum(u), unless the forward kept it
  cudaError_t err = cudaSuccess;
  const float2* u_spectrum = reinterpret_cast<const float2*>(p.u_spectrum);
  FourStepArgs g{};
  if (u_spectrum == nullptr) {
    fp.x = p.u;
    fp.x_batch_stride = p.u_batch_stride;
    fp.x_channel_stride = p.u_channel_stride;
    fp.intermediate = reinterpret_cast<float*>(spectra);
    g = make_args(fp);
    g.scale = 1.f;
    err = launch_outer<false>(g, p.io_type, stream);
    if (err == cudaSuccess) err = launch_inner_any<InnerMode::kSpectrum>(g, stream);
    u_spectrum = spectra;
  }

  // du, and conj(X)·DY per sequence
  fp.x = p.grad;
  fp.x_batch_stride = p.channels * p.seq_len;
  fp.x_channel_stride = p.seq_len;
  fp.intermediate = reinterpret_cast<float*>(dy_rows);
  fp.y = p.grad_u;
  g = make_args(fp);
  g.conj = 1;
  g.products = u_spectrum;
  g.products_out = spectra;
  g.grad_sum = spectra;
  g.scale = grad_scale;
  if (err == cudaSuccess) err = launch_outer<false>(g, p.io_type, stream);
  if (err == cudaSuccess)
    err = p.sum_in_grad ? launch_inner_any<InnerMode::kGradSum>(g, stream)
                        : launch_inner_any<InnerMode::kGrad>(g, stream);
  if (err == cudaSuccess) err = launch_outer<true>(g, p.io_type, stream);

  // G = Σ_b conj(X_b)·DY_b / N (unless kGradSum has summed it), then its inverse: dk
  if (err == cudaSuccess && !p.sum_in_grad) {
    batch_sum_kernel<<<(unsigned)((per_batch + kOuterThreads - 1) / kOuterThreads), kOuterThreads, 0, stream>>>(
        spectra, p.batch, per_batch, grad_scale);
    err = cudaGetLastError();
  }
  fp.batch = 1;
  fp.seq_len = p.filter_len;
  fp.intermediate = reinterpret_cast<float*>(spectra);
  fp.y = p.grad_filter;
  fp.skip = nullptr;
  g = make_args(fp);
  if (err == cudaSuccess) err = launch_inner_any<InnerMode::kInverse>(g, stream);
  if (err == cudaSuccess) err = launch_outer<true>(g, IOType::kFloat32, stream);
  return err;
}

}  // namespace monarch_fftconv
