// monarch_fftconv: the Hopper tensor-core engine's forward (docs/design.md, "The next tensor-core
// engine"; its float64 data flow: tests/test_tc_engine_dataflow.py), split 128 x 128
// (N = 16384), bf16/fp16 operands, fp32 accumulation, fp32 I/O.
//
// A persistent CTA of three warpgroups. The producer loads packed pairs z = u_a + i·u_b into a
// two-stage ring and the channel's filter spectrum into a resident buffer; two consumer
// warpgroups run per job: stage 1 (SS), twiddle, stage 2 (RS, A = stage 1's accumulator),
// filter, inverse 2 (RS), the one shared-memory hand-off, inverse 1 (SS), y_a = Re, y_b = Im.
// Traits: tc/engine_traits.cuh.
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "fftconv.h"
#include "tc/engine_traits.cuh"
#include "common/complex.cuh"
#include "common/ptx.cuh"
#include "common/residency.cuh"

namespace monarch_fftconv {
namespace engine {

using namespace cute;

// Two floats rounded to the operand type T (cute::bfloat16_t or cute::half_t), lo in the low
// half: one cvt instruction.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, cute::bfloat16_t>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(h);
  }
}

// ---------------------------------------------------------------------------
// Synchronisation: mbarriers (the ring, the filter, the non-finite flags), named barriers
// (between the consumer warpgroups), setmaxnreg, the proxy fence.
// ---------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// Waits until the phase of the given parity has completed (a fresh barrier's parity 1 has).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int kRegs> __device__ __forceinline__ void regs_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs> __device__ __forceinline__ void regs_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---------------------------------------------------------------------------
// wgmma on register arrays: the accumulators are plain float arrays (fully unrolled, so they
// stay in registers), the register A operand four packed words per k step.
// ---------------------------------------------------------------------------
template <class Op, int N, size_t... I>
__device__ __forceinline__ void ss_fma(uint64_t a, uint64_t b, float (&d)[N], GMMA::ScaleOut s, std::index_sequence<I...>) {
  Op::fma(a, b, d[I]..., s);
}
template <class Op, int N>
__device__ __forceinline__ void mma_ss(uint64_t a, uint64_t b, float (&d)[N], bool accumulate) {
  ss_fma<Op>(a, b, d, accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero, std::make_index_sequence<N>{});
}
template <class Op, int N, size_t... I>
__device__ __forceinline__ void rs_fma(const uint32_t* a, uint64_t b, float (&d)[N], GMMA::ScaleOut s,
                                       std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, d[I]..., s);
}
template <class Op, int N>
__device__ __forceinline__ void mma_rs(const uint32_t* a, uint64_t b, float (&d)[N], bool accumulate) {
  rs_fma<Op>(a, b, d, accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero, std::make_index_sequence<N>{});
}
// Keeps the compiler from moving register uses across a wgmma's issue and its wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// The shared-memory descriptors of a GEMM's operands, one per k step: fragment(0, 0, k).
template <class Atom, class Tensor_>
__device__ __forceinline__ auto descriptors_a(Tensor_ const& s) {
  auto thr = make_tiled_mma(Atom{}).get_slice(threadIdx.x % 128);
  return thr.make_fragment_A(thr.partition_A(s));
}
template <class Atom, class Tensor_>
__device__ __forceinline__ auto descriptors_b(Tensor_ const& s) {
  auto thr = make_tiled_mma(Atom{}).get_slice(threadIdx.x % 128);
  return thr.make_fragment_B(thr.partition_B(s));
}
// The base made opaque where it is used: otherwise the compiler makes every k step's
// descriptor up front, two registers each.
template <class Fragment>
__device__ __forceinline__ uint64_t desc_at(Fragment const& f, int k) {
  auto base = f.data();
  asm volatile("" : "+r"(base.desc_.reg32_[0]));
  return uint64_t(make_tensor(base, f.layout())(0, 0, k));
}

// ---------------------------------------------------------------------------
// Small fp32 helpers.
// ---------------------------------------------------------------------------
// exp(-2 pi i e / N) with e reduced mod N in integers: e / (N/2) is exact in fp32.
template <int kN>
__device__ __forceinline__ float2 omega(int e) {
  float sn, cs;
  sincospif(float(e & (kN - 1)) / float(kN / 2), &sn, &cs);
  return make_float2(cs, -sn);
}
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (std::is_same_v<T, cute::bfloat16_t>) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    __half2 h;
    reinterpret_cast<uint32_t&>(h) = w;
    return __half22float2(h);
  }
}
template <class T>
__device__ __forceinline__ uint16_t round1(float v) {
  return uint16_t(pack2<T>(v, 0.0f) & 0xffffu);
}
__device__ __forceinline__ void st_shared_u16(uint32_t address, uint16_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(address), "h"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t address, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ float4 ld_stream(const float* p) {  // read once: no L1 allocation
  float4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
}
// The two planes of a pair of packed (re, im) words: (re0, re1) and (im0, im1).
__device__ __forceinline__ uint32_t re_plane(uint32_t w0, uint32_t w1) { return __byte_perm(w0, w1, 0x5410); }
__device__ __forceinline__ uint32_t im_plane(uint32_t w0, uint32_t w1) { return __byte_perm(w0, w1, 0x7632); }

// ---------------------------------------------------------------------------
// The producer's loads.
// ---------------------------------------------------------------------------
// One sequence (or zeros, seq < 0) into a ring plane (s, r): sample t = 128 r + s, rounded,
// 16-byte stores of 8 consecutive s.
template <class Cfg>
__device__ __forceinline__ void load_plane(const ConvForwardParams& p, int seq, int c, bool vec_ok,
                                           uint32_t plane, int pt) {
  using T = typename Cfg::T;
  constexpr int kChunksPerRow = Cfg::kN2 / Cfg::kU8PerThread;  // 16
  constexpr int kChunks = Cfg::kInputRows * kChunksPerRow;      // 1024
  const int L = int(p.seq_len);
  const float* u = static_cast<const float*>(p.u) + (seq >= 0 ? seq * p.u_batch_stride + c * p.u_channel_stride : 0);
#pragma unroll 1
  for (int chunk = pt; chunk < kChunks; chunk += Cfg::kWarpgroup) {
    const int r = chunk / kChunksPerRow, s0 = (chunk % kChunksPerRow) * Cfg::kU8PerThread;
    const int t0 = r * Cfg::kN2 + s0;
    float v[8];
    if (seq >= 0 && vec_ok && t0 + 7 < L) {
      const float4 lo = ld_stream(u + t0), hi = ld_stream(u + t0 + 4);
      v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w;
      v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = (seq >= 0 && t0 + i < L) ? __ldg(u + t0 + i) : 0.0f;
    }
    st_shared_v4(plane + 2 * Cfg::ring_offset(s0, r),
                 make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7])));
  }
}

// The channel's spectrum, (n1/2 + 1) x n2 words (re, im).
template <class Cfg>
__device__ __forceinline__ const float2* channel_spectrum(const ConvForwardParams& p, int c) {
  return reinterpret_cast<const float2*>(p.filter_spectrum) + c * int64_t(Cfg::kFilterRows * Cfg::kN2);
}

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
// load_plane reads of each sequence, and the channel's spectrum unless it is `resident`.
template <class Cfg>
__device__ __forceinline__ void prefetch_item(const ConvForwardParams& p, const Item& item, int resident, int pt) {
  const float* u = static_cast<const float*>(p.u) + item.channel * p.u_channel_stride;
  const int bytes = int(min(p.seq_len, int64_t(Cfg::kInputRows * Cfg::kN2))) * int(sizeof(float));
  prefetch_span<Cfg>(u + item.seq_re * p.u_batch_stride, bytes, pt);
  if (item.seq_im >= 0) prefetch_span<Cfg>(u + item.seq_im * p.u_batch_stride, bytes, pt);
  if (item.channel != resident) {
    prefetch_span<Cfg>(channel_spectrum<Cfg>(p, item.channel), Cfg::kFilterRows * Cfg::kN2 * int(sizeof(float2)), pt);
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
// component lies in [1, 2) (0 if it is zero or not finite), and 2^-e split between the hand-off
// and y (EngineTraits::kHandoffExponent). An fp32 peak gives e in [-127, 149]: 2^e itself
// overflows from e = 128 (a peak below 2^-127; 0·inf made such a channel NaN), so it is applied
// as two normal factors, 2^(e/2) then the rest, exact wherever the result is normal; the two
// unscales are powers of two in [2^-136, 2^127]. Two passes: filter_peak reads only global
// memory and the producer's own sm.peak, so it runs while the consumers still use the
// previous channel's filter; filter_store after they release it.
struct FilterScale {
  float skip;  // D/N
  int e;
};
template <class Cfg>
__device__ __forceinline__ FilterScale filter_peak(const ConvForwardParams& p, int c, typename Cfg::Smem& sm, int pt) {
  const float skip = p.skip != nullptr ? __ldg(p.skip + c) / float(Cfg::kN) : 0.0f;
  float peak = 0.0f;
  for_each_filter_word<Cfg>(channel_spectrum<Cfg>(p, c), pt, [&](int, float2 k) {
    peak = fmaxf(peak, fmaxf(fabsf(k.x + skip), fabsf(k.y)));  // fmaxf drops NaN: checked below
    if (!isfinite(k.x + skip) || !isfinite(k.y)) peak = INFINITY;
  });
#pragma unroll
  for (int o = 16; o > 0; o /= 2) peak = fmaxf(peak, __shfl_xor_sync(0xffffffffu, peak, o));
  // Every producer thread has read the previous channel's peaks: with this pass ahead of
  // filter_free, nothing else orders those reads before these writes.
  named_sync(Cfg::kBarProducer, Cfg::kWarpgroup);
  if (pt % 32 == 0) st_shared(smem_address(&sm.peak[pt / 32]), __float_as_uint(peak));  // as filter_store's
  named_sync(Cfg::kBarProducer, Cfg::kWarpgroup);
  peak = fmaxf(fmaxf(sm.peak[0], sm.peak[1]), fmaxf(sm.peak[2], sm.peak[3]));
  int e = 0;
  if (peak > 0.0f && isfinite(peak)) {
    int x;
    frexpf(peak, &x);  // peak = m·2^x, m in [0.5, 1)
    e = 1 - x;
  }
  return FilterScale{skip, e};
}
template <class Cfg>
__device__ __forceinline__ void filter_store(const ConvForwardParams& p, int c, FilterScale scale,
                                             typename Cfg::Smem& sm, int pt) {
  using T = typename Cfg::T;
  const float skip = scale.skip;
  const int e = scale.e;
  const float scale_lo = ldexpf(1.0f, e / 2), scale_hi = ldexpf(1.0f, e - e / 2);
  const uint32_t filter = smem_address(sm.filter);  // 32-bit addresses: the producer has 40 registers
  for_each_filter_word<Cfg>(channel_spectrum<Cfg>(p, c), pt, [&](int k1, float2 k) {
    const uint32_t word = pack2<T>((k.x + skip) * scale_lo * scale_hi, k.y * scale_lo * scale_hi);
    st_shared(filter + 4 * filter_word<Cfg::kN2>(k1, pt), word);
  });
  if (pt == 0) {  // the previous channel's last job reads them until filter_free
    const int to_handoff = min(e, Cfg::kHandoffExponent);
    sm.handoff_unscale = ldexpf(1.0f, -to_handoff);
    sm.output_unscale = ldexpf(1.0f, to_handoff - e);
  }
}

// The producer warpgroup: the CTA's jobs in order, each as a checked item; after the next
// item is out, the previous checked item's flag decides its unpacked rerun (two items).
template <class Cfg>
__device__ void producer(const ConvForwardParams& p, typename Cfg::Smem& sm, int job_begin, int job_end) {
  const int pt = threadIdx.x % Cfg::kWarpgroup;
  const int batch = int(p.batch);    // 32-bit: the dispatch holds batch·channels below 2^31
  const bool vec_ok = (reinterpret_cast<uintptr_t>(p.u) % 16) == 0 && p.u_batch_stride % 4 == 0 &&
                      p.u_channel_stride % 4 == 0;
  uint32_t emitted = 0;          // items out: item n in stage n % 2
  uint32_t done_parity = 0;      // bit s: the parity of done[s]'s next phase (a register, not a local array)
  uint32_t filter_loads = 0;
  int resident = -1;

  auto emit = [&](Item item) {
    const int stage = emitted % Cfg::kStages;
    mbar_wait(&sm.empty[stage], ((emitted / Cfg::kStages) & 1) ^ 1);
    if (item.channel >= 0) {
      load_plane<Cfg>(p, item.seq_re, item.channel, vec_ok, smem_address(sm.ring[stage][0]), pt);
      load_plane<Cfg>(p, item.seq_im, item.channel, vec_ok, smem_address(sm.ring[stage][1]), pt);
    }
    if (pt == 0) sm.item[stage] = item;
    fence_proxy_async();  // the planes, for stage 1's wgmma
    mbar_arrive(&sm.full[stage]);
    ++emitted;
    if (item.channel >= 0 && item.channel != resident) {
      const FilterScale scale = filter_peak<Cfg>(p, item.channel, sm, pt);
      mbar_wait(&sm.filter_free, filter_loads & 1);  // the consumers release the buffer on this item
      filter_store<Cfg>(p, item.channel, scale, sm, pt);
      mbar_arrive(&sm.filter_full);
      ++filter_loads;
      resident = item.channel;
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
      emit(Item{item.channel, item.seq_re, -1, 0});
      emit(Item{item.channel, item.seq_im, -1, 0});
    }
  };

  int pending_stage = -1;  // the previous job's: its item is made again from its index
  int job = job_begin;
#pragma unroll 1
  for (; job < job_end; ++job) {
    const Item item = job_item(job, batch);
    // Before this item waits for its stage: the next one's loads then hit L2.
    if (job + 1 < job_end) prefetch_item<Cfg>(p, job_item(job + 1, batch), item.channel, pt);
    const int stage = emit(item);
    if (pending_stage >= 0) settle(pending_stage, job_item(job - 1, batch));
    pending_stage = stage;
  }
  if (pending_stage >= 0) settle(pending_stage, job_item(job - 1, batch));
  emit(Item{-1, -1, -1, 0});
}

// ---------------------------------------------------------------------------
// The consumer stages. Each thread of a consumer warpgroup holds, of every m64 accumulator,
// rows m_h = 16·warp + lane/4 + 8h (h = 0, 1) and columns 8j + 2q + e (q = lane % 4, e = 0, 1):
// value 4j + 2h + e. Packed in pairs (e = 0, 1), value pair 2r'.. is register r' = 2j + h of
// the next wgmma's A operand, k step r' / 4: the chaining of stage 1 -> 2 -> inverse 2.
// ---------------------------------------------------------------------------
struct Lane {
  int wg;     // consumer warpgroup: its tile is rows k1 in [64 wg, 64 wg + 64)
  int row0;   // m_0 within the tile
  int q;      // lane % 4
  int lane;
  // A copy the compiler cannot see through, made where an epilogue starts (after its GEMM's
  // wait): otherwise it computes the epilogue's addresses and twiddles before the GEMM, where
  // they hold registers beside the accumulators.
  __device__ __forceinline__ Lane opaque() const {
    Lane l = *this;
    asm volatile("" : "+r"(l.wg), "+r"(l.row0), "+r"(l.q), "+r"(l.lane));
    return l;
  }
};

// Stage 1: A = F1 · Z over r for the tile's rows; Re = C·Zr + S·Zi, Im = C·Zi - S·Zr.
template <class Cfg, class TF1, class TRing>
__device__ __forceinline__ void stage1(TF1 const& sF1cRows, TF1 const& sF1sRows, TRing const& sZr, TRing const& sZi,
                                       float (&re)[64], float (&im)[64]) {
  using O = typename Cfg::O;
  using Atom = typename O::template WideAtom<GM::K, GM::MN>;
  using Pos = typename O::template Wide<GM::K, GM::MN>;
  using Neg = typename O::template Wide<GM::K, GM::MN, GS::Neg>;
  auto fC = descriptors_a<Atom>(sF1cRows);
  auto fS = descriptors_a<Atom>(sF1sRows);
  auto fZr = descriptors_b<Atom>(sZr);
  auto fZi = descriptors_b<Atom>(sZi);
  CUTE_STATIC_ASSERT_V(size<2>(fC) == Int<Cfg::kInputRows / Cfg::kKStep>{});
  fence_regs(re);
  fence_regs(im);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int k = 0; k < size<2>(fC); ++k) {
    const uint64_t c = desc_at(fC, k), s = desc_at(fS, k), zr = desc_at(fZr, k), zi = desc_at(fZi, k);
    mma_ss<Pos>(c, zr, re, k > 0);
    mma_ss<Pos>(s, zi, re, true);
    mma_ss<Pos>(c, zi, im, k > 0);
    mma_ss<Neg>(s, zr, im, true);
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  fence_regs(re);
  fence_regs(im);
}

// Twiddle exp(-2 pi i k1 s / N) in fp32 (a recurrence along the thread's columns, seeded by
// sincospi), rounded into stage 2's A operand: 8 k steps of 4 words, a plane each.
template <class Cfg>
__device__ __forceinline__ void twiddle_to_operand(const float (&re)[64], const float (&im)[64], const Lane& lane_in,
                                                   uint32_t (&ar)[32], uint32_t (&ai)[32]) {
  const Lane ln = lane_in.opaque();
  using T = typename Cfg::T;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k1 = Cfg::kTileRows * ln.wg + ln.row0 + 8 * h;
    float2 cur = omega<Cfg::kN>(k1 * 2 * ln.q);
    const float2 step1 = omega<Cfg::kN>(k1), step8 = omega<Cfg::kN>(8 * k1);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int i = acc_value(j, h, 0);
      const float2 z0 = cmul(make_float2(re[i], im[i]), cur);
      const float2 z1 = cmul(make_float2(re[i + 1], im[i + 1]), cmul(cur, step1));
      ar[operand_register(j, h)] = pack2<T>(z0.x, z1.x);
      ai[operand_register(j, h)] = pack2<T>(z0.y, z1.y);
      cur = cmul(cur, step8);
    }
  }
}

// Stage 2 and inverse 2: the four real products of (R + iI) with the half-column tables,
// pc = R·C, qs = I·S, qc = I·C, ps = R·S; A from registers.
template <class Cfg, class TF2>
__device__ __forceinline__ void half_column_products(const uint32_t (&r)[32], const uint32_t (&i)[32],
                                                     TF2 const& sC, TF2 const& sS, float (&pc)[32], float (&qs)[32],
                                                     float (&qc)[32], float (&ps)[32]) {
  using O = typename Cfg::O;
  using Atom = typename O::template NarrowAtom<GM::K, GM::K>;
  using Op = typename O::template Chained<>;
  auto fC = descriptors_b<Atom>(sC);
  auto fS = descriptors_b<Atom>(sS);
  CUTE_STATIC_ASSERT_V(size<2>(fC) == Int<Cfg::kN2 / Cfg::kKStep>{});
  fence_regs(pc); fence_regs(qs); fence_regs(qc); fence_regs(ps);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int k = 0; k < size<2>(fC); ++k) {
    const uint64_t c = desc_at(fC, k), s = desc_at(fS, k);
    mma_rs<Op>(&r[4 * k], c, pc, k > 0);
    mma_rs<Op>(&i[4 * k], s, qs, k > 0);
    mma_rs<Op>(&i[4 * k], c, qc, k > 0);
    mma_rs<Op>(&r[4 * k], s, ps, k > 0);
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  fence_regs(pc); fence_regs(qs); fence_regs(qc); fence_regs(ps);
}

// The resident filter's row k1, any k1 (filter_read_mask: the mirrored rows above n1/2).
template <class Cfg>
struct FilterRow {
  const uint32_t* row;
  int mask;
  float im_sign;
  __device__ __forceinline__ FilterRow(const uint32_t* filter, int k1)
      : row(filter + filter_stored_row<Cfg::kN1>(k1) * Cfg::kN2),
        mask(filter_read_mask<Cfg::kN1, Cfg::kN2>(k1)),
        im_sign(filter_mirrored<Cfg::kN1>(k1) ? -1.0f : 1.0f) {}
  __device__ __forceinline__ float2 at(int k2) const {
    const float2 k = unpack2<typename Cfg::T>(row[k2 ^ mask]);
    return make_float2(k.x, im_sign * k.y);
  }
};

// After stage 2: columns c = 8j + 2q + e and their mirrors n2 - c (c = 0: column n2/2) times
// the filter, rounded. Direct columns are inverse 2's k steps 0-3 as they stand; a mirror
// column's value is in another lane of the quad, one shfl of a packed (re, im) word each.
template <class Cfg>
__device__ __forceinline__ void filter_to_operand(const float (&pc)[32], const float (&qs)[32], const float (&qc)[32],
                                                  const float (&ps)[32], const uint32_t* filter, const Lane& lane_in,
                                                  uint32_t (&pr)[32], uint32_t (&pi)[32]) {
  const Lane ln = lane_in.opaque();
  using T = typename Cfg::T;
  uint32_t mirror[8][2][2];  // [j][h][e]: packed (re, im) of column n2 - c
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const FilterRow<Cfg> filter_row(filter, Cfg::kTileRows * ln.wg + ln.row0 + 8 * h);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t direct[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int v = acc_value(j, h, e), c = acc_col(ln.q, j, e);
        float2 x = make_float2(pc[v] + qs[v], qc[v] - ps[v]);       // X[c]
        float2 xm = make_float2(pc[v] - qs[v], qc[v] + ps[v]);      // X[n2 - c]
        const int cm = mirror_column<Cfg::kN2>(c);
        if (c == 0) {                                                 // X[0], X[n2/2]
          x = make_float2(pc[v], qc[v]);
          xm = make_float2(ps[v], qs[v]);
        }
        const float2 y = cmul(x, filter_row.at(c));
        const float2 ym = cmul(xm, filter_row.at(cm));
        direct[e] = pack2<T>(y.x, y.y);
        mirror[j][h][e] = pack2<T>(ym.x, ym.y);
      }
      pr[operand_register(j, h)] = re_plane(direct[0], direct[1]);
      pi[operand_register(j, h)] = im_plane(direct[0], direct[1]);
    }
  }
  // Operand column 8m + 2q + e (m = 8..15): mirror_lane, mirror_group, mirror_own_group.
  const int quad = ln.lane & ~3;
  const int src_even = quad | mirror_lane(ln.q, 0), src_odd = quad | mirror_lane(ln.q, 1);
#pragma unroll
  for (int m = Cfg::kN2 / 16; m < Cfg::kN2 / 8; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t w0 = __shfl_sync(0xffffffffu, mirror[mirror_group<Cfg::kN2>(m)][h][0], src_even);
      const uint32_t w1 = __shfl_sync(0xffffffffu, mirror[mirror_group<Cfg::kN2>(m)][h][1], src_odd);
      if (ln.q == 0) w0 = mirror[mirror_own_group<Cfg::kN2>(m)][h][0];
      pr[operand_register(m, h)] = re_plane(w0, w1);
      pi[operand_register(m, h)] = im_plane(w0, w1);
    }
  }
}

// After inverse 2: A'[c], A'[n2 - c] times exp(+2 pi i k1 s / N) and the hand-off's share of
// 2^-e, rounded, stored as inverse 1's B: (s, k1) MN-major, this warpgroup's rows k1.
template <class Cfg>
__device__ __forceinline__ void handoff_store(const float (&pc)[32], const float (&qs)[32], const float (&qc)[32],
                                              const float (&ps)[32], float unscale, const Lane& lane_in, uint32_t handoff_re,
                                              uint32_t handoff_im) {
  const Lane ln = lane_in.opaque();
  using T = typename Cfg::T;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k1 = Cfg::kTileRows * ln.wg + ln.row0 + 8 * h;
    // Twiddle recurrences: up from s = 2q by 8, down from s = n2 - 2q by 8 (e = 1: one lower).
    float2 up = omega<Cfg::kN>(-k1 * 2 * ln.q), down = omega<Cfg::kN>(-k1 * (Cfg::kN2 - 2 * ln.q));
    const float2 up1 = omega<Cfg::kN>(-k1), up8 = omega<Cfg::kN>(-8 * k1);
    up = make_float2(up.x * unscale, up.y * unscale);
    down = make_float2(down.x * unscale, down.y * unscale);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float2 a[2], am[2], w[2], wm[2];
      w[0] = up;
      w[1] = cmul(up, up1);
      wm[0] = down;
      wm[1] = cmul_conj(down, up1);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int v = acc_value(j, h, e);
        a[e] = make_float2(pc[v] - qs[v], qc[v] + ps[v]);   // A'[c]
        am[e] = make_float2(pc[v] + qs[v], qc[v] - ps[v]);  // A'[n2 - c]
      }
      const int c = acc_col(ln.q, j, 0);
      if (c == 0) {  // A'[0], A'[n2/2]
        a[0] = make_float2(pc[acc_value(j, h, 0)], qc[acc_value(j, h, 0)]);
        am[0] = make_float2(ps[acc_value(j, h, 0)], qs[acc_value(j, h, 0)]);
        const float2 w64 = omega<Cfg::kN>(-k1 * (Cfg::kN2 / 2));
        wm[0] = make_float2(w64.x * unscale, w64.y * unscale);
      }
      const float2 y0 = cmul(a[0], w[0]), y1 = cmul(a[1], w[1]);
      const uint32_t at = 2 * Cfg::handoff_offset(c, k1);  // s = c, c + 1: adjacent
      st_shared(handoff_re + at, pack2<T>(y0.x, y1.x));
      st_shared(handoff_im + at, pack2<T>(y0.y, y1.y));
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float2 ym = cmul(am[e], wm[e]);
        const int cm = (c == 0 && e == 0) ? Cfg::kN2 / 2 : Cfg::kN2 - c - e;
        const uint32_t atm = 2 * Cfg::handoff_offset(cm, k1);
        st_shared_u16(handoff_re + atm, round1<T>(ym.x));
        st_shared_u16(handoff_im + atm, round1<T>(ym.y));
      }
      up = cmul(up, up8);
      down = cmul_conj(down, up8);
    }
  }
}

// Inverse 1: y = conj(F1) · A' over k1 for rows r < 64, this warpgroup's columns s;
// Re = C·A'r - S·A'i, Im = C·A'i + S·A'r. The k steps of its own rows first; the partner's
// after their barrier.
template <class Cfg, class TF1T, class THalf>
__device__ __forceinline__ void inverse1(TF1T const& sF1cT, TF1T const& sF1sT, THalf const& sBr, THalf const& sBi,
                                         int wg, float (&yr)[32], float (&yi)[32]) {
  using O = typename Cfg::O;
  using Atom = typename O::template NarrowAtom<GM::MN, GM::MN>;
  using Pos = typename O::template Narrow<GM::MN, GM::MN>;
  using Neg = typename O::template Narrow<GM::MN, GM::MN, GS::Neg>;
  auto fC = descriptors_a<Atom>(sF1cT);
  auto fS = descriptors_a<Atom>(sF1sT);
  auto fBr = descriptors_b<Atom>(sBr);
  auto fBi = descriptors_b<Atom>(sBi);
  constexpr int kSteps = Cfg::kN1 / Cfg::kKStep, kOwn = kSteps / Cfg::kConsumers;
  CUTE_STATIC_ASSERT_V(size<2>(fC) == Int<kSteps>{});
  fence_regs(yr);
  fence_regs(yi);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int half = 0; half < 2; ++half) {
    if (half == 1) named_sync(Cfg::barrier_rows_ready(1 - wg), 2 * Cfg::kWarpgroup);
    const int k0 = (half == 0 ? wg : 1 - wg) * kOwn;
    CUTE_UNROLL
    for (int kk = 0; kk < kOwn; ++kk) {
      const int k = k0 + kk;
      const uint64_t c = desc_at(fC, k), s = desc_at(fS, k), br = desc_at(fBr, k), bi = desc_at(fBi, k);
      const bool first = half == 0 && kk == 0;
      mma_ss<Pos>(c, br, yr, !first);
      mma_ss<Neg>(s, bi, yr, true);
      mma_ss<Pos>(c, bi, yi, !first);
      mma_ss<Pos>(s, br, yi, true);
    }
    warpgroup_commit_batch();
  }
  warpgroup_wait<0>();
  fence_regs(yr);
  fence_regs(yi);
}

// y_a = Re, y_b = Im (times y's share of 2^-e, exact) for t = 128 r + s < L; returns whether
// any stored value is not finite.
template <class Cfg>
__device__ __forceinline__ bool store_y(float (&yr)[32], float (&yi)[32], float unscale, const ConvForwardParams& p,
                                        const Item& item, const Lane& lane_in) {
  const Lane ln = lane_in.opaque();
  const int64_t L = p.seq_len;
  float* y = static_cast<float*>(p.y);
  float* ya = y + (int64_t(item.seq_re) * p.channels + item.channel) * L;
  float* yb = item.seq_im >= 0 ? y + (int64_t(item.seq_im) * p.channels + item.channel) * L : nullptr;
  bool bad = false;
#pragma unroll
  for (int v = 0; v < 32; ++v) {
    yr[v] *= unscale;
    yi[v] *= unscale;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = ln.row0 + 8 * h;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int v = acc_value(j, h, 0);
      const int64_t t = int64_t(r) * Cfg::kN2 + Cfg::kHalfCols * ln.wg + acc_col(ln.q, j, 0);
      const bool pair = t + 1 < L && (reinterpret_cast<uintptr_t>(ya + t) & 7) == 0 &&
                        (yb == nullptr || (reinterpret_cast<uintptr_t>(yb + t) & 7) == 0);
      if (pair) {
        __stcs(reinterpret_cast<float2*>(ya + t), make_float2(yr[v], yr[v + 1]));
        if (yb != nullptr) __stcs(reinterpret_cast<float2*>(yb + t), make_float2(yi[v], yi[v + 1]));
        bad |= !isfinite(yr[v]) || !isfinite(yr[v + 1]);
        if (yb != nullptr) bad |= !isfinite(yi[v]) || !isfinite(yi[v + 1]);
      } else {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (t + e < L) {
            __stcs(ya + t + e, yr[v + e]);
            bad |= !isfinite(yr[v + e]);
            if (yb != nullptr) {
              __stcs(yb + t + e, yi[v + e]);
              bad |= !isfinite(yi[v + e]);
            }
          }
        }
      }
    }
  }
  return bad;
}

// A consumer warpgroup: the items of the producer's stream, in order.
template <class Cfg>
__device__ void consumer(const ConvForwardParams& p, typename Cfg::Smem& sm, int wg) {
  const int lt = threadIdx.x % Cfg::kWarpgroup;
  const Lane ln{wg, acc_row(lt, 0), lt % 4, lt % 32};
  const bool lane0 = ln.lane == 0;

  Tensor sF1c = make_tensor(make_smem_ptr(sm.f1c), typename Cfg::LayoutF1{});    // (k1, r)
  Tensor sF1s = make_tensor(make_smem_ptr(sm.f1s), typename Cfg::LayoutF1{});
  Tensor sF1cT = make_tensor(make_smem_ptr(sm.f1c), typename Cfg::LayoutF1T{});  // (r, k1), same bytes
  Tensor sF1sT = make_tensor(make_smem_ptr(sm.f1s), typename Cfg::LayoutF1T{});
  Tensor sF2c = make_tensor(make_smem_ptr(sm.f2c), typename Cfg::LayoutF2{});    // (j, s|k2)
  Tensor sF2s = make_tensor(make_smem_ptr(sm.f2s), typename Cfg::LayoutF2{});
  using TileRows = Shape<typename Cfg::TileRows, typename Cfg::TileRows>;
  using TileHalf = Shape<typename Cfg::HalfCols, typename Cfg::N1>;
  Tensor sF1cRows = local_tile(sF1c, TileRows{}, make_coord(wg, 0));  // (64 k1 of the tile, 64 r)
  Tensor sF1sRows = local_tile(sF1s, TileRows{}, make_coord(wg, 0));
  Tensor sHr = make_tensor(make_smem_ptr(sm.handoff[0]), typename Cfg::LayoutHandoff{});  // (s, k1)
  Tensor sHi = make_tensor(make_smem_ptr(sm.handoff[1]), typename Cfg::LayoutHandoff{});
  Tensor sHrHalf = local_tile(sHr, TileHalf{}, make_coord(wg, 0));  // (64 s of this warpgroup, 128 k1)
  Tensor sHiHalf = local_tile(sHi, TileHalf{}, make_coord(wg, 0));
  const uint32_t handoff_re = smem_address(sm.handoff[0]), handoff_im = smem_address(sm.handoff[1]);

  uint32_t taken = 0, filter_epochs = 0;
  int resident = -1;
  named_arrive(Cfg::barrier_handoff_free(1 - wg), 2 * Cfg::kWarpgroup);  // the partner's first hand-off
#pragma unroll 1
  while (true) {
    const int stage = taken % Cfg::kStages;
    mbar_wait(&sm.full[stage], (taken / Cfg::kStages) & 1);
    const Item item = sm.item[stage];
    if (item.channel < 0) break;
    const bool new_channel = item.channel != resident;
    if (new_channel && lane0) mbar_arrive(&sm.filter_free);  // done with the previous channel's
    resident = item.channel;

    uint32_t pr[32], pi[32];
    {
      uint32_t ar[32], ai[32];
      {
        float re[64], im[64];
        Tensor sZr = make_tensor(make_smem_ptr(sm.ring[stage][0]), typename Cfg::LayoutRing{});  // (s, r)
        Tensor sZi = make_tensor(make_smem_ptr(sm.ring[stage][1]), typename Cfg::LayoutRing{});
        stage1<Cfg>(sF1cRows, sF1sRows, sZr, sZi, re, im);
        if (lane0) mbar_arrive(&sm.empty[stage]);
        twiddle_to_operand<Cfg>(re, im, ln, ar, ai);
      }
      float pc[32], qs[32], qc[32], ps[32];
      half_column_products<Cfg>(ar, ai, sF2c, sF2s, pc, qs, qc, ps);
      if (new_channel) mbar_wait(&sm.filter_full, filter_epochs++ & 1);
      filter_to_operand<Cfg>(pc, qs, qc, ps, sm.filter, ln, pr, pi);
    }
    {
      float pc[32], qs[32], qc[32], ps[32];
      half_column_products<Cfg>(pr, pi, sF2c, sF2s, pc, qs, qc, ps);
      named_sync(Cfg::barrier_handoff_free(wg), 2 * Cfg::kWarpgroup);
      handoff_store<Cfg>(pc, qs, qc, ps, sm.handoff_unscale, ln, handoff_re, handoff_im);
    }
    fence_proxy_async();
    named_arrive(Cfg::barrier_rows_ready(wg), 2 * Cfg::kWarpgroup);
    // wgmma orders no shared-memory writes of the other warps: inverse 1's own k steps read
    // every warp's rows, so the warpgroup meets first (wgmma reads the whole warpgroup's registers).
    named_sync(Cfg::barrier_own_rows(wg), Cfg::kWarpgroup);
    float yr[32], yi[32];
    inverse1<Cfg>(sF1cT, sF1sT, sHrHalf, sHiHalf, wg, yr, yi);
    named_arrive(Cfg::barrier_handoff_free(1 - wg), 2 * Cfg::kWarpgroup);
    const bool bad = store_y<Cfg>(yr, yi, sm.output_unscale, p, item, ln);
    if (item.checked) {
      const bool any = __any_sync(0xffffffffu, bad);
      if (lane0) {
        if (any) atomicOr(&sm.nonfinite[stage], 1u);
        mbar_arrive(&sm.done[stage]);
      }
    }
    ++taken;
  }
  // The partner's arrive after its last inverse 1 gave one more credit than there were jobs:
  // take it, so that no named barrier is left half arrived at exit.
  named_sync(Cfg::barrier_handoff_free(wg), 2 * Cfg::kWarpgroup);
}

// The DFT tables, once per CTA, from sincospi in double with the angle reduced in integers.
template <class Cfg>
__device__ __forceinline__ void build_tables(typename Cfg::Smem& sm) {
  using T = typename Cfg::T;
  Tensor sF1c = make_tensor(make_smem_ptr(sm.f1c), typename Cfg::LayoutF1{});
  Tensor sF1s = make_tensor(make_smem_ptr(sm.f1s), typename Cfg::LayoutF1{});
  Tensor sF2c = make_tensor(make_smem_ptr(sm.f2c), typename Cfg::LayoutF2{});
  Tensor sF2s = make_tensor(make_smem_ptr(sm.f2s), typename Cfg::LayoutF2{});
  for (int i = threadIdx.x; i < Cfg::kF1Elems; i += Cfg::kThreads) {
    const int k1 = i / Cfg::kInputRows, r = i % Cfg::kInputRows;
    double sn, cs;
    sincospi(double((k1 * r) % Cfg::kN1) / double(Cfg::kN1 / 2), &sn, &cs);
    sF1c(k1, r) = T(float(cs));
    sF1s(k1, r) = T(float(sn));
  }
  for (int i = threadIdx.x; i < Cfg::kF2Elems; i += Cfg::kThreads) {
    const int j = i / Cfg::kN2, s = i % Cfg::kN2;
    double sn, cs;
    sincospi(double((j * s) % Cfg::kN2) / double(Cfg::kN2 / 2), &sn, &cs);
    sF2c(j, s) = T(float(cs));
    sF2s(j, s) = T(j == 0 ? ((s & 1) ? -1.0f : 1.0f) : float(sn));  // column n2/2 in the zero sines' slot
  }
}

template <Precision P, IOType IO>
__global__ void __launch_bounds__(EngineTraits<P, IO>::kThreads, 1) engine_forward_kernel(const ConvForwardParams p) {
  using Cfg = EngineTraits<P, IO>;
  using Smem = typename Cfg::Smem;
  extern __shared__ uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  // The CTA's contiguous range of the T = C·J jobs, channel-major.
  const int64_t jobs = p.channels * jobs_per_channel(p.batch);
  const int begin = int(job_begin(jobs, blockIdx.x, gridDim.x)), end = int(job_begin(jobs, blockIdx.x + 1, gridDim.x));
  const int warpgroup = threadIdx.x / Cfg::kWarpgroup;
  // The first item's inputs come into L2 while the tables are built.
  if (warpgroup == 0 && begin < end) prefetch_item<Cfg>(p, job_item(begin, int(p.batch)), -1, threadIdx.x);

  build_tables<Cfg>(sm);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&sm.full[s], Cfg::kWarpgroup);      // every producer thread, after its stores
      mbar_init(&sm.empty[s], 4 * Cfg::kConsumers);  // every consumer warp, after stage 1
      mbar_init(&sm.done[s], 4 * Cfg::kConsumers);   // every consumer warp, after its y stores
    }
    mbar_init(&sm.filter_full, Cfg::kWarpgroup);
    mbar_init(&sm.filter_free, 4 * Cfg::kConsumers);
    for (int s = 0; s < Cfg::kStages; ++s) sm.nonfinite[s] = 0;  // cleared again as each is read
  }
  fence_proxy_async();  // the tables, for the wgmma
  __syncthreads();

  if (warpgroup == 0) {
    regs_down<Cfg::kProducerRegs>();
    producer<Cfg>(p, sm, begin, end);
  } else {
    regs_up<Cfg::kConsumerRegs>();
    consumer<Cfg>(p, sm, warpgroup - 1);
  }
}

template <Precision P, IOType IO>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream) {
  using Cfg = EngineTraits<P, IO>;
  constexpr auto kernel = &engine_forward_kernel<P, IO>;
  int ctas_per_sm = 0, sms = 0;
  cudaError_t err = residency<kernel>(Cfg::kThreads, Cfg::kSmemBytes, ctas_per_sm, sms);
  if (err != cudaSuccess) return err;
  const int64_t jobs = p.channels * jobs_per_channel(p.batch);
  const int64_t grid = jobs < int64_t(sms) ? jobs : int64_t(sms);
  if (grid == 0) return cudaSuccess;
  kernel<<<dim3(unsigned(grid)), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace engine
}  // namespace monarch_fftconv
