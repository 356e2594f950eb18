// monarch_fftconv: one token of a long convolution's streaming generation, in one launch, and a
// middle fold level's block (conv_block, below).
//
// generation.py keeps, per stream e = b·C + c, the generated inputs (inputs[e][i]) and each
// future position's partial sum (pending[e][i]). A step at generated index i (the graphed
// steps keep i in device memory, so that one CUDA graph serves every position of a fold level)
// does, for every stream (x as the caller holds it: a direct step reads x_t where it lies, strided):
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
  // A graphed step reads i from device memory; a direct step (generation.DIRECT_STEP) is given
  // it, and leaves i + 1 there for the graphs of the other levels, as their increment would.
  // No thread of a direct step reads *index, so one thread writes it.
  const int64_t i = p.position >= 0 ? p.position : *p.index;
  if (p.next_index != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *p.next_index = i + 1;
  // The host checks the room before every step; an index past it writes nothing.
  if (i < 0 || i >= p.to_generate || (p.fold && i + 1 >= p.pending_len)) return;
  if (p.block_n > 0 && (i + 1 < p.block_n || i + p.block_n >= p.pending_len)) return;
  const int64_t streams = p.batch * p.channels;
  const int64_t group_size = p.channels / p.groups;
  for (int64_t e = (int64_t)blockIdx.x * kStepThreads + threadIdx.x; e < streams;
       e += (int64_t)gridDim.x * kStepThreads) {
    const int64_t c = e % p.channels;
    const T x = p.x[(e / p.channels) * p.x_batch_stride + c * p.x_channel_stride];
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
  // no streams: nothing to launch, but for a direct step's index (one block writes it)
  if (streams <= 0 && p.next_index == nullptr) return cudaSuccess;
  const int64_t blocks = streams > 0 ? (streams + kStepThreads - 1) / kStepThreads : 1;
  conv_step_kernel<T><<<(unsigned)(blocks < 65535 ? blocks : 65535), kStepThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// A middle level's block (n = 16 .. 256) as a direct Toeplitz product. Through PyTorch ops such
// a level is two FFTs on 2n points and six more launches (gather, product, scatter-add), ~20x
// its memory floor at B·C = 65,536 (session 23: 236 µs at n = 64, where its 16 MB of inputs and
// 32 MB of pending sums take ~16 µs); and these levels are the top percent of token latencies.
// Directly it is n² multiply-adds a stream (4,096 at n = 64): cheap beside the memory.
//
// A warp per ROWS batch rows of one channel (launch_block picks ROWS from the batch; ROWS = 1 is a
// warp a stream): the group's 2n taps and the ROWS blocks of n inputs into the warp's shared
// memory, then each lane sums K = max(n/32, 1) consecutive outputs m = K·lane + q of every row
// over j ascending, one fma a term. A stream's sums are the same fma chain whatever ROWS and K
// are: the same bits. Output m takes tap n + m - j at j, so a lane's K taps at j + 1 are those at
// j moved up one with one new below: the lane keeps them in registers (its window) and, a step of
// max(K, 4) j's at a time, loads the taps below the window (K values a load, at most 16 bytes) and
// each row's next inputs (16-byte loads, a broadcast). The sums go out through the rows' shared
// memory, so that the read-modify-write of pending is coalesced.
// Why: a lane that summed the outputs lane, lane + 32, ... (the first form) loaded a tap from
// shared memory for every ROWS fmas: K + ROWS/4 loads a j in fp32 for K·ROWS fmas (ptxas merged 4
// j's inputs into one load), where the shared memory pipe issues at a quarter of the fma rate, so
// the loads bound it (measured, session 27, H100, B16 C4096: n = 128 0.106 ms a token, n = 256
// 0.311, with ROWS rows sharing each tap load; 0.193 and 0.610 without). With the window a j is at
// most 1 + ROWS/4 loads in fp32 ((1 + ROWS)/4 from K = 4), and the fmas bound it. Predicted
// ~0.05-0.06 ms a token at n = 128 (fma floor ~36 µs, memory ~35), ~0.15 at 256; measured
// (session 30, H100): 0.085 and 0.234 a token, the n = 128 kernel 64 µs on an H200, near its
// issue bound (37.7 M warp instructions, 89% FFMA, and a partial last wave; docs/performance.md).
template <typename T, int N, int ROWS>
struct ConvBlockTraits {
  static_assert(N >= kConvBlockMinBlock && N <= kConvBlockMaxBlock && (N & (N - 1)) == 0, "n: a power of two");
  static constexpr int kWarps = 4;                                 // warps a CTA
  static constexpr int kOutputsPerLane = N < 32 ? 1 : N / 32;      // K, consecutive
  static constexpr int kLanesWithOutputs = N / kOutputsPerLane;    // 16 at n = 16: the rest mirror them
  // j's a step: the window's length, at least 4 (an fp32 row's inputs, one 16-byte load). A step's
  // loads replace the whole window, so the loop unrolled twice alternates two sets of registers; a
  // shift by 4 at K = 8 took K moves a step (SASS, n = 256 fp32: ~6% more instructions a fma).
  static constexpr int kStep = kOutputsPerLane > 4 ? kOutputsPerLane : 4;
  static constexpr int kVector = 16 / sizeof(T);                   // values a 16-byte shared load
  // A lane's window starts at n + K·lane - j (j a multiple of kStep) and its sums in the rows at
  // 2n + r·n + K·lane: aligned to K values (n >= 16), so loads and stores of up to K.
  static constexpr int kTapVector = kOutputsPerLane < kVector ? kOutputsPerLane : kVector;
  static constexpr int kValuesPerWarp = 2 * N + ROWS * N;          // shared: 2n taps, ROWS rows of n inputs
  static_assert(N % kStep == 0 && kStep % kVector == 0 && kStep % kTapVector == 0, "whole vectors a step");
  static_assert(N % kVector == 0, "every warp's taps and rows 16-byte aligned");
  static_assert(kWarps * kValuesPerWarp * sizeof(T) <= 48 * 1024, "static shared memory");
};
// The rows a warp shares a channel's taps across: as many as the batch has, up to 4 in fp32 and
// 2 in fp64 (the static shared memory of n = 256); rows past the batch would be wasted fmas.
template <typename T>
constexpr int kConvBlockMaxRows = sizeof(T) == 4 ? 4 : 2;

// Shared memory to registers and back, V values an access (V·sizeof(T) <= 16, shared V-aligned).
template <typename T, int V>
struct alignas(V * sizeof(T)) SharedVector {
  T v[V];
};
template <int V, typename T, int COUNT>
__device__ __forceinline__ void load_shared(T (&values)[COUNT], const T* shared) {
  static_assert(COUNT % V == 0, "whole vectors");
#pragma unroll
  for (int s = 0; s < COUNT; s += V) {
    const SharedVector<T, V> loaded = *reinterpret_cast<const SharedVector<T, V>*>(shared + s);
#pragma unroll
    for (int t = 0; t < V; ++t) values[s + t] = loaded.v[t];
  }
}
template <int V, typename T, int COUNT>
__device__ __forceinline__ void store_shared(T* shared, const T (&values)[COUNT]) {
  static_assert(COUNT % V == 0, "whole vectors");
#pragma unroll
  for (int s = 0; s < COUNT; s += V) {
    SharedVector<T, V> stored;
#pragma unroll
    for (int t = 0; t < V; ++t) stored.v[t] = values[s + t];
    *reinterpret_cast<SharedVector<T, V>*>(shared + s) = stored;
  }
}

template <typename T, int N, int ROWS>
__global__ void __launch_bounds__(ConvBlockTraits<T, N, ROWS>::kWarps * 32)
    conv_block_kernel(const ConvBlockParams<T> p) {
  using Traits = ConvBlockTraits<T, N, ROWS>;
  constexpr int kPerWarp = Traits::kValuesPerWarp, K = Traits::kOutputsPerLane, kStep = Traits::kStep;
  __shared__ __align__(16) T smem[Traits::kWarps * kPerWarp];
  const int64_t i = p.position >= 0 ? p.position : *p.index;
  // The host checks the room before every step; a block with no room writes nothing.
  if (i + 1 < N || i >= p.to_generate || i + N >= p.pending_len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* taps = smem + warp * kPerWarp;  // taps[t] = k[t], t < 2N
  T* blocks = taps + 2 * N;          // blocks[r·N + j] = inputs[e_r][i+1-N+j], e_r = (b0 + r)·C + c
  // The lane's outputs m = first + q, q < K. At n = 16 lanes 16 .. 31 repeat lanes 0 .. 15: their
  // loads stay in range and are the same broadcasts, and they store nothing.
  const bool owns_outputs = lane < Traits::kLanesWithOutputs;
  const int first = lane % Traits::kLanesWithOutputs * K;
  const int64_t chunks = (p.batch + ROWS - 1) / ROWS, items = chunks * p.channels;
  const int64_t group_size = p.channels / p.groups;
  // Item w: channel c = w mod C, rows b0 .. b0 + ROWS - 1 (with ROWS = 1, w is the stream e).
  for (int64_t w = (int64_t)blockIdx.x * Traits::kWarps + warp; w < items; w += (int64_t)gridDim.x * Traits::kWarps) {
    const int64_t c = w % p.channels, b0 = w / p.channels * ROWS;
    const int rows = p.batch - b0 < ROWS ? (int)(p.batch - b0) : ROWS;
    const T* k = p.taps + c / group_size * p.taps_len;
    for (int t = lane; t < 2 * N; t += 32) taps[t] = k[t];
    for (int r = 0; r < rows; ++r) {
      const T* in = p.inputs + ((b0 + r) * p.channels + c) * p.to_generate + (i + 1 - N);
      for (int j = lane; j < N; j += 32) blocks[r * N + j] = in[j];
    }
    __syncwarp();
    T sum[ROWS][K];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int q = 0; q < K; ++q) sum[r][q] = T(0);
    T window[K];  // window[q] = taps[N + first + q - j]: the lane's taps at the step's first j
    load_shared<Traits::kTapVector>(window, taps + N + first);
    const T* below = taps + N + first - kStep;  // the step's taps below the window
    const T* step_inputs = blocks;              // row 0's inputs from the step's first j
#pragma unroll 2
    for (int j = 0; j < N; j += kStep, below -= kStep, step_inputs += kStep) {
      T x[ROWS][kStep];  // rows past the batch's end read stale values whose sums are never stored
#pragma unroll
      for (int r = 0; r < ROWS; ++r) load_shared<Traits::kVector>(x[r], step_inputs + r * N);
      T entering[kStep];  // entering[s] = taps[N + first - j - kStep + s]
      load_shared<Traits::kTapVector>(entering, below);
#pragma unroll
      for (int d = 0; d < kStep; ++d)
#pragma unroll
        for (int q = 0; q < K; ++q) {
          const T tap = q >= d ? window[q - d] : entering[kStep + q - d];  // taps[N + first + q - (j + d)]
#pragma unroll
          for (int r = 0; r < ROWS; ++r) sum[r][q] = fma(x[r][d], tap, sum[r][q]);
        }
#pragma unroll
      for (int q = 0; q < K; ++q) window[q] = entering[q];  // down a whole step (kStep >= K)
    }
    __syncwarp();  // every lane past its last input: the rows take the sums
    if (owns_outputs) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (r >= rows) break;
        store_shared<Traits::kTapVector>(blocks + r * N + first, sum[r]);
      }
    }
    __syncwarp();
    for (int r = 0; r < rows; ++r) {
      T* out = p.pending + ((b0 + r) * p.channels + c) * p.pending_len + (i + 1);
      for (int m = lane; m < N; m += 32) out[m] += blocks[r * N + m];
    }
    __syncwarp();  // the next item's loads overwrite this one's taps and blocks
  }
}

template <typename T, int N, int ROWS>
cudaError_t launch_block(const ConvBlockParams<T>& p, cudaStream_t stream) {
  constexpr int kWarps = ConvBlockTraits<T, N, ROWS>::kWarps;
  const int64_t items = (p.batch + ROWS - 1) / ROWS * p.channels;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  conv_block_kernel<T, N, ROWS><<<(unsigned)(blocks < 65535 ? blocks : 65535), kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int N>
cudaError_t launch_block(const ConvBlockParams<T>& p, cudaStream_t stream) {
  constexpr int kMaxRows = kConvBlockMaxRows<T>;
  if (p.batch >= kMaxRows) return launch_block<T, N, kMaxRows>(p, stream);
  if (kMaxRows > 2 && p.batch >= 2) return launch_block<T, N, 2>(p, stream);
  return launch_block<T, N, 1>(p, stream);
}

template <typename T>
cudaError_t launch_block(const ConvBlockParams<T>& p, cudaStream_t stream) {
  if (p.batch * p.channels <= 0) return cudaSuccess;
  if (p.groups < 1 || p.channels % p.groups != 0 || p.taps_len < 2 * (int64_t)p.block_n) return cudaErrorInvalidValue;
  switch (p.block_n) {
    case 16: return launch_block<T, 16>(p, stream);
    case 32: return launch_block<T, 32>(p, stream);
    case 64: return launch_block<T, 64>(p, stream);
    case 128: return launch_block<T, 128>(p, stream);
    case 256: return launch_block<T, 256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}
static_assert(kConvBlockMinBlock == 16 && kConvBlockMaxBlock == 256, "launch_block's cases");

}  // namespace

cudaError_t conv_step(const ConvStepParams<float>& p, cudaStream_t stream) { return launch(p, stream); }
cudaError_t conv_step(const ConvStepParams<double>& p, cudaStream_t stream) { return launch(p, stream); }
cudaError_t conv_block(const ConvBlockParams<float>& p, cudaStream_t stream) { return launch_block(p, stream); }
cudaError_t conv_block(const ConvBlockParams<double>& p, cudaStream_t stream) { return launch_block(p, stream); }

}  // namespace monarch_fftconv
