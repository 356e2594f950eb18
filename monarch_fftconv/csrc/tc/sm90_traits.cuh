// monarch_fftconv: the traits of the Hopper (wgmma) Monarch kernel (tc/sm90_kernel.cuh): the
// operand types and their GMMA atoms, and Sm90Cfg, the one home of its tile shapes and its
// shared-memory layout.
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "fftconv.h"
#include "common/limits.cuh"
#include "tc/io_traits.cuh"

namespace monarch_fftconv {
namespace sm90 {

using namespace cute;

// The operand type and its GMMA atom (m64 n64 k16, both operands in shared memory).
// ScaleA = Neg negates the A operand for free: the complex products' minus signs.
template <Precision P> struct Operand;
template <> struct Operand<Precision::kBF16> {
  using T = cute::bfloat16_t;
  template <GMMA::Major MajorA, GMMA::Major MajorB, GMMA::ScaleIn ScaleA = GMMA::ScaleIn::One>
  using Atom = SM90_64x64x16_F32BF16BF16_SS<MajorA, MajorB, ScaleA>;
};
template <> struct Operand<Precision::kFP16> {
  using T = cute::half_t;
  template <GMMA::Major MajorA, GMMA::Major MajorB, GMMA::ScaleIn ScaleA = GMMA::ScaleIn::One>
  using Atom = SM90_64x64x16_F32F16F16_SS<MajorA, MajorB, ScaleA>;
};

// ---------------------------------------------------------------------------
// The traits: the one home of the tile shapes and the shared-memory layout.
//
// A persistent CTA of two warpgroups. Each (b, c) sequence in flight has its own slot of data
// buffers and is worked on by SeqWarpgroups of them:
//   2 (the request "sm90"): both warpgroups on one sequence; warpgroup h owns the column half
//     [64h, 64h + 64) of every stage's N dimension, and the stages that contract over both
//     halves meet at a 256-thread barrier.
//   1 ("sm90-2seq"): two sequences in flight, one warpgroup each, which runs the two column
//     halves one after the other. No barrier spans the warpgroups, so one's GEMMs run under
//     the other's epilogues.
// Either way every GEMM is one m64 n64 tile: rows k1 = 0..63 of the Hermitian half (row 64,
// the Nyquist row, rides in row 0's imaginary slot through the stage-1 and inverse
// stage-1 GEMMs, and takes SIMT fp32 in between; see below).
//
// Shared memory (operand type T unless said; layouts are GMMA's 128-byte swizzles):
//   f1c  (64, 64)   K-major   cos(2 pi k1 r / 128): stage 1's A (k1, r) and inverse
//                             stage 1's A (r, k1): symmetric
//   s1   (64, 64)   K-major   -sin(2 pi k1 r / 128), row k1 = 0 replaced by (-1)^r (the
//                             Nyquist row's stage 1 lands in A's imaginary row 0);
//                             inverse stage 1 reads the same bytes MN-major, i.e. transposed
//   f2c, f2s (128, 128) K-major  cos / -sin(2 pi s k2 / 128): stages 2 and inverse 2 (B)
//   per sequence slot:
//   x    (128 s, 64 r)   MN-major  u, rounded: stage 1's B
//   a    2 x (64 k1, 128 s)  K-major  stage 1's output (re, im), twiddled: stage 2's A
//   p    2 x (64 k1, 128 k2) K-major  stage 2's output times the filter: inverse 2's A
//   ap   2 x (128 s, 64 k1)  MN-major inverse 2's output, conj twiddled, weighted:
//                             inverse stage 1's B
//   fp32: w128[j] = exp(-2 pi i j / 128), tw_lo[j] = exp(-2 pi i j / 16384), j < 128;
//         the Nyquist row's vectors (nyq_b, nyq_p, nyq_c).
// ---------------------------------------------------------------------------
template <Precision P_, IOType IO_, int SeqWarpgroups>
struct Sm90Cfg {
  // The split and the tiles, as CuTe integers for the layouts and tiles, and as ints.
  using N1 = _128;    // stage-1 DFT: rows r (time) / k1 (frequency) of the 128 x 128 grid
  using N2 = _128;    // stage-2 DFT: columns s (time) / k2 (frequency)
  using Rows = _64;   // m64: the Hermitian rows k1 = 0..63 (row 64 rides in row 0's imaginary
                      // slot), and the rows r < 64 that hold u (L <= N / 2)
  using Half = _64;   // a column half: the columns s or k2 of one m64 n64 tile, N2 / 2
  static constexpr int kN1 = N1::value, kN2 = N2::value, kN = kN1 * kN2;
  static constexpr int kRows = Rows::value, kHalf = Half::value;
  static constexpr int kNyquistRow = kN1 / 2;  // k1 = 64
  static constexpr int kWarpgroup = 128;       // threads: four warps, the unit of wgmma
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroup * kWarpgroups;
  // Warpgroups per sequence, sequences in flight per CTA, column halves per warpgroup.
  static constexpr int kSeqWarpgroups = SeqWarpgroups;
  static constexpr int kSlots = kWarpgroups / kSeqWarpgroups;
  static constexpr int kHalvesPerWarpgroup = 2 / kSeqWarpgroups;
  static_assert(kSeqWarpgroups == 1 || kSeqWarpgroups == 2, "a sequence takes one warpgroup or both");
  // Filter pairs (float4) of stage 2's epilogue loaded before its GEMM is waited for: as many
  // as the registers allow beside the two accumulators (of 16 a thread).
  static constexpr int kEarlyFilterPairs = kSeqWarpgroups == 1 ? 16 : 4;
  // The warps (of a warpgroup) that run the Nyquist row's fp32 FFTs under the GEMMs: not warp 0,
  // whose lanes 0-3 hold row 0 and diverge on its Nyquist slot in two epilogues, and not the
  // same warp twice, so that no warp of the warpgroup carries more than one extra job.
  static constexpr int kNyquistForwardWarp = 1;
  static constexpr int kNyquistInverseWarp = 2;
  // The tables and the kernel's index arithmetic are written for this split: the twiddle
  // W_N^e = W_128^(e / 128) · W_N^(e % 128) takes N = 128 · 128, and the Nyquist row's FFT is
  // 128-point (fft128_warp).
  static_assert(kN1 == 128 && kN2 == 128, "the 128 x 128 split");
  static_assert(kRows == kN1 / 2 && kHalf == kN2 / 2, "m64 tiles: half the rows, half the columns each");
  using Io = tc::IoTraits<IO_>;
  using T = typename Operand<P_>::T;
  template <GMMA::Major A, GMMA::Major B, GMMA::ScaleIn S = GMMA::ScaleIn::One>
  using Mma = decltype(make_tiled_mma(typename Operand<P_>::template Atom<A, B, S>{}));

  using LayoutSquare = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Rows, Rows>{}));
  using LayoutSquareT = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Rows, Rows>{}));
  using LayoutF2 = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<N2, N2>{}));
  using LayoutRowsK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Rows, N2>{}));
  using LayoutColsMN = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<N2, Rows>{}));
  // A warpgroup's tiles: the accumulator (Rows, Half), its N-by-K operands (Half, K).
  using TileAcc = Shape<Rows, Half>;
  using TileHalfRows = Shape<Half, Rows>;
  using TileHalfCols = Shape<Half, N2>;

  // One sequence slot's buffers. Two aliases keep two slots within shared memory: `ap` shares
  // `a`'s bytes (a is dead once stage 2 has run on both halves) and `x` the first 16 KB of `p`
  // (x is dead after stage 1); a barrier of the slot's warpgroups at the top of each sequence
  // orders them.
  struct alignas(1024) SlotData {
    T a[2][kRows * kN2];       // a: (k1, s) K-major, then ap: (s, k1) MN-major
    T p[2][kRows * kN2];       // x: (s, r) MN-major in p[0], then p: (k1, k2) K-major
  };
  static constexpr uint32_t kPlaneBytes = sizeof(T) * kRows * kN2;  // a plane's re to its im
  struct Nyquist {
    float2 b[kN2];             // the Nyquist row after stage 1 and its twiddle, by s
    float2 p[kN2];             // ... after stage 2 and the filter, by k2
    float c[kN2];              // ... after inverse 2 and the conj twiddle, real part, by s
    float2 fft[kSeqWarpgroups][2][kN2];  // per warpgroup: the ping-pong buffers of its 128-point FFTs
  };
  struct alignas(1024) Smem {
    T f1c[kRows * kRows];
    T s1[kRows * kRows];
    T f2c[kN2 * kN2];
    T f2s[kN2 * kN2];
    SlotData slot[kSlots];
    float2 w128[kN2];
    float2 tw_lo[kN2];
    Nyquist nyq[kSlots];
  };
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + alignment slack

  static_assert(sizeof(T) == 2, "GMMA operands here are 16-bit");
  static_assert(kSmemBytes <= max_smem_per_cta(1), "one CTA per SM");
};

}  // namespace sm90
}  // namespace monarch_fftconv
