// monarch_fftconv: the tensor-core engine's consumer warpgroups (tc/engine_kernel.cuh): stage 1,
// the twiddle, stage 2, the filter, inverse 2, the hand-off, inverse 1 and the store of y, each a
// function over one m64 tile's accumulators, and the loop that runs them per item.
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

// The twiddle seeds' source: omega<kN>(e), computed (sincospif), or read from the call's table
// (Cfg::kTwiddleTable, MONARCH_FFTCONV_ENGINE_TWIDDLE_TABLE: filter_image_kernel wrote
// omega<kN>(e) for every e < kN, so the seeds, and every output, keep their bits).
template <class Cfg>
struct Twiddles {
  const float2* table;  // FilterImages::twiddles; unread without the table
  __device__ __forceinline__ float2 operator()(int e) const {
    if constexpr (Cfg::kTwiddleTable) return __ldg(table + (e & (Cfg::kN - 1)));
    else return omega<Cfg::kN>(e);
  }
};

// Twiddle exp(-2 pi i k1 s / N) in fp32 (a recurrence along the thread's columns, seeded by
// sincospi or the table), rounded into stage 2's A operand: 8 k steps of 4 words, a plane each.
template <class Cfg>
__device__ __forceinline__ void twiddle_to_operand(const float (&re)[64], const float (&im)[64], const Lane& lane_in,
                                                   const Twiddles<Cfg>& omega_of, uint32_t (&ar)[32], uint32_t (&ai)[32]) {
  const Lane ln = lane_in.opaque();
  using T = typename Cfg::T;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k1 = Cfg::kTileRows * ln.wg + ln.row0 + 8 * h;
    float2 cur = omega_of(k1 * 2 * ln.q);
    const float2 step1 = omega_of(k1), step8 = omega_of(8 * k1);
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

// The resident filter's row k1, any k1 (filter_read_mask: the mirrored rows above n1/2), read
// by shared-window address (LDS; through a generic pointer the reads were generic LDs).
template <class Cfg>
struct FilterRow {
  uint32_t row;  // shared address of the stored row's word 0
  int mask;
  float im_sign;
  __device__ __forceinline__ FilterRow(uint32_t filter, int k1)
      : row(filter + uint32_t(filter_stored_row<Cfg::kN1>(k1) * Cfg::kN2) * uint32_t(sizeof(uint32_t))),
        mask(filter_read_mask<Cfg::kN1, Cfg::kN2>(k1)),
        im_sign(filter_mirrored<Cfg::kN1>(k1) ? -1.0f : 1.0f) {}
  __device__ __forceinline__ float2 at(int k2) const {
    const float2 k = unpack2<typename Cfg::T>(ld_shared_u32(row + uint32_t(k2 ^ mask) * uint32_t(sizeof(uint32_t))));
    return make_float2(k.x, im_sign * k.y);
  }
};

// After stage 2: columns c = 8j + 2q + e and their mirrors n2 - c (c = 0: column n2/2) times
// the filter, rounded. Direct columns are inverse 2's k steps 0-3 as they stand; a mirror
// column's value is in another lane of the quad, one shfl of a packed (re, im) word each.
template <class Cfg>
__device__ __forceinline__ void filter_to_operand(const float (&pc)[32], const float (&qs)[32], const float (&qc)[32],
                                                  const float (&ps)[32], uint32_t filter, const Lane& lane_in,
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
        // c == 0, spelt by index: q is opaque to the compiler (Lane::opaque), so `c == 0` left a
        // branch in every unrolled (h, j); this way the j > 0 have none (session 36: −4.5% bf16 I/O).
        if (j == 0 && e == 0 && ln.q == 0) {  // X[0], X[n2/2]
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
                                              const float (&ps)[32], float unscale, const Lane& lane_in,
                                              const Twiddles<Cfg>& omega_of, uint32_t handoff_re) {
  const Lane ln = lane_in.opaque();
  using T = typename Cfg::T;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k1 = Cfg::kTileRows * ln.wg + ln.row0 + 8 * h;
    const typename Cfg::HandoffAddresses to(handoff_re, ln.q, k1);  // the im plane: + kHandoffPlaneBytes
    // Twiddle recurrences: up from s = 2q by 8, down from s = n2 - 2q by 8 (e = 1: one lower).
    float2 up = omega_of(-k1 * 2 * ln.q), down = omega_of(-k1 * (Cfg::kN2 - 2 * ln.q));
    const float2 up1 = omega_of(-k1), up8 = omega_of(-8 * k1);
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
      if (j == 0 && ln.q == 0) {  // A'[0], A'[n2/2]: acc_col(q, j, 0) == 0, by index as above
        a[0] = make_float2(pc[acc_value(j, h, 0)], qc[acc_value(j, h, 0)]);
        am[0] = make_float2(ps[acc_value(j, h, 0)], qs[acc_value(j, h, 0)]);
        const float2 w64 = omega_of(-k1 * (Cfg::kN2 / 2));
        wm[0] = make_float2(w64.x * unscale, w64.y * unscale);
      }
      const float2 y0 = cmul(a[0], w[0]), y1 = cmul(a[1], w[1]);
      const uint32_t at = to.column_pair(j);  // s = c, c + 1: adjacent
      st_shared(at, pack2<T>(y0.x, y1.x));
      st_shared(at + Cfg::kHandoffPlaneBytes, pack2<T>(y0.y, y1.y));
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float2 ym = cmul(am[e], wm[e]);
        const uint32_t atm = to.mirror(j, e);  // s = n2 - c - e; c = 0, e = 0: n2/2
        st_shared_u16(atm, round1<T>(ym.x));
        st_shared_u16(atm + Cfg::kHandoffPlaneBytes, round1<T>(ym.y));
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
// any stored value is not finite. A thread's t are even, so a row's 8-byte alignment is its
// base's, and they grow with h and j: where both bases are aligned and the thread's last pair
// is below L (every thread at L = N/2), every pair is stored whole with no check, one branch a
// job; otherwise each pair as before, whole if aligned and below L, else element by element.
template <class Cfg>
__device__ __forceinline__ bool store_y(float (&yr)[32], float (&yi)[32], float unscale, const ConvForwardParams& p,
                                        const Item& item, const Lane& lane_in) {
  const Lane ln = lane_in.opaque();
  using IoT = typename Cfg::IoT;
  const int64_t L = p.seq_len;
  IoT* y = static_cast<IoT*>(p.y);
  IoT* ya = y + (int64_t(item.seq_re) * p.channels + item.channel) * L;
  IoT* yb = item.seq_im >= 0 ? y + (int64_t(item.seq_im) * p.channels + item.channel) * L : nullptr;
  bool bad = false;
#pragma unroll
  for (int v = 0; v < 32; ++v) {
    yr[v] *= unscale;
    yi[v] *= unscale;
  }
  // A pair's store is 8 bytes in fp32, 4 in a 2-byte type.
  constexpr uintptr_t kPairAlign = 2 * sizeof(IoT) - 1;
  const bool aligned = (reinterpret_cast<uintptr_t>(ya) & kPairAlign) == 0 &&
                       (yb == nullptr || (reinterpret_cast<uintptr_t>(yb) & kPairAlign) == 0);
  const auto time = [&](int h, int j) {
    return int64_t(ln.row0 + 8 * h) * Cfg::kN2 + Cfg::kHalfCols * ln.wg + acc_col(ln.q, j, 0);
  };
  // The pair (h, j) from its row's start: (t of (h, j)) - (t of (0, 0)), a constant, so the
  // whole-tile stores take immediate offsets from one address each.
  const auto step = [](int h, int j) { return 8 * h * Cfg::kN2 + acc_col(0, j, 0); };
  // fp32: streaming stores (y is not read again here); a 2-byte y: rounded, one 4-byte store.
  const auto store2 = [](IoT* at, float x0, float x1) {
    if constexpr (Cfg::kHalfIo) {
      Cfg::Io::store2(at, 0, x0, x1);
    } else {
      __stcs(reinterpret_cast<float2*>(at), make_float2(x0, x1));
    }
  };
  const auto store1 = [](IoT* at, float x) {
    if constexpr (Cfg::kHalfIo) {
      Cfg::Io::store(at, 0, x);
    } else {
      __stcs(at, x);
    }
  };
  const auto store_pair = [&](int v, IoT* a, IoT* b) {
    store2(a, yr[v], yr[v + 1]);
    if (b != nullptr) store2(b, yi[v], yi[v + 1]);
  };
  // Not short-circuit: no branch a pair (the y_b half is added once, below, where it is stored).
  const auto nonfinite = [](float x0, float x1) { return !isfinite(x0) | !isfinite(x1); };
  const int64_t t0 = time(0, 0);
  if (aligned && t0 + step(1, Cfg::kN2 / 16 - 1) + 1 < L) {
    IoT* const a = ya + t0;
    IoT* const b = yb != nullptr ? yb + t0 : nullptr;
    bool bad_b = false;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < Cfg::kN2 / 16; ++j) {
        const int v = acc_value(j, h, 0);
        store_pair(v, a + step(h, j), b != nullptr ? b + step(h, j) : nullptr);
        bad |= nonfinite(yr[v], yr[v + 1]);
        bad_b |= nonfinite(yi[v], yi[v + 1]);
      }
    return bad | (b != nullptr && bad_b);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < Cfg::kN2 / 16; ++j) {
      const int v = acc_value(j, h, 0);
      const int64_t t = time(h, j);
      if (aligned && t + 1 < L) {
        store_pair(v, ya + t, yb != nullptr ? yb + t : nullptr);
        bad |= nonfinite(yr[v], yr[v + 1]);
        if (yb != nullptr) bad |= nonfinite(yi[v], yi[v + 1]);
      } else {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (t + e < L) {
            store1(ya + t + e, yr[v + e]);
            bad |= !isfinite(yr[v + e]);
            if (yb != nullptr) {
              store1(yb + t + e, yi[v + e]);
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
__device__ void consumer(const ConvForwardParams& p, typename Cfg::Smem& sm, int wg, const Twiddles<Cfg> omega_of) {
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
  const uint32_t handoff_re = smem_address(sm.handoff[0]);  // handoff[1], im: + kHandoffPlaneBytes
  const uint32_t filter = smem_address(sm.filter);

  uint32_t taken = 0, filter_epochs = 0;
  named_arrive(Cfg::barrier_handoff_free(1 - wg), 2 * Cfg::kWarpgroup);  // the partner's first hand-off
#pragma unroll 1
  while (true) {
    const int stage = taken % Cfg::kStages;
    mbar_wait(&sm.full[stage], (taken / Cfg::kStages) & 1);
    const Item item = sm.item[stage];
    if (item.channel < 0) break;
    // The filter's protocol is the producer's (FilterPlan): the item says when to release.
    // kItemReleaseFirst: every earlier item is finished here, so the held filter is read no more.
    if ((item.flags & kItemReleaseFirst) && lane0) mbar_arrive(&sm.filter_free);

    uint32_t pr[32], pi[32];
    {
      uint32_t ar[32], ai[32];
      {
        float re[64], im[64];
        Tensor sZr = make_tensor(make_smem_ptr(sm.ring[stage][0]), typename Cfg::LayoutRing{});  // (s, r)
        Tensor sZi = make_tensor(make_smem_ptr(sm.ring[stage][1]), typename Cfg::LayoutRing{});
        stage1<Cfg>(sF1cRows, sF1sRows, sZr, sZi, re, im);
        if (lane0) mbar_arrive(&sm.empty[stage]);
        twiddle_to_operand<Cfg>(re, im, ln, omega_of, ar, ai);
      }
      float pc[32], qs[32], qc[32], ps[32];
      half_column_products<Cfg>(ar, ai, sF2c, sF2s, pc, qs, qc, ps);
      if (item.flags & kItemLoad) mbar_wait(&sm.filter_full, filter_epochs++ & 1);
      filter_to_operand<Cfg>(pc, qs, qc, ps, filter, ln, pr, pi);
    }
    {
      float pc[32], qs[32], qc[32], ps[32];
      half_column_products<Cfg>(pr, pi, sF2c, sF2s, pc, qs, qc, ps);
      named_sync(Cfg::barrier_handoff_free(wg), 2 * Cfg::kWarpgroup);
      handoff_store<Cfg>(pc, qs, qc, ps, sm.handoff_unscale, ln, omega_of, handoff_re);
    }
    fence_proxy_async();
    named_arrive(Cfg::barrier_rows_ready(wg), 2 * Cfg::kWarpgroup);
    // y's share of 2^-e, the last thing the item reads of what filter_copy brought (the filter in
    // filter_to_operand, the hand-off's share in handoff_store): read here, before own_rows, so
    // that kItemReleaseAfter may free the buffer below (an asm load: it stays before the barrier).
    const float output_unscale = __uint_as_float(ld_shared_u32(smem_address(&sm.output_unscale)));
    // wgmma orders no shared-memory writes of the other warps: inverse 1's own k steps read
    // every warp's rows, so the warpgroup meets first (wgmma reads the whole warpgroup's registers).
    named_sync(Cfg::barrier_own_rows(wg), Cfg::kWarpgroup);
    // kItemReleaseAfter (engine_early_filter_release): every thread of this warpgroup has made
    // its last read of the filter and both unscales (bar.sync orders them before each warp's
    // arrive, which releases them to the producer's acquiring wait). The producer needs all 8
    // warps, so both warpgroups' reads are done before it overwrites the buffer. Nothing here
    // waits on the producer: the release cannot be held up by the load it unblocks.
    if ((item.flags & kItemReleaseAfter) && lane0) mbar_arrive(&sm.filter_free);
    float yr[32], yi[32];
    inverse1<Cfg>(sF1cT, sF1sT, sHrHalf, sHiHalf, wg, yr, yi);
    named_arrive(Cfg::barrier_handoff_free(1 - wg), 2 * Cfg::kWarpgroup);
    const bool bad = store_y<Cfg>(yr, yi, output_unscale, p, item, ln);
    if (item.flags & kItemChecked) {
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

}  // namespace engine
}  // namespace monarch_fftconv
