// monarch_fftconv, the fp32 radix library (fp32/radix.cuh): the mid pass's frequency pairs.
// The filter spectrum read by frequency from its staged copy (kspec, KWalk), the real-FFT
// split and its inverse, the pairs as the forward kernel assigns them to threads, and the
// copy of a channel's filter spectrum into shared memory (the stage).
#pragma once

#include "fp32/radix_dft.cuh"
#include "fp32/radix_memory.cuh"
#include "fp32/radix_plan.cuh"

#include <cstdint>

namespace monarch_fftconv {
namespace {  // internal linkage: each kernel translation unit has its own copy
namespace fp32_detail {

// The mid pass fences the outputs of every second frequency pair, so that the pairs' products
// are not all interleaved (register budget).
constexpr int kPairsPerFence = 2;

// filter spectrum at frequency f in [0, N/2], from the staged [k1][k2] copy
__device__ __forceinline__ cf kspec(const float2* stage, int f, const KArgs& a) {
  const int k1 = f & (a.n1 - 1);
  const bool dir = k1 <= (a.n1 >> 1);
  const int ff = dir ? f : a.N - f;
  const float2 v = stage[(ff & (a.n1 - 1)) * (a.n2 + 1) + (ff >> a.ln1)];
  return {v.x, dir ? v.y : -v.y};
}

// the filter spectrum along f = f0 + sgn·i·ns, i = 0, 1, ..., for n1 | ns: the row k1 and the
// conjugation are fixed, the column moves by ±ns/n1
struct KWalk {
  int base, step;
  bool neg;
  __host__ __device__ __forceinline__ KWalk(int f0, int sgn, int ns, const KArgs& a) {
    const int k1 = f0 & (a.n1 - 1);
    const bool dir = k1 <= (a.n1 >> 1);
    const int ff = dir ? f0 : a.N - f0;
    base = (ff & (a.n1 - 1)) * (a.n2 + 1) + (ff >> a.ln1);
    step = (dir ? sgn : -sgn) * (ns >> a.ln1);
    neg = !dir;
  }
  __device__ __forceinline__ cf at(const float2* stage, int i) const {
    const float2 v = stage[base + i * step];
    return {v.x, neg ? -v.y : v.y};
  }
};

// The real-FFT split of the frequency pair (k, M-k): the N-point spectrum X[k], X[M-k] of the
// real x from zk = Z[k], zm = Z[M-k] of the packed z[m] = x[2m] + i·x[2m+1] (Z[M] = Z[0]),
// w = ω_N^k.
__device__ __forceinline__ void split_pair(cf zk, cf zm, cf w, cf& xk, cf& xm) {
  const cf s = {zk.x + zm.x, zk.y - zm.y};  // Zk + conj Zm
  const cf d = {zk.x - zm.x, zk.y + zm.y};  // Zk - conj Zm
  const cf wd = cmul(w, d);
  const cf g = {-wd.y, wd.x};  // i·w·d
  xk = {0.5f * (s.x - g.x), 0.5f * (s.y - g.y)};
  xm = {0.5f * (s.x + g.x), -0.5f * (s.y + g.y)};  // conj(½(s + g))
}

// Its inverse: V[k], V[M-k] from the spectrum pair yk = Y[k], ym = Y[M-k], such that the
// unnormalised inverse M-point FFT of V packs the N-point inverse real FFT of Y (unnormalised).
__device__ __forceinline__ void merge_pair(cf yk, cf ym, cf w, cf& vk, cf& vm) {
  const cf s2 = {yk.x + ym.x, yk.y - ym.y};  // Yk + conj Ym
  const cf d2 = {yk.x - ym.x, yk.y + ym.y};  // Yk - conj Ym
  const cf cd = cmul(cconj(w), d2);
  const cf h = {-cd.y, cd.x};  // i·conj(w)·d2
  vk = {s2.x + h.x, s2.y + h.y};
  vm = {s2.x - h.x, -(s2.y - h.y)};  // conj(s2 - h)
}

// The split, the filter product (kk = K[k], km = K[M-k]) and the inverse split of one pair.
__device__ __forceinline__ void pair_fn(cf zk, cf zm, cf kk, cf km, cf w, cf& vk, cf& vm) {
  cf xk, xm;
  split_pair(zk, zm, w, xk, xm);
  merge_pair(cmul(xk, kk), cmul(xm, km), w, vk, vm);
}

// pair_fn for the frequency pair (f, M - f), the filter read by frequency from the stage;
// i: the pair's index along the butterfly, whose twiddle is w·W_32^i.
template <int M>
__device__ __forceinline__ void pair_at(const float2* stage, const KArgs& a, int i, int f, cf zk, cf zm, cf w,
                                        cf& vk, cf& vm) {
  fence(f);
  pair_fn(zk, zm, kspec(stage, f, a), kspec(stage, M - f, a), tw_const<false>(w, i, 32), vk, vm);
  if (i % kPairsPerFence == kPairsPerFence - 1) { fence(vk); fence(vm); }
}

// Mid-pass frequency pairs per thread: thread 0 owns two self-paired frequencies (0 with M,
// and M/2) and so 17 pairs; every other thread owns 16.
constexpr int kPairSlots = 17;

// The frequency pairs (k, M-k) of the mid pass as the forward kernel assigns them: for each,
// op(slot, k, Z[k], Z[M-k], ω_N^k, V[k], V[M-k]), where V lands in the register of the inverse
// radix-16 butterflies that read it. slot in [0, kPairSlots) numbers the thread's pairs.
template <int M, class Op>
__device__ __forceinline__ void for_each_pair(int tx, const cf (&A)[16], const cf (&Bv)[16], cf (&A2)[16],
                                              cf (&B2)[16], cf wp0, cf wp1, Op&& op) {
  constexpr int NS = M / 16;
  if (tx != 0) {
    // pairs (A[i], B[15-i]): k = tx + i·NS, M-k = j1 + (15-i)·NS
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      op(i, tx + i * NS, A[i], Bv[15 - i], tw_const<false>(wp0, i, 32), A2[i], B2[15 - i]);
      if (i % kPairsPerFence == kPairsPerFence - 1) { fence(A2[i]); fence(B2[15 - i]); }
    }
  } else {
    cf unused;
    op(0, 0, A[0], A[0], cf{1.f, 0.f}, A2[0], unused);        // k = 0 with M - k = M (Z[M] = Z[0])
    op(8, M / 2, A[8], A[8], cf{0.f, -1.f}, A2[8], unused);   // k = M/2 with itself; ω_N^(N/4) = -i
#pragma unroll
    for (int i = 1; i < 8; ++i) op(i, i * NS, A[i], A[16 - i], tw_const<false>(wp0, i, 32), A2[i], A2[16 - i]);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      op(9 + i, M / 32 + i * NS, Bv[i], Bv[15 - i], tw_const<false>(wp1, i, 32), B2[i], B2[15 - i]);
  }
}

// The same pairs in one code path (for_each_pair_uniform): every thread runs steps u = 0..15
// alike, thread 0 choosing by selects the operands, twiddle and slot of its own pair for step
// u, so that the warp holding it no longer runs a second copy of the sweep before the next
// barrier. Thread 0's pair k = M/2 (slot kHalfPairSlot) runs after the steps, on its own.
// Registers are numbered r in [0, 16) for A[r] (A2[r]) and r in [16, 32) for Bv[r-16] (B2[r-16]).
constexpr int kHalfPairSlot = 8;

// Step u of thread 0 (lane0) or of any other thread: the pair's slot, the registers of Z[k] and
// Z[M-k], and its twiddle tw_const(tw_base == 0 ? wp0 : wp1, tw_step, 32), or the constant 1
// where tw_base < 0 (k = 0, as for_each_pair passes it).
struct UniformPairStep {
  int slot, zk, zm, tw_base, tw_step;
  __host__ __device__ constexpr UniformPairStep(int u, bool lane0)
      : slot(lane0 && u >= 8 ? u + 1 : u),
        zk(lane0 && u >= 8 ? 16 + (u - 8) : u),
        zm(!lane0 ? 16 + (15 - u) : u < 8 ? (16 - u) & 15 : 16 + (23 - u)),
        tw_base(!lane0 ? 0 : u == 0 ? -1 : u < 8 ? 0 : 1),
        tw_step(lane0 && u >= 8 ? u - 8 : u) {}
};

// The frequency k of thread tx's step u.
template <int M>
__host__ __device__ constexpr int uniform_pair_freq(int u, int tx) {
  return tx == 0 && u >= 8 ? M / 32 + (u - 8) * (M / 16) : tx + u * (M / 16);
}

// Step u leaves V[k] in A2[u] and V[M-k] in B2[15-u] in every thread. Thread 0's inverse
// butterflies read them elsewhere: afterwards its register d takes the value of register
// lane0_output_source(d); -1 for A2[8], which its pair k = M/2 writes (thread 0's B2[15] at
// step 0, the V[M] of k = 0, is dropped, as for_each_pair drops it).
__host__ __device__ constexpr int lane0_output_source(int d) {
  return d < 8 ? d : d == 8 ? -1 : d < 16 ? 16 + (d - 1) : d - 8;
}

template <int R>
__device__ __forceinline__ cf& pair_register(cf (&lo)[16], cf (&hi)[16]) {
  if constexpr (R < 16) return lo[R]; else return hi[R - 16];
}
template <int R>
__device__ __forceinline__ const cf& pair_register(const cf (&lo)[16], const cf (&hi)[16]) {
  if constexpr (R < 16) return lo[R]; else return hi[R - 16];
}

// The twiddles of a thread's 16 steps (loop-invariant: computed once per kernel).
__device__ __forceinline__ void uniform_pair_twiddles(int tx, cf wp0, cf wp1, cf (&w)[16]) {
  const auto twiddle = [&](const UniformPairStep& s) {
    return s.tw_base < 0 ? cf{1.f, 0.f} : tw_const<false>(s.tw_base == 0 ? wp0 : wp1, s.tw_step, 32);
  };
  static_for<16>([&](auto step) {
    constexpr UniformPairStep s(step, false), s0(step, true);
    w[step] = tx == 0 ? twiddle(s0) : twiddle(s);
  });
}

// W_32^(m+8) = -i·W_32^m in the table, exactly, for m % 8 != 0 (tw_const's special cases, m % 8
// == 0, are exact in any case): W_32^(m+8)'s entries are W_32^m's swapped, one negated.
constexpr bool tw32_quarter_turn_exact() {
  constexpr Tw32Table t = make_tw32();
  for (int m = 0; m < 24; ++m)
    if (m % 8 != 0 && (t.c[m + 8] != t.s[m] || t.s[m + 8] != -t.c[m])) return false;
  return true;
}
static_assert(tw32_quarter_turn_exact(), "uniform_pair_twiddles_rotated needs W_32^(m+8) = -i·W_32^m in the table");

// uniform_pair_twiddles with one product a step (the forward kernel's: under its 128 registers,
// two products and a select for each step u >= 8 spilled ~100 more bytes at N = 8192). Thread
// 0's twiddle of u >= 8 is tw_const(wp1, u - 8), as before; the others' tw_const(wp0, u) comes as
// -i·tw_const(wp0, u - 8), the same bits: the table turns exactly (above), cmul(d, -i·w) =
// -i·cmul(d, w) exactly (fma and products are odd in each factor), and so does tw_const's
// h-form at m = 4 -> 12, but for the sign of an exact zero (-(x + y) against (-x) - y, RN), which
// needs Re(wp0·W_32^m) = 0 or wp0.x = -wp0.y: wp0 = ω_N^tx, 0 < tx < M/32, is within π/32 of 1.
__device__ __forceinline__ void uniform_pair_twiddles_rotated(int tx, cf wp0, cf wp1, cf (&w)[16]) {
  const bool lane0 = tx == 0;
  const cf hi = lane0 ? wp1 : wp0;  // the product's base at steps u >= 8
  static_for<16>([&](auto step) {
    constexpr int u = step;
    constexpr UniformPairStep s(u, false), s0(u, true);
    static_assert(s.tw_base == 0 && s.tw_step == u, "the other threads' twiddle is tw_const(wp0, u)");
    static_assert(u == 0 ? s0.tw_base < 0 : u < 8 ? s0.tw_base == 0 && s0.tw_step == u
                                                  : s0.tw_base == 1 && s0.tw_step == u - 8,
                  "thread 0's twiddles: 1, tw_const(wp0, u), tw_const(wp1, u - 8)");
    if constexpr (u == 0) {
      w[u] = lane0 ? cf{1.f, 0.f} : wp0;  // tw_const(wp0, 0) = wp0
    } else if constexpr (u < 8) {
      w[u] = tw_const<false>(wp0, u, 32);
    } else {
      const cf t = tw_const<false>(hi, u - 8, 32);
      w[u] = lane0 ? t : cf{t.y, -t.x};  // ·W_32^8 = ·(-i)
    }
  });
}

// The filter spectrum at a thread's uniform steps, by walks (KWalk), where n1 | M/16 (the
// launcher takes the uniform sweep only there): K[k] of step u is k_lo.at(u) for u < 8 and
// k_hi.at(u) for u >= 8, K[M-k] alike from m_lo, m_hi. The walks from k = tx serve every step
// but thread 0's u >= 8 (k = M/32 + (u-8)·M/16), whose walks are rebased so that u indexes them.
template <int M>
struct UniformFilterWalks {
  KWalk k_lo, m_lo, k_hi, m_hi;
  __host__ __device__ __forceinline__ UniformFilterWalks(int tx, const KArgs& a)
      : k_lo(tx, +1, M / 16, a),
        m_lo(M - tx, -1, M / 16, a),
        k_hi(tx == 0 ? rebased(KWalk(M / 32, +1, M / 16, a)) : k_lo),
        m_hi(tx == 0 ? rebased(KWalk(M - M / 32, -1, M / 16, a)) : m_lo) {}
  __host__ __device__ __forceinline__ static KWalk rebased(KWalk w) {
    w.base -= 8 * w.step;
    return w;
  }
};

// Thread 0's outputs to its butterflies' registers (lane0_output_source): selects, read before
// any is written. (for_each_pair_uniform keeps its own copy inline: as a call it changed the grad
// kernels' register allocation, which was measured as it is.)
__device__ __forceinline__ void lane0_move_outputs(bool lane0, cf (&A2)[16], cf (&B2)[16]) {
  cf moved[32];
  static_for<32>([&](auto d) {
    constexpr int src = lane0_output_source(d);
    if constexpr (src >= 0 && src != d) moved[d] = pair_register<src>(A2, B2);
  });
  static_for<32>([&](auto d) {
    constexpr int src = lane0_output_source(d);
    if constexpr (src >= 0 && src != d) {
      cf& out = pair_register<d>(A2, B2);
      out = lane0 ? moved[d] : out;
    }
  });
}

// op as for_each_pair calls it, on the same (slot, k, operands, twiddle, outputs) of every
// thread, and the same values: only the control flow differs; and the step, a compile-time
// u in [0, 16) or kHalfPairStep for thread 0's k = M/2. w from uniform_pair_twiddles.
constexpr int kHalfPairStep = 16;
template <int M, class Op>
__device__ __forceinline__ void for_each_pair_uniform(int tx, const cf (&A)[16], const cf (&Bv)[16], cf (&A2)[16],
                                                      cf (&B2)[16], const cf (&w)[16], Op&& op) {
  const bool lane0 = tx == 0;
  static_for<16>([&](auto step) {
    constexpr int u = step;
    constexpr UniformPairStep s(u, false), s0(u, true);
    const cf zk = lane0 ? pair_register<s0.zk>(A, Bv) : pair_register<s.zk>(A, Bv);
    const cf zm = lane0 ? pair_register<s0.zm>(A, Bv) : pair_register<s.zm>(A, Bv);
    op(lane0 ? s0.slot : s.slot, uniform_pair_freq<M>(u, tx), zk, zm, w[u], A2[u], B2[15 - u], step);
    if (u % kPairsPerFence == kPairsPerFence - 1) { fence(A2[u]); fence(B2[15 - u]); }
  });
  // Thread 0's outputs to its butterflies' registers: selects, read before any is written.
  cf moved[32];
  static_for<32>([&](auto d) {
    constexpr int src = lane0_output_source(d);
    if constexpr (src >= 0 && src != d) moved[d] = pair_register<src>(A2, B2);
  });
  static_for<32>([&](auto d) {
    constexpr int src = lane0_output_source(d);
    if constexpr (src >= 0 && src != d) {
      cf& out = pair_register<d>(A2, B2);
      out = lane0 ? moved[d] : out;
    }
  });
  if (lane0) {
    cf unused;
    // k = M/2 with itself; ω_N^(N/4) = -i
    op(kHalfPairSlot, M / 2, A[8], A[8], cf{0.f, -1.f}, A2[8], unused, std::integral_constant<int, kHalfPairStep>{});
  }
}

// The same sweep with thread 0's operands moved first (for the forward kernel's 128 registers):
// register d, which every thread reads at step u as Z[k] (d = u, A[u]) or Z[M-k] (d = 31 - u,
// Bv[15-u]), takes thread 0's operand of that step from register lane0_input_source(d) (-1: its
// own). Then every step reads the same registers in every thread, as for_each_pair's other
// threads do, and no operand outlives its step (in for_each_pair_uniform thread 0's Bv[8..15]
// live on to steps 8..15: ~16 more registers). A path, not a cycle: only A[8] is overwritten
// without being moved, and the pair k = M/2 reads it from A itself.
__host__ __device__ constexpr int lane0_input_source(int d) {
  const int u = d < 16 ? d : 31 - d;
  const UniformPairStep s(u, true);
  const int src = d < 16 ? s.zk : s.zm;
  return src == d ? -1 : src;
}

template <int M, class Op>
__device__ __forceinline__ void for_each_pair_uniform_moved(int tx, const cf (&A)[16], const cf (&Bv)[16],
                                                            cf (&A2)[16], cf (&B2)[16], const cf (&w)[16], Op&& op) {
  const bool lane0 = tx == 0;
  cf Z[32];  // the operands, A then Bv, thread 0's moved
  static_for<32>([&](auto d) {
    constexpr int src = lane0_input_source(d);
    const cf own = pair_register<d>(A, Bv);
    if constexpr (src >= 0) Z[d] = lane0 ? pair_register<src>(A, Bv) : own;
    else Z[d] = own;
  });
  static_for<16>([&](auto step) {
    constexpr int u = step;
    constexpr UniformPairStep s(u, false), s0(u, true);
    op(lane0 ? s0.slot : s.slot, uniform_pair_freq<M>(u, tx), Z[u], Z[31 - u], w[u], A2[u], B2[15 - u], step);
    if (u % kPairsPerFence == kPairsPerFence - 1) { fence(A2[u]); fence(B2[15 - u]); }
  });
  lane0_move_outputs(lane0, A2, B2);
  if (lane0) {
    cf unused;
    // k = M/2 with itself; ω_N^(N/4) = -i
    op(kHalfPairSlot, M / 2, A[8], A[8], cf{0.f, -1.f}, A2[8], unused, std::integral_constant<int, kHalfPairStep>{});
  }
}

// The channel's filter spectrum into the stage: its (n1/2 + 1) x n2 entries, rows padded to
// n2 + 1 float2 (as the filter walk reads them). Each thread copies, and later adjusts, the
// entries e = tx, tx + T, ...
__host__ __device__ __forceinline__ int stage_entries(const KArgs& a) { return (a.n1 / 2 + 1) * a.n2; }
// Channel c's spectrum row: row c >> row_shift, a grouped bank's row for its 2^row_shift channels
// (ConvForwardParams::filter_row_shift; 0: a row per channel). The shift is not in KArgs: a field
// more there, wherever placed, grew the gated forward kernels' spills from tens of bytes to
// hundreds at their register cap (ptxas, session 37). The ungated forward kernels take it in
// PlainKArgs, the grad kernels in GradArgs' padding; the gated ones pass 0, which folds away.
__device__ __forceinline__ const float2* filter_row(const KArgs& a, int64_t c, int row_shift) {
  return a.K + (c >> row_shift) * int64_t(stage_entries(a));
}
// Whether a launch takes ConvForwardParams/ConvBackwardParams::filter_row_shift: 0 .. 30, and 0
// for the GATED instances (a row per channel).
constexpr bool takes_row_shift(int row_shift, bool gated) {
  return row_shift >= 0 && row_shift <= 30 && (!gated || row_shift == 0);
}
__host__ __device__ __forceinline__ int stage_index(const KArgs& a, int e) {
  return (e >> a.ln2) * (a.n2 + 1) + (e & (a.n2 - 1));
}
// Where n2 | T, a thread's entries e = tx + j·T keep their column and move T/n2 rows: their
// stage slots are this many float2 apart.
template <int T>
__host__ __device__ __forceinline__ int stage_fixed_column_step(const KArgs& a) {
  return T + T / a.n2;
}

// The copy in two halves, so that work can hide it: begin issues it (the caller has
// synchronized: smem is free); end waits for it, folds the skip term in when `fold` (K'[f] =
// K[f] + D/N) and synchronizes.
template <int T>
__device__ __forceinline__ void stage_filter_begin(float2* stage, const KArgs& a, int64_t c, int row_shift, bool valid,
                                                   int tx) {
  if (!valid) return;
  const int total = stage_entries(a);
  const float2* Kc = filter_row(a, c, row_shift);
  for (int e = tx; e < total; e += T) cp_async8(stage + stage_index(a, e), Kc + e);
}
// begin where n2 | T (the uniform grad kernel's copy, where that holds): the same copies, by
// stepped pointers instead of each entry's index arithmetic.
template <int T>
__device__ __forceinline__ void stage_filter_begin_fixed_column(float2* stage, const KArgs& a, int64_t c,
                                                                int row_shift, bool valid, int tx) {
  if (!valid) return;
  const int total = stage_entries(a), dst_step = stage_fixed_column_step<T>(a);
  const float2* src = filter_row(a, c, row_shift) + tx;
  float2* dst = stage + stage_index(a, tx);
  for (int e = tx; e < total; e += T, src += T, dst += dst_step) cp_async8(dst, src);
}
template <int T>
__device__ __forceinline__ void stage_filter_end(float2* stage, const KArgs& a, int64_t c, bool fold, int tx) {
  cp_async_wait_all();
  if (a.skip != nullptr && fold) {
    // 1/N is a power of two: exact. The real part of a stored entry is the real part of every
    // K[f] read from it, also of the conjugated ones.
    const float dsk = a.skip[c] * (1.f / (float)a.N);
    const int total = stage_entries(a);
    for (int e = tx; e < total; e += T) stage[stage_index(a, e)].x += dsk;
  }
  __syncthreads();
}

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
