// monarch_fftconv: one token of a long convolution's streaming generation, in one launch.
//
// generation.py keeps, per stream e = b·C + c, the generated inputs (inputs[e][i]) and each
// future position's partial sum (pending[e][i]). A step at generated index i (the graphed
// steps keep i in device memory, so that one CUDA graph serves every position of a fold level)
// does, for every stream:
//   inputs[e][i]   = x[e]
//   y[e]           = pending[e][i] + k0[c]·x[e]          (outputs[i][e] = y[e] where kept)
//   pending[e][i+1] += k1[c]·x[e]                        (fold: level 0's block, every other step)
//   pending[e][i+1+m] += Σ_j inputs[e][i+1-n+j]·K[g][j][m]  (block: levels 1..3, n = 2, 4, 8)
// As PyTorch ops that is eight small launches (index_copy_, index_select, addcmul, ...), and a
// block eight more around a batched GEMM of B·C tiny products (a Toeplitz copy per stream); a
// step's time on a GPU is its launches. Products as fused multiply-adds, one rounding each; a
// block's sum in j order.

#include "fftconv.h"

namespace monarch_fftconv {
namespace {

constexpr int kStepThreads = 256;

// A small level's block: the last n inputs (x the newest, in a register) through the group's
// Toeplitz taps K[j][m] into the next n pending sums.
template <typename T>
__device__ __forceinline__ void add_block(const ConvStepParams<T>& p, T x, const T* newest_input, T* pending,
                                          int64_t group) {
  const int n = p.block_n;
  const T* taps = p.block_taps + group * n * n;
  T block[kConvStepMaxBlock];
#pragma unroll
  for (int j = 0; j < kConvStepMaxBlock; ++j) block[j] = j < n - 1 ? newest_input[j + 1 - n] : x;
#pragma unroll
  for (int m = 0; m < kConvStepMaxBlock; ++m) {
    if (m >= n) break;
    T sum = T(0);
#pragma unroll
    for (int j = 0; j < kConvStepMaxBlock; ++j)
      if (j < n) sum = fma(block[j], taps[j * n + m], sum);
    pending[1 + m] += sum;
  }
}

template <typename T>
__global__ void __launch_bounds__(kStepThreads) conv_step_kernel(const ConvStepParams<T> p) {
  const int64_t i = *p.index;
  // The host checks the room before every step; an index past it writes nothing.
  if (i < 0 || i >= p.to_generate || (p.fold && i + 1 >= p.pending_len)) return;
  if (p.block_n > 0 && (i + 1 < p.block_n || i + p.block_n >= p.pending_len)) return;
  const int64_t streams = p.batch * p.channels;
  const int64_t group_size = p.channels / p.groups;
  for (int64_t e = (int64_t)blockIdx.x * kStepThreads + threadIdx.x; e < streams;
       e += (int64_t)gridDim.x * kStepThreads) {
    const int64_t c = e % p.channels;
    const T x = p.x[e];
    p.inputs[e * p.to_generate + i] = x;
    T* pending = p.pending + e * p.pending_len + i;
    const T y = fma(p.first_tap[c], x, pending[0]);
    p.y[e] = y;
    if (p.outputs != nullptr) p.outputs[i * streams + e] = y;
    if (p.fold) pending[1] = fma(p.second_tap[c], x, pending[1]);
    if (p.block_n > 0) add_block(p, x, p.inputs + e * p.to_generate + i, pending, c / group_size);
  }
}

template <typename T>
cudaError_t launch(const ConvStepParams<T>& p, cudaStream_t stream) {
  const int64_t streams = p.batch * p.channels;
  if (streams <= 0) return cudaSuccess;
  const int64_t blocks = (streams + kStepThreads - 1) / kStepThreads;
  conv_step_kernel<T><<<(unsigned)(blocks < 65535 ? blocks : 65535), kStepThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t conv_step(const ConvStepParams<float>& p, cudaStream_t stream) { return launch(p, stream); }
cudaError_t conv_step(const ConvStepParams<double>& p, cudaStream_t stream) { return launch(p, stream); }

}  // namespace monarch_fftconv
