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
  float2* products;    // kGrad: (B·C, R, M), X in, conj(X)·DY out (kGradFromU: u's outer stage in)
  int* arrivals;       // kGrad folding the batch sum (fold_batch_sum): (C·R) counters, zero at launch
  int64_t B, C, L;
  int64_t columns;     // B·C·M
  int N, M, logM, R;   // R = P/2 + 1
  int conj;            // kConv, kGrad: multiply by the conjugate filter
  int channel_major;   // kConv, kGrad: the inner stage's rows channel-major (inner_row)
  float scale;         // kSpectrum: the spectrum times this; kGrad folding: the batch sum times this
  int64_t tile_stride; // outer stage, P >= 128: the CTAs resident at once (the prefetch distance)
};

// What the inner kernel does to each row, in place:
//   kConv      FFT_M, times the filter (or its conjugate), inverse FFT_M
//   kSpectrum  FFT_M, times `scale`; stored
//   kGrad      as kConv; on the way, the row's spectrum DY turns `products` (X) into conj(X)·DY
//   kGradFromU as kGrad, `products` holding u's outer-stage rows: X = FFT_M of its row computed
//              first, in place (the backward without a kSpectrum pass on u)
//   kInverse   inverse FFT_M only
enum class InnerMode { kConv, kSpectrum, kGrad, kGradFromU, kInverse };

// Work item w of the inner stage: the intermediate's row (s, k2) = (b·C + c, k2) it transforms in
// place, and the filter spectrum's row (c, k2) it multiplies by.
//   batch-major (w = the intermediate's row): the CTAs resident at once hold rows of one batch,
//     so the filter's C·R rows are read once per batch, and at the four-step's sizes the whole
//     filter (C·R·M·8 bytes: 151 MB at C = 256, N = 2^17) leaves L2 before the next batch
//     comes back to a row: every batch reads it from HBM again.
//   channel-major (w = (c·R + k2)·B + b): the B rows sharing a filter row are consecutive, so
//     they run at about the same time and one HBM read of the filter row serves them all.
// The same rows either way, each transformed alone: the same bits. Only the modes that read
// the filter (kConv, kGrad, kGradFromU) have a channel-major instance.
struct InnerRow {
  int64_t data;     // s·R + k2
  int64_t channel;  // c
  int64_t filter;   // c·R + k2
};

template <bool CHANNEL_MAJOR>
__host__ __device__ inline InnerRow inner_row(int64_t w, int64_t B, int64_t C, int R) {
  if constexpr (CHANNEL_MAJOR) {
    const int64_t filter = w / B, b = w - filter * B;
    const int64_t c = filter / R, k2 = filter - c * R;
    return {(b * C + c) * R + k2, c, filter};
  } else {
    const int64_t s = w / R, c = s % C;
    const int k2 = (int)(w % R);
    return {w, c, c * R + k2};
  }
}

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
