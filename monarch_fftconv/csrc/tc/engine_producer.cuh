// monarch_fftconv: the tensor-core engine's producer warpgroup (tc/engine_kernel.cuh): the
// packed pairs z = u_a + i·u_b into the ring, the L2 prefetch a job ahead, and the channel's
// filter image into the resident buffer (one bulk copy a channel change).
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>

#include "fftconv.h"
#include "tc/engine_traits.cuh"
#include "tc/engine_primitives.cuh"

namespace monarch_fftconv {
namespace engine {

using namespace cute;

// ---------------------------------------------------------------------------
// The producer's loads.
// ---------------------------------------------------------------------------
// A sequence's first sample in global memory (u's I/O type).
template <class Cfg>
__device__ __forceinline__ const typename Cfg::IoT* sequence_start(const ConvForwardParams& p, int seq, int c) {
  return static_cast<const typename Cfg::IoT*>(p.u) + (seq >= 0 ? seq * p.u_batch_stride + c * p.u_channel_stride : 0);
}

// An item's two sequences (or zeros, a sequence < 0) into its ring planes (s, r): sample
// t = 128 r + s, rounded to the operand type. One loop over the 8-sample chunks, each iteration
// loading the same chunks of seq_re and seq_im, every 16-byte load issued before any is used
// (Cfg::kLoadsInFlight a thread, 4 by default: one chunk of each sequence in fp32, two in 2-byte
// I/O), each chunk's ring slot computed once for both planes. Where u's type is the operand type
// the bytes go into the ring as they are (a 2-byte u of that type is already rounded). Measured
// against loading the planes one after the other (session 38, H100): fp32 u −6.5% at
// 16x256x8192, −4.3% at 64x768x8192; 2-byte u the same time (docs/performance.md).
template <class Cfg>
__device__ __forceinline__ void load_planes(const ConvForwardParams& p, const Item& item, bool vec_ok,
                                            uint32_t plane_re, uint32_t plane_im, int pt) {
  using T = typename Cfg::T;
  using IoT = typename Cfg::IoT;
  using Io = typename Cfg::Io;
  constexpr int kChunksPerRow = Cfg::kN2 / Cfg::kU8PerThread;  // 16
  constexpr int kChunks = Cfg::kChunksPerPlane;
  constexpr int kVectors = Cfg::kVectorsPerChunk;
  constexpr int kInFlight = Cfg::kChunksInFlight;  // chunks of each sequence an iteration
  constexpr bool kAsIs = Cfg::kHalfIo && (std::is_same_v<T, cute::bfloat16_t> == std::is_same_v<IoT, __nv_bfloat16>);
  static_assert(kVectors * Io::kVec == Cfg::kU8PerThread, "a chunk is whole 16-byte vectors");
  const int L = int(p.seq_len);
  const int seq[2] = {item.seq_re, item.seq_im};
  const IoT* u[2] = {sequence_start<Cfg>(p, item.seq_re, item.channel), sequence_start<Cfg>(p, item.seq_im, item.channel)};
  const uint32_t plane[2] = {plane_re, plane_im};
#pragma unroll 1
  for (int first = pt; first < kChunks; first += kInFlight * Cfg::kWarpgroup) {
    uint4 raw[kInFlight][2][kVectors];
    bool whole[kInFlight][2];
#pragma unroll
    for (int n = 0; n < kInFlight; ++n) {  // every load issued before any is used
      const int t0 = (first + n * Cfg::kWarpgroup) * Cfg::kU8PerThread;  // chunk · 8 = 128 r + s0
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        whole[n][q] = seq[q] >= 0 && vec_ok && t0 + Cfg::kU8PerThread - 1 < L;
#pragma unroll
        for (int v = 0; v < kVectors; ++v)
          raw[n][q][v] = whole[n][q] ? ld_stream_u4(u[q] + t0 + v * Cfg::kSamplesPer16B) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int n = 0; n < kInFlight; ++n) {
      const int chunk = first + n * Cfg::kWarpgroup;
      const int r = chunk / kChunksPerRow, s0 = (chunk % kChunksPerRow) * Cfg::kU8PerThread;
      const int t0 = r * Cfg::kN2 + s0;
      const uint32_t slot = 2 * Cfg::ring_offset(s0, r);
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        if (kAsIs && whole[n][q]) {  // the operand type already: the bytes as they are
          st_shared_v4(plane[q] + slot, raw[n][q][0]);
          continue;
        }
        float x[Cfg::kU8PerThread];
        if (whole[n][q]) {
#pragma unroll
          for (int v = 0; v < kVectors; ++v) {
            float part[Io::kVec];
            Io::unpack(raw[n][q][v], part);
#pragma unroll
            for (int i = 0; i < Io::kVec; ++i) x[v * Io::kVec + i] = part[i];
          }
        } else {
#pragma unroll
          for (int i = 0; i < Cfg::kU8PerThread; ++i) x[i] = (seq[q] >= 0 && t0 + i < L) ? Io::load(u[q], t0 + i) : 0.0f;
        }
        st_shared_v4(plane[q] + slot,
                     make_uint4(pack2<T>(x[0], x[1]), pack2<T>(x[2], x[3]), pack2<T>(x[4], x[5]), pack2<T>(x[6], x[7])));
      }
    }
  }
}

// The channel's spectrum, (n1/2 + 1) x n2 words (re, im).
template <class Cfg>
__device__ __forceinline__ const float2* channel_spectrum(const ConvForwardParams& p, int c) {
  return reinterpret_cast<const float2*>(p.filter_spectrum) + c * int64_t(Cfg::kFilterRows * Cfg::kN2);
}

// A channel's unscales: 2^-e split between the hand-off and y (filter_unscales, below).
struct FilterUnscales {
  float handoff;  // 2^-min(e, kHandoffExponent), at least 2^-127 when p > 0
  float output;   // the rest of 2^-e
};

// The workspace the engine reads its filters from (filter_image_kernel writes it), per
// channel kImageBytes (16-byte aligned): the resident buffer's kFilterWords words, then its
// unscales (handoff, output, two zeros), as Smem holds them; after the channels' images, the
// twiddle table where Cfg::kTwiddleTable (kTwiddleTableBytes, else none).
template <class Cfg>
struct FilterImages {
  __host__ __device__ static constexpr size_t bytes(int64_t channels) {
    return size_t(channels) * Cfg::kImageBytes + Cfg::kTwiddleTableBytes;
  }
  __host__ __device__ static constexpr size_t offset(int64_t c) { return size_t(c) * Cfg::kImageBytes; }
  __host__ __device__ static uint32_t* words(void* workspace, int c) {
    return reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(workspace) + offset(c));
  }
  __host__ __device__ static float2* twiddles(void* workspace, int64_t channels) {
    return reinterpret_cast<float2*>(static_cast<uint8_t*>(workspace) + offset(channels));
  }
};

// Asks L2 for the 128-byte lines holding bytes [0, bytes) from first, line i by producer thread
// i % 128. The first line is asked by `first` itself: every address lies in the span, whatever
// its alignment.
template <class Cfg>
__device__ __forceinline__ void prefetch_span(const void* first, int bytes, int pt) {
  constexpr int kLine = 128;
  const char* span = static_cast<const char*>(first);
  const int head = int(reinterpret_cast<uintptr_t>(first) % kLine);  // bytes of the first line before `first`
#pragma unroll 1
  for (int at = kLine * pt - head; at < bytes; at += kLine * Cfg::kWarpgroup) prefetch_l2(span + max(at, 0));
}

// An item's inputs into L2, a job ahead of their loads: the samples t < min(L, N/2) that
// load_planes reads of each sequence, and the channel's filter image unless it is `resident`.
template <class Cfg>
__device__ __forceinline__ void prefetch_item(const ConvForwardParams& p, const Item& item, int resident, int pt) {
  const typename Cfg::IoT* u = static_cast<const typename Cfg::IoT*>(p.u) + item.channel * p.u_channel_stride;
  const int bytes = int(min(p.seq_len, int64_t(Cfg::kInputRows * Cfg::kN2))) * int(sizeof(typename Cfg::IoT));
  prefetch_span<Cfg>(u + item.seq_re * p.u_batch_stride, bytes, pt);
  if (item.seq_im >= 0) prefetch_span<Cfg>(u + item.seq_im * p.u_batch_stride, bytes, pt);
  if (item.channel != resident) {
    prefetch_span<Cfg>(FilterImages<Cfg>::words(p.workspace, item.channel), int(Cfg::kImageBytes), pt);
  }
}

// fn(k1, k) for the spectrum's words (k1, k2 = pt), k1 = 0 .. n1/2 in order: thread pt takes
// column pt of every row, with the loads of kBatch rows in flight before the first is used
// (not one round trip a word).
template <class Cfg, class Fn>
__device__ __forceinline__ void for_each_filter_word(const float2* spec, int pt, Fn&& fn) {
  static_assert(Cfg::kN2 == Cfg::kWarpgroup, "a producer thread per column");
  constexpr int kBatch = 4, kBatched = Cfg::kFilterRows / kBatch * kBatch;  // rows 0 .. 63; row 64 alone
  const float2* row = spec + pt;  // the word of row k1
#pragma unroll 1
  for (int k1 = 0; k1 < kBatched; k1 += kBatch, row += kBatch * Cfg::kN2) {
    float2 k[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) k[b] = __ldg(row + b * Cfg::kN2);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) fn(k1 + b, k[b]);
  }
#pragma unroll
  for (int k1 = kBatched; k1 < Cfg::kFilterRows; ++k1, row += Cfg::kN2) fn(k1, __ldg(row));
}

// The channel's spectrum into the resident buffer: (K + D/N)·2^e in T, e such that the largest
// component lies in [2^-p, 2^(1-p)), p = EngineTraits::kFilterPeakExponent (0 if it is zero or
// not finite), and 2^-e split between the hand-off and y (EngineTraits::kHandoffExponent). An fp32
// peak gives e in [-127 - p, 149 - p]: 2^e itself overflows from e = 128 (a peak below 2^-(127+p);
// 0·inf made such a channel NaN), so it is applied as two normal factors, 2^(e/2) then the rest,
// exact wherever the result is normal; the hand-off's share is kept at least -127, so both
// unscales are powers of two in [2^-136, 2^127]. filter_image_kernel composes the pieces below,
// a CTA a channel, before the engine runs. (Until session 36 the producer made the same words in
// two passes over the spectrum at each channel change, 16% of its time; the consumers waited for
// it 10.8% of theirs. The image and one bulk copy measured 6.6% faster at 16x256x8192.)
struct FilterScale {
  float skip;  // D/N
  int e;
};
template <class Cfg>
__device__ __forceinline__ float filter_skip(const ConvForwardParams& p, int c) {
  return p.skip != nullptr ? __ldg(p.skip + c) / float(Cfg::kN) : 0.0f;
}
// The largest component of thread pt's column k2 = pt, or +inf if one is not finite.
template <class Cfg>
__device__ __forceinline__ float filter_column_peak(const ConvForwardParams& p, int c, float skip, int pt) {
  float peak = 0.0f;
  for_each_filter_word<Cfg>(channel_spectrum<Cfg>(p, c), pt, [&](int, float2 k) {
    peak = fmaxf(peak, fmaxf(fabsf(k.x + skip), fabsf(k.y)));  // fmaxf drops NaN: checked below
    if (!isfinite(k.x + skip) || !isfinite(k.y)) peak = INFINITY;
  });
#pragma unroll
  for (int o = 16; o > 0; o /= 2) peak = fmaxf(peak, __shfl_xor_sync(0xffffffffu, peak, o));
  return peak;  // the warp's
}
template <class Cfg>
__device__ __forceinline__ int filter_exponent(float peak) {
  int e = 0;
  if (peak > 0.0f && isfinite(peak)) {
    int x;
    frexpf(peak, &x);  // peak = m·2^x, m in [0.5, 1)
    e = 1 - x - Cfg::kFilterPeakExponent;
  }
  return e;
}
// The channel's words (k1, k2 = pt), k1 = 0 .. n1/2, as fn(word index, packed word).
template <class Cfg, class Fn>
__device__ __forceinline__ void for_each_scaled_word(const ConvForwardParams& p, int c, FilterScale scale, int pt,
                                                     Fn&& fn) {
  using T = typename Cfg::T;
  const float skip = scale.skip;
  const float scale_lo = ldexpf(1.0f, scale.e / 2), scale_hi = ldexpf(1.0f, scale.e - scale.e / 2);
  for_each_filter_word<Cfg>(channel_spectrum<Cfg>(p, c), pt, [&](int k1, float2 k) {
    fn(filter_word<Cfg::kN2>(k1, pt), pack2<T>((k.x + skip) * scale_lo * scale_hi, k.y * scale_lo * scale_hi));
  });
}
template <class Cfg>
__device__ __forceinline__ FilterUnscales filter_unscales(int e) {
  int to_handoff = min(e, Cfg::kHandoffExponent);
  if constexpr (Cfg::kFilterPeakExponent > 0) to_handoff = max(to_handoff, -127);  // e reaches -127 - p
  return FilterUnscales{ldexpf(1.0f, -to_handoff), ldexpf(1.0f, to_handoff - e)};
}

// One CTA of kWarpgroup threads a channel: its peak, exponent, scaled words and unscales, into
// the channel's image (FilterImages).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kWarpgroup) filter_image_kernel(const ConvForwardParams p) {
  __shared__ float peaks[Cfg::kWarpgroup / 32];
  const int c = blockIdx.x, pt = threadIdx.x;
  const float skip = filter_skip<Cfg>(p, c);
  const float warp_peak = filter_column_peak<Cfg>(p, c, skip, pt);
  if (pt % 32 == 0) peaks[pt / 32] = warp_peak;
  __syncthreads();
  const float peak = fmaxf(fmaxf(peaks[0], peaks[1]), fmaxf(peaks[2], peaks[3]));
  const FilterScale scale{skip, filter_exponent<Cfg>(peak)};
  uint32_t* image = FilterImages<Cfg>::words(p.workspace, c);
  for_each_scaled_word<Cfg>(p, c, scale, pt, [&](int word, uint32_t value) { image[word] = value; });
  if (pt == 0) {
    const FilterUnscales unscale = filter_unscales<Cfg>(scale.e);
    *reinterpret_cast<float4*>(image + Cfg::kFilterWords) = make_float4(unscale.handoff, unscale.output, 0.0f, 0.0f);
  }
  if constexpr (Cfg::kTwiddleTable) {  // the consumers' seeds, spread over every channel's CTA
    float2* table = FilterImages<Cfg>::twiddles(p.workspace, p.channels);
    for (int64_t e = int64_t(c) * Cfg::kWarpgroup + pt; e < Cfg::kN; e += int64_t(gridDim.x) * Cfg::kWarpgroup)
      table[e] = omega<Cfg::kN>(int(e));
  }
}

// The producer's thread 0: once the consumers have released the buffer (filter_free's phase of
// `parity`), the channel's image, words and unscales, by one bulk copy that completes
// filter_full (one arrival and the copy's bytes). The consumers read the old filter through the
// generic proxy and the copy writes through the async proxy: the proxy fence orders the two.
template <class Cfg>
__device__ __forceinline__ void filter_copy(const ConvForwardParams& p, int c, typename Cfg::Smem& sm,
                                            uint32_t parity) {
  mbar_wait(&sm.filter_free, parity);
  fence_proxy_async();
  mbar_arrive_expect_tx(&sm.filter_full, Cfg::kImageBytes);
  bulk_copy_to_shared(smem_address(sm.filter), FilterImages<Cfg>::words(p.workspace, c), Cfg::kImageBytes,
                      &sm.filter_full);
}

// The producer warpgroup: the CTA's jobs in order, each as a checked item; after the next
// item is out, the previous checked item's flag decides its unpacked rerun (two items).
template <class Cfg>
__device__ void producer(const ConvForwardParams& p, typename Cfg::Smem& sm, int job_begin, int job_end) {
  const int pt = threadIdx.x % Cfg::kWarpgroup;
  const int batch = int(p.batch);    // 32-bit: the dispatch holds batch·channels below 2^31
  // Every 16-byte vector load_planes reads is aligned: u's base, and each row's start (its
  // strides in whole 16-byte vectors; t0 steps by 8 samples).
  const bool vec_ok = (reinterpret_cast<uintptr_t>(p.u) % 16) == 0 && p.u_batch_stride % Cfg::kSamplesPer16B == 0 &&
                      p.u_channel_stride % Cfg::kSamplesPer16B == 0;
  uint32_t emitted = 0;          // items out: item n in stage n % 2
  uint32_t done_parity = 0;      // bit s: the parity of done[s]'s next phase (a register, not a local array)
  uint32_t filter_loads = 0;
  FilterPlan plan;               // the resident filter's flags (engine_traits.cuh)
  const bool early_release = p.engine_early_filter_release;

  // release_after: the CTA's next job is another channel's, so this item may release the filter
  // once read (with early_release only; reruns pass false).
  auto emit = [&](Item item, bool release_after) {
    const int stage = emitted % Cfg::kStages;
    mbar_wait(&sm.empty[stage], ((emitted / Cfg::kStages) & 1) ^ 1);
    if (item.channel >= 0) {
      load_planes<Cfg>(p, item, vec_ok, smem_address(sm.ring[stage][0]), smem_address(sm.ring[stage][1]), pt);
    }
    // The flags after the loads (fewer registers live through them: the producer has 40).
    if (item.channel >= 0) item.flags |= plan.flags(item.channel, release_after);
    if (pt == 0) sm.item[stage] = item;
    fence_proxy_async();  // the planes, for stage 1's wgmma
    mbar_arrive(&sm.full[stage]);
    ++emitted;
    if (item.flags & kItemLoad) {
      // Load n waits for the n-th release (phase n - 1 of filter_free; load 0 for none: a fresh
      // barrier's parity 1 counts as complete). That release is this item's kItemReleaseFirst or
      // an earlier item's kItemReleaseAfter, made by consumers that need nothing more from the
      // producer than the items already published: no cycle (FilterPlan).
      if (pt == 0) filter_copy<Cfg>(p, item.channel, sm, (filter_loads & 1) ^ 1);
      ++filter_loads;
    }
    return stage;
  };
  // After the item that follows it is out: the checked item's flag; a non-finite output of a
  // pair of two sequences is computed again, each sequence alone. The flag is cleared here,
  // once every producer thread has read it, not when its stage is next emitted: a rerun is
  // emitted into the stage of the checked item after it, whose flag is still to be read.
  auto settle = [&](int stage, Item item) {
    mbar_wait(&sm.done[stage], (done_parity >> stage) & 1);
    done_parity ^= 1u << stage;
    const bool flagged = *reinterpret_cast<volatile uint32_t*>(&sm.nonfinite[stage]) != 0;
    named_sync(Cfg::kBarProducer, Cfg::kWarpgroup);
    if (pt == 0) sm.nonfinite[stage] = 0;  // published to the consumers by the next full arrive
    if (flagged && item.seq_im >= 0) {
      emit(Item{item.channel, item.seq_re, -1, 0}, false);
      emit(Item{item.channel, item.seq_im, -1, 0}, false);
    }
  };

  int pending_stage = -1;  // the previous job's: its item is made again from its index
  int job = job_begin;
#pragma unroll 1
  for (; job < job_end; ++job) {
    const Item item = job_item(job, batch);
    // Before this item waits for its stage: the next one's loads then hit L2.
    if (job + 1 < job_end) prefetch_item<Cfg>(p, job_item(job + 1, batch), item.channel, pt);
    const bool last_of_channel = job + 1 < job_end && job_item(job + 1, batch).channel != item.channel;
    const int stage = emit(item, early_release && last_of_channel);
    if (pending_stage >= 0) settle(pending_stage, job_item(job - 1, batch));
    pending_stage = stage;
  }
  if (pending_stage >= 0) settle(pending_stage, job_item(job - 1, batch));
  emit(Item{-1, -1, -1, 0}, false);
}

}  // namespace engine
}  // namespace monarch_fftconv
