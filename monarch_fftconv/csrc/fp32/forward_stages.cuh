// monarch_fftconv: the stages of the fp32 forward kernel (fp32/forward_kernels.cuh), one function
// each, in the order the kernel runs them: the twiddle tables, the u prefetch, per sequence the
// forward p1 (global or prefetched u -> smem), the mid pass's filter stage, frequency pairs and
// inverse radix-16 butterflies, and the last inverse pass with the store of y. The algorithm and
// the shared-memory layout are described at the top of fp32/forward_kernels.cuh; the passes the
// kernel shares with the backward kernel (pass_smem, mid_forward, ...) are in fp32/radix.cuh.
// The kernel's PTX is the one it had as one body (every instantiation, instruction for
// instruction). That depends on what a stage is given: a forced-inline function is optimised
// on its own before it is inlined, and a pointer it receives is opaque there, so it folds the
// offsets of its accesses into a different address arithmetic. Where that happened, a stage
// derives the pointer itself, as the kernel did: u and y from b and c, the prefetch buffer
// from sm. Likewise the mid pass's butterflies j0, j1 are given to its stages (derived from tx
// there, j1·16 folds into other constants), and the prefetch's conditions stay in the kernel
// (inside prefetch_seq, the branches merge differently).
#pragma once

#include "fp32/radix.cuh"

#include <cstdint>
#include <type_traits>

namespace monarch_fftconv {
namespace {  // internal linkage: each kernel translation unit has its own copy
namespace fp32_detail {

// The gated kernel's arguments: KArgs and, for a training step, where z = conv(x) + D·x goes
// before the postgate (autograd saves it: dpostgate = dy ⊙ z). A type of its own, so that the
// ungated kernel's KArgs, and every other kernel's (GradArgs embeds KArgs), keep their layout.
struct GatedKArgs : KArgs {
  void* z;  // (B, C, L) contiguous, IO, or nullptr: not stored
};

// The ungated kernel's arguments: KArgs and the grouped bank's row shift (filter_row), a type of
// its own so that KArgs, and with it GatedKArgs, keep their layout (filter_row says why).
struct PlainKArgs : KArgs {
  int row_shift;  // ConvForwardParams::filter_row_shift
};

// The io types whose gated forward stores z: fp32, the training step's (backends.
// FUSED_GATE_IO_DTYPES). The 2-byte instances compile without the store: it grew their spills
// (N = 16384: 88/92 -> 288/284 B); the binding gives them no z.
template <typename IO>
constexpr bool kGatedStoresZ = std::is_same_v<IO, float>;

// Where, in a sequence's passes, the next sequence's u prefetch (2-byte io) is issued: any point
// after forward p1 has consumed the buffer. Earlier hides more of the load; later issues it where
// fewer values are live (the mid pass holds 64 complex values a thread), which decides spills.
enum class PrefetchPoint { kAfterFilterStage, kAfterMidInverse, kBeforeLastStore };

// For experiments (ptxas figures), -D overrides of the choices below: a point 0..2, a 0/1 skip.
#ifndef MONARCH_FFTCONV_FWD_PREFETCH_POINT
#define MONARCH_FFTCONV_FWD_PREFETCH_POINT -1
#endif
#ifndef MONARCH_FFTCONV_FWD_DIRECT_SKIP
#define MONARCH_FFTCONV_FWD_DIRECT_SKIP -1
#endif

// The forward kernel's io-dependent code choices, per FFT size N = 2^(LOGM+1) (one home for them):
// - kPrefetchPoint: where the next sequence's u prefetch is issued (2-byte io only);
// - kDirectSkip: whether the store's D·u form is compiled. The skip is always folded into the
//   spectrum (launch sets skip_fold), so the form never runs, but ptxas allocates around it.
// - kInverseTxFence, kLoopTxFence: whether the inverse passes take an opaque tx, and each
//   sequence of the loop one of its own (MONARCH_FFTCONV_TX_FENCES, fp32/radix_passes.cuh). The
//   inverse fence: every instance but the 2-byte plain uniform ones at N = 4096 and 8192 (their
//   loop's spill instructions rose, 47 -> 52 and 62 -> 67). The loop fence: the 2-byte ones (the
//   fp32 ones' spills rose with it, 0 -> 95 at N = 4096 beside the inverse fence).
// For the plain call's kernel with 2-byte io they are chosen by ptxas's spills (sm_90a, bytes
// stored/loaded a thread; each option compiled, session 24): N = 4096 and 8192 without the D·u
// form, N = 8192 prefetched after the mid pass (204/200 -> 108/168 prefetched after the filter
// stage, 140/240 after the mid pass; 544/564 -> 132/236); N = 16384 and
// 32768 with it, prefetched after the mid pass (84/68 -> 16/12, 128/160 -> 64/76); N <= 2048 as
// before (8/4; later points spill more). fp32 io, gated and own-path kernels: as before (fp32 io
// keeps the form: without it N <= 2048 spills more and runs slower).
template <int LOGM, typename IO, bool GATED, bool UNIFORM_PAIRS>
struct ForwardIoChoices {
  static constexpr bool kChosen = sizeof(IO) == 2 && !GATED && UNIFORM_PAIRS && LOGM >= 11 && LOGM <= 14;
  static constexpr PrefetchPoint kPrefetchPoint =
      MONARCH_FFTCONV_FWD_PREFETCH_POINT >= 0 ? static_cast<PrefetchPoint>(MONARCH_FFTCONV_FWD_PREFETCH_POINT)
      : kChosen && LOGM >= 12                 ? PrefetchPoint::kAfterMidInverse
                                              : PrefetchPoint::kAfterFilterStage;
  static constexpr bool kDirectSkip =
      MONARCH_FFTCONV_FWD_DIRECT_SKIP >= 0 ? MONARCH_FFTCONV_FWD_DIRECT_SKIP == 1 : !(kChosen && LOGM <= 12);
  static constexpr bool kInverseTxFence = MONARCH_FFTCONV_TX_FENCES != 0 && !(kChosen && (LOGM == 11 || LOGM == 12));
  static constexpr bool kLoopTxFence = MONARCH_FFTCONV_TX_FENCES != 0 && sizeof(IO) == 2;
};

// What the forward kernel takes: PlainKArgs, or GatedKArgs for the GATED instance.
template <bool GATED>
using ForwardArgs = std::conditional_t<GATED, GatedKArgs, PlainKArgs>;

// The row shift a forward instance reads its spectrum with: the gated ones take a row per channel.
template <bool GATED>
__device__ __forceinline__ int forward_row_shift(const ForwardArgs<GATED>& a) {
  if constexpr (GATED) return 0;
  else return a.row_shift;
}

// The CTA's twiddle tables, one per pass (built once per CTA: the grid is persistent).
struct ForwardTables {
  const float2* fp2;   // forward p2
  const float2* mid;   // mid pass (and, conjugated, the last inverse pass)
  const float2* post;  // real-FFT split ω_N^j
  const float2* ip2;   // inverse p2
};

template <int LOGM>
__device__ __forceinline__ ForwardTables build_forward_tables(float2* tw, int tid) {
  using P = Plan<LOGM>;
  build_twiddles<LOGM>(tw, tid, P::THREADS);
  __syncthreads();
  return {tw + P::OFF_FP2, tw + P::OFF_TM, tw + P::OFF_POST, tw + P::OFF_IP2};
}

// The sequence s of one slot: which it is, and how much of its u and y is read and written
// (the stages derive the pointers u and y from b and c themselves).
struct ForwardSeq {
  bool valid;          // s < nseq
  int64_t b, c;        // batch and channel (0 for an invalid slot)
  int Lv;              // valid length as int (L <= N/2 <= 16384); an invalid slot reads and writes nothing
  bool upair, ypair;   // u, y aligned for two-element accesses
};

// Sequence s's row of u, asked of L2 by `threads` threads (MONARCH_FFTCONV_GATED_L2_PREFETCH).
// (b, c) recomputed from s, here and in prefetch_gate_row: taking forward_seq's instead kept them
// live and raised the gated fp32 instances' spills (N = 16384: 40/44 -> 76/80 B; ptxas, session 38).
template <typename IO>
__device__ __forceinline__ void prefetch_u_row(const KArgs& a, int64_t s, int tx, int threads) {
  const int64_t b = s % a.B, c = s / a.B;
  prefetch_span_l2(static_cast<const IO*>(a.u) + b * a.ubs + c * a.ucs, a.L * (int64_t)sizeof(IO), tx, threads);
}

template <typename IO>
__device__ __forceinline__ ForwardSeq forward_seq(const KArgs& a, int64_t s, int64_t nseq) {
  const bool valid = s < nseq;
  int64_t b = 0, c = 0;
  if (valid) {
    b = s % a.B;
    c = s / a.B;
  }
  const IO* u = static_cast<const IO*>(a.u) + b * a.ubs + c * a.ucs;
  IO* y = static_cast<IO*>(a.y) + (b * a.C + c) * a.L;  // y is contiguous (B, C, L)
  const int Lv = valid ? (int)a.L : 0;
  const bool upair = (reinterpret_cast<uintptr_t>(u) & (2 * sizeof(IO) - 1)) == 0;
  const bool ypair = (reinterpret_cast<uintptr_t>(y) & (2 * sizeof(IO) - 1)) == 0;
  return {valid, b, c, Lv, upair, ypair};
}

// The u of sequence sq staged into the slot's prefetch buffer ubuf with cp.async, when it is
// 16-byte aligned: returns whether it is staged (else p1 reads it from global memory). The
// caller has checked that the prefetch is on and that sq exists.
template <int LOGM, typename IO>
__device__ __forceinline__ bool prefetch_seq(const KArgs& a, IO* ubuf, int64_t sq, int tx) {
  const int64_t bq = sq % a.B, cq = sq / a.B;
  const IO* p = static_cast<const IO*>(a.u) + bq * a.ubs + cq * a.ucs;
  const bool staged = (reinterpret_cast<uintptr_t>(p) & 15) == 0;
  if (staged) prefetch_u<IO, Plan<LOGM>::T>(ubuf, p, (int)a.L, tx);
  return staged;
}

// Forward p1: global (or, when pf_cur, the slot's prefetch buffer) -> smem, radix R1, NS = 1,
// upper half zero. Waits for the prefetch and synchronizes before its smem writes, so the
// previous sequence's last pass may still be reading smem when it is called. sm: the CTA's
// shared memory, in which the prefetch buffer is found as the kernel places it.
// GATED: x = pregate ⊙ u where a.pregate is given (the ungated instance is the kernel as it
// was, instruction for instruction).
template <int LOGM, typename IO, bool GATED>
__device__ __forceinline__ void forward_p1(const float* sm, float* re, float* im, int tx, const KArgs& a, bool pf_cur,
                                           const ForwardSeq& seq) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T;
  const int ty = threadIdx.y;
  const float2* tw = reinterpret_cast<const float2*>(sm + (size_t)P::SPB * 2 * a.S);
  const IO* ubuf = reinterpret_cast<const IO*>(tw + P::N_TW) + (size_t)ty * M;
  const int64_t b = seq.b, c = seq.c;
  const IO* u = static_cast<const IO*>(a.u) + b * a.ubs + c * a.ucs;
  const int Lv = seq.Lv;
  const bool upair = seq.upair;
  constexpr int R = P::R1, NB = 32 / R;
  cf v[NB][R];
  if (kPrefetchU<IO> && a.prefetch) {
    cp_async_wait_all();
    __syncthreads();  // every thread's part of the staged u is visible
  }
  const bool from_smem = kPrefetchU<IO> && pf_cur;
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T;
#pragma unroll
    for (int r = 0; r < R / 2; ++r) {
      const int t0 = 2 * (j + r * (M / R));
      if (from_smem) {
        if (t0 + 1 < Lv) {
          float2 x2;
          if constexpr (sizeof(IO) == 4) {
            x2 = *reinterpret_cast<const float2*>(ubuf + t0);
          } else if constexpr (std::is_same_v<IO, __nv_bfloat16>) {
            x2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(ubuf + t0));
          } else {
            x2 = __half22float2(*reinterpret_cast<const __half2*>(ubuf + t0));
          }
          v[q][r] = {x2.x, x2.y};
        } else {
          v[q][r].x = t0 < Lv ? io_to_float(ubuf[t0]) : 0.f;
          v[q][r].y = 0.f;
        }
      } else if (upair && t0 + 1 < Lv) {
        const float2 x2 = io_load2<IO>(u + t0);
        v[q][r] = {x2.x, x2.y};
      } else {
        v[q][r].x = t0 < Lv ? io_load<IO>(u + t0) : 0.f;
        v[q][r].y = t0 + 1 < Lv ? io_load<IO>(u + t0 + 1) : 0.f;
      }
    }
#pragma unroll
    for (int r = R / 2; r < R; ++r) v[q][r] = {0.f, 0.f};
  }
  if constexpr (GATED) {
    if (a.pregate != nullptr)
      apply_gate<T>(v, static_cast<const IO*>(a.pregate) + (b * a.C + c) * a.L, tx, M / R, Lv);
  }
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    if (q > 0) fence(v[q]);
    fft_reg<R, false, true>(v[q]);
    fence(v[q]);
  }
  __syncthreads();  // the previous sequence's last pass has read smem
  store_butterflies<T>(re, im, tx, v);
  __syncthreads();
}

// The channel's filter spectrum into the stage (cp.async, in its global order [k1][k2], rows
// padded to n2+1 float2), with the skip folded in; ends with a barrier. The caller has
// synchronized: all of Z is in registers, smem is free.
template <int LOGM>
__device__ __forceinline__ void stage_forward_filter(float2* stage, int tx, const KArgs& a, const ForwardSeq& seq,
                                                     int row_shift) {
  constexpr int T = Plan<LOGM>::T;
  const bool valid = seq.valid;
  const int64_t c = seq.c;
  if (valid) {
    const float2* Kc = filter_row(a, c, row_shift);
    const int total = stage_entries(a);
    const int rowp = a.n2 + 1;
    for (int e = tx; e < total; e += T)
      cp_async8(stage + (e >> a.ln2) * rowp + (e & (a.n2 - 1)), Kc + e);
  }
  cp_async_wait_all();
  if (a.skip != nullptr && a.skip_fold && valid) {
    // skip folded into the filter: K[f] += D/N for every f (1/N is a power of two: exact).
    // The real part of a stored entry is the real part of every K[f] read from it, also
    // of the conjugated ones. Each thread adjusts the entries it copied itself.
    const float dsk = a.skip[c] * (1.f / (float)a.N);
    const int total = (a.n1 / 2 + 1) * a.n2;
    const int rowp = a.n2 + 1;
    for (int e = tx; e < total; e += T) stage[(e >> a.ln2) * rowp + (e & (a.n2 - 1))].x += dsk;
  }
  __syncthreads();
}

// stage_forward_filter for the uniform instance: where n2 | T the copy goes by stepped pointers
// (stage_filter_begin_fixed_column, as in the uniform grad kernel), not by each entry's index
// arithmetic; the same entries to the same slots, the same skip fold, the same barrier.
template <int LOGM>
__device__ __forceinline__ void stage_forward_filter_uniform(float2* stage, int tx, const KArgs& a,
                                                             const ForwardSeq& seq, int row_shift) {
  constexpr int T = Plan<LOGM>::T;
  if (T % a.n2 == 0) stage_filter_begin_fixed_column<T>(stage, a, seq.c, row_shift, seq.valid, tx);
  else stage_filter_begin<T>(stage, a, seq.c, row_shift, seq.valid, tx);
  stage_filter_end<T>(stage, a, seq.c, a.skip_fold && seq.valid, tx);
}

// The frequency pairs of a thread j0 = tx != 0 where n1 | M/16: pairs (A[i], B[15-i]), k = j0 +
// i·NS, M-k = (M - j0) - i·NS. n1 | NS, so along i the filter row k1 (and so the conjugation) is
// fixed and k2 moves by ±NS/n1. wp0 = ω_N^j0.
template <int M>
__device__ __forceinline__ void mid_filter_pairs_walked(const float2* stage, const KArgs& a, int j0, cf wp0,
                                                        const cf (&A)[16], const cf (&Bv)[16], cf (&A2)[16],
                                                        cf (&B2)[16]) {
  constexpr int NS = M / 16;
  const KWalk kp(j0, +1, NS, a), kq(M - j0, -1, NS, a);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    pair_fn(A[i], Bv[15 - i], kp.at(stage, i), kq.at(stage, i), tw_const<false>(wp0, i, 32), A2[i], B2[15 - i]);
    if (i % kPairsPerFence == kPairsPerFence - 1) { fence(A2[i]); fence(B2[15 - i]); }
  }
}

// The mid pass's frequency pairs: from the forward radix-16 outputs A (butterfly j0 = tx) and
// Bv (j1), the split, the product with the staged filter and the merge, into the inputs A2, B2
// of the inverse radix-16 butterflies.
template <int M>
__device__ __forceinline__ void mid_filter_pairs(const float2* stage, const KArgs& a, int j0, int j1, const float2* twPost,
                                                 const cf (&A)[16], const cf (&Bv)[16], cf (&A2)[16], cf (&B2)[16]) {
  constexpr int NS = M / 16;
  const bool z = (j0 == 0);
  const float2 p0 = twPost[j0], p1 = twPost[j1];
  const cf wp0 = {p0.x, p0.y}, wp1 = {p1.x, p1.y};
  if (!z && a.n1 <= NS) {
    mid_filter_pairs_walked<M>(stage, a, j0, wp0, A, Bv, A2, B2);
  } else if (!z) {
    // pairs (A[i], B[15-i]): k = j0 + i·NS, M-k = j1 + (15-i)·NS
#pragma unroll
    for (int i = 0; i < 16; ++i) pair_at<M>(stage, a, i, j0 + i * NS, A[i], Bv[15 - i], wp0, A2[i], B2[15 - i]);
  } else {
    // thread 0 owns the self-paired butterflies j0 = 0 and j1 = M/32
    cf dummy;
    // k = 0 with M - k = M (Z[M] = Z[0])
    pair_fn(A[0], A[0], kspec(stage, 0, a), kspec(stage, M, a), cf{1.f, 0.f}, A2[0], dummy);
    // k = M/2 pairs with itself; ω_N^(N/4) = -i
    pair_fn(A[8], A[8], kspec(stage, M / 2, a), kspec(stage, M / 2, a), cf{0.f, -1.f}, A2[8], dummy);
#pragma unroll
    for (int i = 1; i < 8; ++i) pair_at<M>(stage, a, i, i * NS, A[i], A[16 - i], wp0, A2[i], A2[16 - i]);
#pragma unroll
    for (int i = 0; i < 8; ++i) pair_at<M>(stage, a, i, j1 + i * NS, Bv[i], Bv[15 - i], wp1, B2[i], B2[15 - i]);
  }
}

// Where the uniform instance leaves the warps without thread 0 on the plain sweep (its selects,
// ~140 instructions a thread, cost 7 and more such warps more than thread 0's own path costs its
// one; with 4 or fewer warps a sequence, the second path spilled more instead): N >= 16384.
template <int M>
constexpr bool kPlainPairWarps = M / 32 >= 256;

// mid_filter_pairs in one code path for every thread, thread 0 included
// (for_each_pair_uniform_moved): the warp that holds thread 0 no longer runs a second sweep (its
// self-paired k = 0 and M/2, its butterfly j1 = M/32) before mid_inverse's barrier. Every output
// is pair_fn of the same operands, twiddle and filter entries as in mid_filter_pairs, only picked
// by selects: the same bits. The twiddles are computed per sequence, one product a step
// (uniform_pair_twiddles_rotated: held across the loop, their 32 registers would spill under the
// 128-register cap); the filter is read by walks, which need n1 | M/16 (the launcher takes this
// instance only there).
template <int M>
__device__ __forceinline__ void mid_filter_pairs_uniform(const float2* stage, const KArgs& a, int tx,
                                                         const float2* twPost, const cf (&A)[16], const cf (&Bv)[16],
                                                         cf (&A2)[16], cf (&B2)[16]) {
  if (kPlainPairWarps<M> && tx >= 32) {
    // a warp without thread 0 (T = M/32 >= 256 threads a sequence: warp-aligned): no selects
    const float2 p0 = twPost[tx];
    mid_filter_pairs_walked<M>(stage, a, tx, cf{p0.x, p0.y}, A, Bv, A2, B2);
    return;
  }
  const float2 p0 = twPost[tx], p1 = twPost[tx == 0 ? M / 32 : M / 16 - tx];
  cf w[16];
  uniform_pair_twiddles_rotated(tx, cf{p0.x, p0.y}, cf{p1.x, p1.y}, w);
  int t = tx;
  fence(t);  // the walks computed per sequence: hoisted out of the loop, they held registers through it
  const UniformFilterWalks<M> walks(t, a);
  for_each_pair_uniform_moved<M>(tx, A, Bv, A2, B2, w, [&](int, int f, cf zk, cf zm, cf wk, cf& vk, cf& vm, auto step) {
    cf kk, km;
    if constexpr (step == kHalfPairStep) {
      kk = km = kspec(stage, f, a);  // thread 0's k = M/2, its own conjugate
    } else {
      kk = (step < 8 ? walks.k_lo : walks.k_hi).at(stage, step);
      km = (step < 8 ? walks.m_lo : walks.m_hi).at(stage, step);
    }
    pair_fn(zk, zm, kk, km, wk, vk, vm);
  });
}

// The last inverse pass: smem -> global, radix R1, NS = M/R1; only the causal half (y[t] for
// t < Lv) is stored, plus D·u there when the skip is not folded into the filter. GATED: y =
// postgate ⊙ (conv + D·x) where a.postgate is given (the skip is then always folded: the
// direct form would need x, not u), and z = conv + D·x also stored where a.z is given.
// UNIFORM_PAIRS: which kernel it is part of (ForwardIoChoices: whether the D·u form is built).
template <int LOGM, typename IO, bool GATED, bool UNIFORM_PAIRS>
__device__ __forceinline__ void last_inverse_store(const float* re, const float* im, int tx, const float2* twM,
                                                   const ForwardArgs<GATED>& a, const ForwardSeq& seq) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T;
  const bool valid = seq.valid, upair = seq.upair, ypair = seq.ypair;
  const int64_t b = seq.b, c = seq.c;
  const IO* u = static_cast<const IO*>(a.u) + b * a.ubs + c * a.ucs;
  IO* y = static_cast<IO*>(a.y) + (b * a.C + c) * a.L;  // y is contiguous (B, C, L)
  const int Lv = seq.Lv;
  constexpr int R = P::R1, NB = 32 / R, NS = M / R;
  cf v[NB][R];
  last_inverse_butterflies<LOGM>(re, im, tx, twM, v, [](int) {});
  if constexpr (GATED) {
    // z as y's row (contiguous like y: y's pair alignment), before the postgate multiplies v
    if constexpr (kGatedStoresZ<IO>) {
      if (a.z != nullptr) store_causal_half<T>(static_cast<IO*>(a.z) + (b * a.C + c) * a.L, v, tx, NS, Lv, seq.ypair);
    }
    if (a.postgate != nullptr)
      apply_gate<T>(v, static_cast<const IO*>(a.postgate) + (b * a.C + c) * a.L, tx, NS, Lv);
  }
  using Choices = ForwardIoChoices<LOGM, IO, GATED, UNIFORM_PAIRS>;
  const bool direct_skip = Choices::kDirectSkip && a.skip != nullptr && !a.skip_fold;
  const float sk = (direct_skip && valid) ? a.skip[c] : 0.f;
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const int j = tx + q * T;
#pragma unroll
    for (int r = 0; r < R / 2; ++r) {
      const int t0 = 2 * (j + r * NS);
      float y0 = v[q][r].x, y1 = v[q][r].y;
      // (upair first: the other order swaps the operands of an or in the PTX)
      if (upair && ypair && t0 + 1 < Lv) {
        if (direct_skip) {
          const float2 x2 = io_load2<IO>(u + t0);
          y0 = fmaf(sk, x2.x, y0);
          y1 = fmaf(sk, x2.y, y1);
        }
        io_store2<IO>(y + t0, y0, y1);
      } else {
        if (direct_skip) {
          if (t0 < Lv) y0 = fmaf(sk, io_load<IO>(u + t0), y0);
          if (t0 + 1 < Lv) y1 = fmaf(sk, io_load<IO>(u + t0 + 1), y1);
        }
        if (ypair && t0 + 1 < Lv) {
          io_store2<IO>(y + t0, y0, y1);
        } else {
          if (t0 < Lv) io_store<IO>(y + t0, y0);
          if (t0 + 1 < Lv) io_store<IO>(y + t0 + 1, y1);
        }
      }
    }
  }
}

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
