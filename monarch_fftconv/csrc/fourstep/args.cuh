// monarch_fftconv: the four-step kernels' arguments (fourstep/fftconv_fourstep.cu): the CTA size
// of the outer stage, FourStepArgs, and what the inner kernel does to each row (InnerMode).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

constexpr int kOuterThreads = 256;

struct FourStepArgs {
  const void* x;
  int64_t xbs, xcs;
  const float2* K;     // (C, R, M)
  const float* skip;   // (C,) or null: the filter is K + skip/N
  void* y;             // (B, C, L)
  float2* a;           // (B·C, R, M)
  float2* spectrum_out;    // kConvKeep: (B·C, R, M), the rows' spectra before the filter product
  const float2* products;  // kGrad: (B·C, R, M), X
  float2* products_out;    // kGrad: conj(X)·DY (over products, or into another buffer)
  float2* grad_sum;        // kGradSum: (C·R, M), Σ_b conj(X_b)·DY_b · scale (may be products' first C·R rows)
  int64_t B, C, L;
  int64_t columns;     // B·C·M
  int N, M, logM, R;   // R = P/2 + 1
  int conj;            // kConv, kGrad: multiply by the conjugate filter
  float scale;         // kSpectrum: the spectrum times this; kGradSum: the sum times this
  int64_t tile_stride; // outer stage, P >= 128: the CTAs resident at once (the prefetch distance)
};

// What the inner kernel does to each row, in place:
//   kConv      FFT_M, times the filter (or its conjugate), inverse FFT_M
//   kConvKeep  as kConv; the spectrum also stored to spectrum_out (the backward's X, kept). Its
//              own instance: the store's registers would spill in kConv at M = 4096
//   kSpectrum  FFT_M, times `scale`; stored
//   kGrad      as kConv; on the way, the row's spectrum DY and `products` (X) give conj(X)·DY,
//              stored to `products_out`
//   kInverse   inverse FFT_M only
//   kGradSum   as kGrad, a slot taking the B rows of one (c, k2) in turn: it sums their products
//              into grad_sum (times `scale` at the last), which batch_sum did from B stored rows
enum class InnerMode { kConv, kSpectrum, kGrad, kInverse, kConvKeep, kGradSum };

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
