// monarch_fftconv: the traits of the Hopper tensor-core engine (tc/engine_kernel.cuh; design in
// docs/design.md, "The next tensor-core engine"): its wgmma operations, and EngineTraits, the one
// home of its constants and its shared-memory layout. Split 128 x 128 (N = 16384) only, so far.
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "fftconv.h"
#include "common/limits.cuh"
#include "tc/io_traits.cuh"

// Where each channel's scaled filter spectrum peaks: [2^-p, 2^(1-p)) for p = this (docs/design.md,
// "fp16's range"). 7 (the default since session 30) gives the engine's fp16 the mma.sync kernel's
// ceiling: on the CPU model the first constant input at L = 8192 that overflows, one tap /
// exp(-t/500), is 1024 / 262 (the mma.sync kernel's own), against 8 / 4 at p = 0; that is what put
// fp16 back on the engine's route (backends.ENGINE_ROUTE_PRECISIONS, tc/dispatch.cu). Its cost:
// the floor's error at rms(u) = 1e-5 about 2x p = 0's (the model); in time, 16 instructions of the
// producer's once a channel (nvdisasm, session 29; predicted unchanged). Measured (session 30, H200,
// 16x256x8192, the engine requested, builds at 0 and 7 in alternating processes): the same time
// (fp16 0.2693/0.2686 against 0.2688/0.2683 ms; 2.547/2.577 against 2.548/2.530 at 64x768x8192);
// fp16 inputs of mean 8-200 finite (p = 0: inf/NaN from 8); the unit-scale error unchanged; the
// error at rms(u) = 1e-5 1.8e-3 -> 6.2e-3 (3.4x; the model said 2x); bf16 bit for bit. The GPU
// tests pass at 7 (H100). 0 is the old default (every GPU run through session
// 29); the switch stays for that A/B: build with
// MONARCH_FFTCONV_NVCC_DEFINES=MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT=0 (such a build's fp16
// overflows from a mean of 4-8: keep it off the route, ENGINE_ROUTE_PRECISIONS = ("bf16",)).
#ifndef MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT
#define MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT 7
#endif

// MONARCH_FFTCONV_ENGINE_TWIDDLE_TABLE=1 (a build switch, session 38; unmeasured, off): the
// consumers' twiddle seeds, exp(-2 pi i e / N) for about 15 angles e a job and thread, read from a
// table of all N of them (128 KB, after the filter images in the call's workspace, written by
// filter_image_kernel with the same omega<N>, so the same bits) instead of a sincospif each. ncu
// (session 37, H100, 16x256x8192): the seeds were 1,363 of the consumers' 15,923 PC samples
// (8.6%); after session 38's paired loads the producer no longer sets the pace alone. Predicted −2
// to −5% at 16x256x8192 (an L2 round trip an epilogue, where the sincospif chain issued ~40
// instructions a seed).
#ifndef MONARCH_FFTCONV_ENGINE_TWIDDLE_TABLE
#define MONARCH_FFTCONV_ENGINE_TWIDDLE_TABLE 0
#endif

// MONARCH_FFTCONV_ENGINE_PRODUCER_REGS (a build switch, session 39; unmeasured: 40 until measured,
// 56 the value to measure): the producer warpgroup's registers after setmaxnreg; the consumers get
// the rest of the pool (EngineTraits::kConsumerRegs), 232 at 40, 224 at 56. SASS (sm_90a, nvcc
// 13.0), the bf16 instance with fp32 I/O: at 40 the producer's code holds 92 spill instructions
// (ptxas 122/264 B; ncu, session 37: 187,612 spill requests, all the producer's, which sets the
// pace at 16x256x8192: the consumers wait on the ring 16.7% of their samples); at 56 none, in 118
// fewer instructions, and the consumers' code grows by 12 (4,980 -> 4,992, no spills; at 72/216
// by 224). Predicted: the bf16 forward at 16x256x8192 −3 to −8% (0.248 ms, H100).
#ifndef MONARCH_FFTCONV_ENGINE_PRODUCER_REGS
#define MONARCH_FFTCONV_ENGINE_PRODUCER_REGS 40
#endif

// MONARCH_FFTCONV_ENGINE_LOADS_IN_FLIGHT (a build switch, session 40; unmeasured: 4 until
// measured, 8 the value to measure, with PRODUCER_REGS=72): the 16-byte loads of u a producer
// thread issues before it uses any (load_planes). At 4 a warpgroup has 8 KB in flight; ncu (session
// 37, H100, 16x256x8192) put 52.8% of the producer's samples on the first use of those loads (long
// scoreboard) and the producer sets the pace, ~6 us of loads an item: 64 KB in 8 round trips,
// which is Little's law at ~0.8 us a round trip. At 8: 16 KB in flight, half the round trips, 16
// registers more a producer thread (the raw vectors): at 56 the producer's code spills 106-338 B
// a thread, at 72 (the consumers 216) the fp32-I/O instances spill nothing (tests/test_build.py).
// Predicted: the bf16 forward at 16x256x8192 −4 to −10% against PRODUCER_REGS=56 alone (the
// consumers then set the pace: their ring `full` wait was 16.7% of their samples).
#ifndef MONARCH_FFTCONV_ENGINE_LOADS_IN_FLIGHT
#define MONARCH_FFTCONV_ENGINE_LOADS_IN_FLIGHT 4
#endif

namespace monarch_fftconv {
namespace engine {

using namespace cute;
using GM = GMMA::Major;
using GS = GMMA::ScaleIn;

// The operand type and the three wgmma shapes the engine issues (fp32 accumulators):
//   Wide:  m64 n128 k16, both operands in shared memory (stage 1);
//   Narrow: m64 n64 k16, both in shared memory (inverse 1);
//   Chained: m64 n64 k16, A from registers (stage 2, inverse 2: the previous accumulator).
template <Precision P> struct Ops;
template <> struct Ops<Precision::kBF16> {
  using T = cute::bfloat16_t;
  template <GM A, GM B, GS S = GS::One> using Wide = SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<A, B, S>;
  template <GM A, GM B, GS S = GS::One> using Narrow = SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<A, B, S>;
  template <GS S = GS::One> using Chained = SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<GM::K, GM::K, S>;
  template <GM A, GM B> using WideAtom = SM90_64x128x16_F32BF16BF16_SS<A, B>;
  template <GM A, GM B> using NarrowAtom = SM90_64x64x16_F32BF16BF16_SS<A, B>;
};
template <> struct Ops<Precision::kFP16> {
  using T = cute::half_t;
  template <GM A, GM B, GS S = GS::One> using Wide = SM90::GMMA::MMA_64x128x16_F32F16F16_SS<A, B, S>;
  template <GM A, GM B, GS S = GS::One> using Narrow = SM90::GMMA::MMA_64x64x16_F32F16F16_SS<A, B, S>;
  template <GS S = GS::One> using Chained = SM90::GMMA::MMA_64x64x16_F32F16F16_RS<GM::K, GM::K, S>;
  template <GM A, GM B> using WideAtom = SM90_64x128x16_F32F16F16_SS<A, B>;
  template <GM A, GM B> using NarrowAtom = SM90_64x64x16_F32F16F16_SS<A, B>;
};

// One unit of the producer's stream, published with its ring stage: which sequences of which
// channel fill Zr and Zi, where Re and Im go, whether the output is checked for non-finite
// values (a packed pair: a flagged one is run again, one sequence at a time, as two unchecked
// items), and what the item does with the resident filter (FilterPlan). channel < 0 ends the
// stream.
struct Item {
  int32_t channel;
  int32_t seq_re;  // batch index of Zr's sequence, also where Re is stored
  int32_t seq_im;  // batch index of Zi's sequence, or -1 (zeros; Im is not stored)
  uint32_t flags;  // kItem* bits
};
constexpr uint32_t kItemChecked = 1u;        // the output is checked (settle may rerun it)
constexpr uint32_t kItemLoad = 2u;           // the producer loads this item's filter: wait filter_full before reading it
constexpr uint32_t kItemReleaseFirst = 4u;   // release the filter held so far, at the item's start
constexpr uint32_t kItemReleaseAfter = 8u;   // release this item's filter once read (after its hand-off)

// The resident filter's protocol, decided by the producer alone and carried by each item's flags
// (host and device: tests/engine_tables_check.cu runs it against a model of the two mbarriers).
// The buffer goes: free -> loaded (producer: wait filter_free, store, arrive filter_full; the
// consumers wait filter_full in the item with kItemLoad) -> read by items of its channel ->
// released (the consumers' 8 warps arrive filter_free once: phase r of filter_free completes at
// the r-th release) -> free. Load n waits for phase n - 1, parity (n & 1) ^ 1; a fresh barrier
// counts as having completed the phase of parity 1, so load 0 does not wait. Every load but the
// first is preceded by exactly one release, of the load before it:
//   - an item whose channel is not the one resident loads it (kItemLoad); if the previous filter
//     is still held, this item releases it first (kItemReleaseFirst): at its start, the consumers
//     have finished every earlier item, so nothing reads the old filter any more (the first
//     build's rule, the default);
//   - with release_after (engine_early_filter_release: the producer knows the CTA's next job is
//     another channel's) the item releases its own filter after its last read (kItemReleaseAfter),
//     and the buffer is free for the next load while this item's inverse 1 and store run.
// A rerun (settle) is an item like any other: it loads its channel again if released.
struct FilterPlan {
  int resident = -1;  // the channel loaded and not released, or -1 (free)
  __host__ __device__ uint32_t flags(int channel, bool release_after) {
    uint32_t f = 0;
    if (channel != resident) f |= kItemLoad | (resident >= 0 ? kItemReleaseFirst : 0u);
    if (release_after) f |= kItemReleaseAfter;
    resident = release_after ? -1 : channel;
    return f;
  }
};

// ---------------------------------------------------------------------------
// The engine's integer index maps, host and device: tests/engine_layout_check.cu checks them on
// the host against the PTX ISA's fragment layouts (written there independently) and CuTe's.
// ---------------------------------------------------------------------------
// The wgmma m64nNk16 fp32 accumulator: thread t of the warpgroup (q = t % 4) holds, as value
// acc_value(j, h, e), row acc_row(t, h) and column acc_col(q, j, e).
__host__ __device__ constexpr int acc_value(int j, int h, int e) { return 4 * j + 2 * h + e; }
__host__ __device__ constexpr int acc_row(int t, int h) { return 16 * (t / 32) + (t % 32) / 4 + 8 * h; }
__host__ __device__ constexpr int acc_col(int q, int j, int e) { return 8 * j + 2 * q + e; }
// The chaining: the values acc_value(j, h, 0..1), packed (e = 0 low), are register
// operand_register(j, h) of the next wgmma's register A operand (four a k step).
__host__ __device__ constexpr int operand_register(int j, int h) { return 2 * j + h; }

// The conjugate columns: stage 2's and inverse 2's column c in [0, n2/2) also gives column
// mirror_column(c) (c = 0: the real column n2/2, from the sine slot).
template <int kN2>
__host__ __device__ constexpr int mirror_column(int c) { return c == 0 ? kN2 / 2 : kN2 - c; }
// Inverse 2's A operand column 8m + 2q + e, m >= n2/16, is the mirror made by lane
// mirror_lane(q, e) of the same quad at its column group mirror_group(m); but lane q = 0's even
// column is its own mirror, at group mirror_own_group(m) (m = n2/16: column n2/2, made at c = 0).
__host__ __device__ constexpr int mirror_lane(int q, int e) { return e == 0 ? (4 - q) & 3 : 3 - q; }
template <int kN2>
__host__ __device__ constexpr int mirror_group(int m) { return kN2 / 8 - 1 - m; }
template <int kN2>
__host__ __device__ constexpr int mirror_own_group(int m) { return (kN2 / 8 - m) % (kN2 / 16); }

// The resident filter's word of (k1, k2), k1 <= n1/2: row-dependent XOR on bits 0, 3, 4 of the
// column, so that a warp's reads (rows g = lane/4, columns 2q + e + 8j) spread over the banks.
__host__ __device__ constexpr int filter_row_xor(int k1) { return (k1 & 1) | ((k1 & 6) << 2); }
template <int kN2>
__host__ __device__ constexpr int filter_word(int k1, int k2) {
  return k1 * kN2 + (k2 ^ filter_row_xor(k1));
}
// Row k1 of all n1: rows above n1/2 are read as conj K[n1 - k1][n2 - 1 - k2], and
// n2 - 1 - k2 = k2 ^ (n2 - 1), so a row is a stored row, an XOR mask on the column and a sign.
template <int kN1>
__host__ __device__ constexpr bool filter_mirrored(int k1) { return k1 > kN1 / 2; }
template <int kN1>
__host__ __device__ constexpr int filter_stored_row(int k1) { return filter_mirrored<kN1>(k1) ? kN1 - k1 : k1; }
template <int kN1, int kN2>
__host__ __device__ constexpr int filter_read_mask(int k1) {
  return filter_row_xor(filter_stored_row<kN1>(k1)) ^ (filter_mirrored<kN1>(k1) ? kN2 - 1 : 0);
}

// The persistent schedule: jobs channel-major, job j is channel j / J, pairs (2i, 2i + 1) with
// i = j % J, J = ceil(batch / 2); an odd batch's last partner is none (-1: zeros). CTA i of G
// takes [job_begin(T, i, G), job_begin(T, i + 1, G)).
__host__ __device__ constexpr int64_t jobs_per_channel(int64_t batch) { return (batch + 1) / 2; }
__host__ __device__ constexpr int64_t job_begin(int64_t jobs, int64_t cta, int64_t ctas) { return jobs * cta / ctas; }
__host__ __device__ constexpr Item job_item(int job, int batch) {
  const int pairs = int(jobs_per_channel(batch)), a = 2 * (job % pairs);
  return Item{job / pairs, a, a + 1 < batch ? a + 1 : -1, kItemChecked};
}

// Element offset of (i, j) in a GMMA 128-byte-swizzled layout of 16-bit elements, host and
// device: the layout's unswizzled offset, then the swizzle
// (16-byte chunk ^= 128-byte row, mod 8), which the smem tensors apply to addresses.
template <class SwizzledLayout>
__host__ __device__ inline uint32_t sw128_offset(SwizzledLayout const& layout, int i, int j) {
  return Swizzle<3, 3, 3>{}(uint32_t(layout.layout_b()(i, j)));
}

// ---------------------------------------------------------------------------
// The traits. Per job: one packed pair z = u_a + i·u_b (n1 = 128: a pair's 128 spectrum rows
// are the job's, rows k1 < 64 in consumer warpgroup 0, k1 >= 64 in consumer warpgroup 1).
//
// Shared memory (operand type T unless said; GMMA 128-byte swizzles):
//   f1c, f1s (128 k1, 64 r)  K-major  cos, sin(2 pi k1 r / 128): stage 1's A (rows of the tile);
//                                      inverse 1 reads the same bytes as (r, k1), MN-major
//   f2c, f2s (64 j, 128 s)   K-major  cos, sin(2 pi s j / 128), j < 64; f2s's j = 0 holds (-1)^s,
//                                      column n2/2's cosines: stage 2 and inverse 2's B
//   handoff  2 x (128 s, 128 k1) MN-major  inverse 2's output (re, im): inverse 1's B
//   ring     2 stages x 2 x (128 s, 64 r) MN-major  Zr, Zi: stage 1's B
//   filter   (65 k1, 128 k2) words of (re, im) in T, XOR-swizzled: the channel's half rows,
//            (K + D/N)·2^e
// ---------------------------------------------------------------------------
template <Precision P_, IOType IO_>
struct EngineTraits {
  using Io = tc::IoTraits<IO_>;
  using IoT = typename Io::T;  // u's and y's element in global memory
  static constexpr bool kHalfIo = sizeof(IoT) == 2;
  // A 16-byte vector of u: kU8PerThread samples of 2 bytes, or half of them in fp32.
  static constexpr int kSamplesPer16B = 16 / int(sizeof(IoT));
  using O = Ops<P_>;
  using T = typename O::T;

  using N1 = _128;         // stage-1 DFT: rows r (time) / k1 (frequency)
  using N2 = _128;         // stage-2 DFT: columns s (time) / k2 (frequency)
  using TileRows = _64;    // wgmma's M: a consumer warpgroup's rows k1, and the input rows r < n1/2
  using HalfCols = _64;    // n2/2: the F2 half columns j, and a warpgroup's output columns s
  static constexpr int kN1 = N1::value, kN2 = N2::value, kN = kN1 * kN2;
  static constexpr int kTileRows = TileRows::value, kHalfCols = HalfCols::value;
  static constexpr int kInputRows = kN1 / 2;      // u lives in rows r < 64 (L <= N/2)
  static constexpr int kFilterRows = kN1 / 2 + 1;  // the contract's half rows k1 = 0 .. 64
  static constexpr int kKStep = 16;                // wgmma's K for 16-bit operands

  static constexpr int kWarpgroup = 128;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = kWarpgroup * (1 + kConsumers);  // producer first, then consumers
  // setmaxnreg only moves registers inside the CTA's pool, which ptxas fixes at entry: with
  // __launch_bounds__(kThreads, 1) a thread starts with the most a 384-thread CTA may hold,
  // rounded down to the allocation granule (8), 168. The split must fit that pool, not the
  // 65,536 of the SM: 48/232 asked 1,024 more than the producer gave back, and one consumer
  // warp spun in setmaxnreg.inc forever (tests/test_build.py reads ptxas's count at entry).
  static constexpr int kRegsAtEntry = (65536 / kThreads) / 8 * 8;
  static constexpr int kProducerRegs = MONARCH_FFTCONV_ENGINE_PRODUCER_REGS;
  // the rest of the pool, down to the granule: 232 at 40, 224 at 56
  static constexpr int kConsumerRegs =
      (kThreads * kRegsAtEntry - kWarpgroup * kProducerRegs) / (kConsumers * kWarpgroup) / 8 * 8;
  static_assert(kConsumers * kWarpgroup * kConsumerRegs + kWarpgroup * kProducerRegs <= kThreads * kRegsAtEntry,
                "the register split after setmaxnreg must fit the CTA's pool at entry");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kProducerRegs >= 24 && kConsumerRegs <= 256,
                "setmaxnreg takes multiples of 8 in [24, 256]");
  static constexpr int kStages = 2;  // the ring
  static constexpr int kU8PerThread = 8;  // consecutive samples a producer thread loads and stores (16 B)
  // A plane's kU8PerThread-sample chunks, and the 16-byte loads of u a chunk takes: 2 (fp32) or 1.
  static constexpr int kChunksPerPlane = kInputRows * kN2 / kU8PerThread;  // 1024
  static constexpr int kVectorsPerChunk = kU8PerThread / kSamplesPer16B;
  // 16-byte loads of u a producer thread issues before using any: for each of the item's two
  // sequences, kLoadsInFlight / 2 vectors (whole chunks)
  static constexpr int kLoadsInFlight = MONARCH_FFTCONV_ENGINE_LOADS_IN_FLIGHT;
  static constexpr int kChunksInFlight = kLoadsInFlight / 2 / kVectorsPerChunk;
  static_assert(kChunksInFlight >= 1 && kChunksInFlight * 2 * kVectorsPerChunk == kLoadsInFlight &&
                    kChunksPerPlane % (kChunksInFlight * kWarpgroup) == 0,
                "whole chunks of both sequences a round, whole rounds a plane");
  // The filter is resident as (K + D/N)·2^e, largest component in [2^-p, 2^(1-p)), p =
  // kFilterPeakExponent. Of the 2^-e that undoes it, the 16-bit hand-off takes at most
  // 2^-kHandoffExponent and y the rest (fp32, exact): a tiny channel's hand-off then holds the
  // values of a filter peaking at 2^-(13+p) (2^-13 at p = 0: the benchmark's, randn/sqrt(L), in
  // budget on the H100) instead of underflowing (fp16 lost every output of a filter scaled by
  // 1e-20 with all of 2^-e in the hand-off). Larger filters are unchanged.
  static constexpr int kHandoffExponent = 13;
  // The filter's peak lies in [2^-kFilterPeakExponent, 2^(1-kFilterPeakExponent)) once scaled. At 7
  // (the default) fp16 overflows where the mma.sync kernel's does; at 0 the filtered spectrum is as
  // large as u's, whose DC bin Σu overflows fp16 from a mean of 4-8 at L = 8192 (the macro above).
  static constexpr int kFilterPeakExponent = MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT;
  static_assert(kFilterPeakExponent >= 0 && kFilterPeakExponent <= 10, "a peak between 2^-10 and 2");
  // The resident filter comes from a workspace of channel images (filter_image_kernel): a
  // channel's image is the resident buffer's words and then its 16 bytes of unscales, as they
  // lie in Smem (filter, then the unscales): one bulk copy of kImageBytes brings both.
  static constexpr int kFilterWords = kFilterRows * kN2;
  static constexpr uint32_t kFilterBytes = kFilterWords * sizeof(uint32_t);  // 33,280
  static constexpr uint32_t kUnscaleBytes = 16;                              // two floats, padded
  static constexpr uint32_t kImageBytes = kFilterBytes + kUnscaleBytes;
  // The twiddle table after the images (MONARCH_FFTCONV_ENGINE_TWIDDLE_TABLE): omega<kN>(e), e < kN.
  static constexpr bool kTwiddleTable = MONARCH_FFTCONV_ENGINE_TWIDDLE_TABLE != 0;
  static constexpr uint32_t kTwiddleTableBytes = kTwiddleTable ? kN * sizeof(float2) : 0;
  static_assert(kFilterBytes % 16 == 0 && kImageBytes % 16 == 0, "the bulk copy moves multiples of 16 bytes");

  // Named barriers (0 is __syncthreads). rows_ready(w): warpgroup w's hand-off rows are stored;
  // handoff_free(w): the partner has read them, w may write the next job's; own_rows(w): all of
  // w's warps have stored (and fenced) their rows, before w's own wgmma reads them.
  static constexpr int kBarProducer = 1;
  static constexpr int barrier_rows_ready(int wg) { return 2 + wg; }
  static constexpr int barrier_handoff_free(int wg) { return 4 + wg; }
  static constexpr int barrier_own_rows(int wg) { return 6 + wg; }

  // Shared-memory layouts, as (N or M, K) of the GEMMs that read them.
  using LayoutF1 = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<N1, TileRows>{}));   // (k1, r)
  using LayoutF1T = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<TileRows, N1>{})); // (r, k1)
  using LayoutF2 = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<HalfCols, N2>{}));   // (j, s|k2)
  using LayoutRing = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<N2, TileRows>{})); // (s, r)
  using LayoutHandoff = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<N2, N1>{}));  // (s, k1)
  static_assert(cosize(LayoutF1{}) == cosize(LayoutF1T{}), "inverse 1 reads F1's bytes transposed");

  // The producer's and the hand-off's stores: element offsets into a ring plane and a hand-off plane.
  __host__ __device__ static uint32_t ring_offset(int s, int r) { return sw128_offset(LayoutRing{}, s, r); }
  __host__ __device__ static uint32_t handoff_offset(int s, int k1) { return sw128_offset(LayoutHandoff{}, s, k1); }

  static constexpr int kF1Elems = kN1 * kTileRows;
  static constexpr int kF2Elems = kHalfCols * kN2;
  static constexpr int kRingElems = kN2 * kInputRows;
  static constexpr int kHandoffElems = kN2 * kN1;

  // A consumer thread's hand-off store addresses (handoff_store), as a per-thread base XOR a
  // per-column constant, so that each of its 48 stores a row costs one or two integer
  // instructions instead of the general map. The thread of row k1 and lane q stores the pair of
  // columns c = 8j + 2q (and c + 1), and the mirrors 128 - c - e (c = 0, e = 0: column 64).
  // Why it holds: the swizzle XORs k1 % 8 into the 16-byte chunk, so for s < 64
  // handoff_offset(s, k1) = handoff_offset(0, k1) ^ s, and s >= 64 adds 512 (its own atom), so
  // the map is a row part XOR a column part; and on a plane base that is a multiple of 1024
  // bytes, adding the base commutes with an XOR of the bits below 128 (j's chunk). The mirror
  // 128 - c (e = 0) is XOR-shaped only for q > 0 (lane q = 0 wraps to column 64 at j = 0): it
  // takes a subtraction and a mask. tests/engine_layout_check.cu checks every address against
  // handoff_offset.
  static constexpr uint32_t kHandoffPlaneBytes = kHandoffElems * sizeof(T);  // im = re + this
  static constexpr uint32_t kChunkBytes = 8 * sizeof(T);                     // one j: 8 columns
  struct HandoffAddresses {
    uint32_t pair;         // columns 2q, 2q + 1; column group j: pair ^ j's chunk
    uint32_t mirror_odd;   // column 127 - 2q; group j: ^ j's chunk
    uint32_t mirror_even;  // column 64; group j: ^ ((even_low - j's chunk) & the in-atom bits)
    uint32_t even_low;     // (n2 - 2q) columns' bytes: less j's chunk, masked, column 128 - c's in its atom
    __host__ __device__ HandoffAddresses(uint32_t plane, int q, int k1)
        : pair(plane + 2 * handoff_offset(2 * q, k1)),
          mirror_odd(plane + 2 * handoff_offset(kN2 - 1 - 2 * q, k1)),
          mirror_even(plane + 2 * handoff_offset(kN2 / 2, k1)),
          even_low(uint32_t(kN2 - 2 * q) * sizeof(T)) {}
    __host__ __device__ uint32_t column_pair(int j) const { return pair ^ (j * kChunkBytes); }
    __host__ __device__ uint32_t mirror(int j, int e) const {
      constexpr uint32_t kInAtom = (kN2 / 2 - 1) * sizeof(T);  // 64 columns' bytes, less one
      return e == 1 ? mirror_odd ^ (j * kChunkBytes) : mirror_even ^ ((even_low - j * kChunkBytes) & kInAtom);
    }
  };

  struct alignas(1024) Smem {
    T f1c[kF1Elems];
    T f1s[kF1Elems];
    T f2c[kF2Elems];
    T f2s[kF2Elems];
    T handoff[2][kHandoffElems];         // re, im
    T ring[kStages][2][kRingElems];      // stage, (Zr, Zi)
    uint32_t filter[kFilterWords];       // (re, im) words
    // Right after the filter (an image's bulk copy writes both): 2^-min(e, kHandoffExponent), at
    // most 2^127 (filter_unscales), and the rest of 2^-e, for y.
    float handoff_unscale;
    float output_unscale;
    float unscale_pad[2];
    uint64_t full[kStages], empty[kStages], done[kStages];
    uint64_t filter_full, filter_free;
    Item item[kStages];
    uint32_t nonfinite[kStages];         // the checked item's flag
  };
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + the base's alignment slack

  static_assert(sizeof(T) == 2, "GMMA operands here are 16-bit");
  static_assert(offsetof(Smem, filter) % 16 == 0, "the bulk copy's destination is 16-byte aligned");
  static_assert(offsetof(Smem, handoff_unscale) == offsetof(Smem, filter) + kFilterBytes &&
                    offsetof(Smem, output_unscale) == offsetof(Smem, handoff_unscale) + sizeof(float) &&
                    sizeof(float) * 4 == kUnscaleBytes,
                "an image is the filter's words and its unscales as they lie in shared memory");
  static_assert(offsetof(Smem, handoff) % 1024 == 0 && kHandoffPlaneBytes % 1024 == 0,
                "HandoffAddresses folds the plane base into XORs of its low bits");
  static_assert(kSmemBytes <= max_smem_per_cta(1), "one CTA per SM, within 227 KB");
  static_assert(kN1 == 128 && kN2 == 128, "split 128 x 128: one pair a job");
  static_assert(kTileRows * kConsumers == kN1, "a tile per consumer warpgroup covers a pair's rows");
};

}  // namespace engine
}  // namespace monarch_fftconv
