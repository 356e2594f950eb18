// monarch_fftconv: the four-step outer stage (fourstep/fftconv_fourstep.cu): the P-point DFTs
// down the columns and their twiddles, forward and inverse; for P <= 32 one thread per
// column, in registers; for P >= 128 a CTA per tile of columns, two real columns per slot of
// the radix plan of P, on the fp32 radix library's passes (fp32/radix.cuh).
#pragma once

#include "fp32/radix.cuh"
#include "fourstep/args.cuh"

#include <cstdint>

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

// W_N^(e), e = (m·k2) mod N reduced exactly in integers: the argument of sincospif is then
// exact (N a power of two), and the value within about one ulp.
__device__ __forceinline__ cf twiddle_n(int64_t m, int k2, int N) {
  const int e = (int)((m * k2) & (N - 1));
  float s, c;
  sincospif(2.f * (float)e / (float)N, &s, &c);
  return {c, -s};
}

// x[s] for the sequence s = b·C + c
template <typename IO>
__device__ __forceinline__ const IO* sequence(const FourStepArgs& g, int64_t s) {
  return static_cast<const IO*>(g.x) + (s / g.C) * g.xbs + (s % g.C) * g.xcs;
}

// ---------------------------------------------------------------- outer stage, P <= 32
// One thread per column (s, m): the column's P values in registers. Consecutive threads own
// consecutive m, so every load and store is coalesced.
template <int P, typename IO>
__global__ void __launch_bounds__(kOuterThreads) outer_forward_reg_kernel(const FourStepArgs g) {
  const int64_t col = (int64_t)blockIdx.x * kOuterThreads + threadIdx.x;
  if (col >= g.columns) return;
  const int64_t s = col >> g.logM, m = col & (g.M - 1);
  const IO* x = sequence<IO>(g, s);
  cf v[P];
#pragma unroll
  for (int p = 0; p < P / 2; ++p) {
    const int64_t t = m + (int64_t)g.M * p;
    v[p] = {t < g.L ? io_load<IO>(x + t) : 0.f, 0.f};
  }
#pragma unroll
  for (int p = P / 2; p < P; ++p) v[p] = {0.f, 0.f};
  fft_reg<P, false, true>(v);  // the upper half of the column is the zero padding
  float2* out = g.a + s * (int64_t)g.R * g.M + m;
#pragma unroll
  for (int k2 = 0; k2 <= P / 2; ++k2) {
    const cf z = k2 == 0 ? v[0] : cmul(v[k2], twiddle_n(m, k2, g.N));
    __stcg(out + (int64_t)k2 * g.M, make_float2(z.x, z.y));  // read once by the inner kernel: L2 only
  }
}

template <int P, typename IO>
__global__ void __launch_bounds__(kOuterThreads) outer_inverse_reg_kernel(const FourStepArgs g) {
  const int64_t col = (int64_t)blockIdx.x * kOuterThreads + threadIdx.x;
  if (col >= g.columns) return;
  const int64_t s = col >> g.logM, m = col & (g.M - 1);
  const float2* in = g.a + s * (int64_t)g.R * g.M + m;
  cf v[P];
#pragma unroll
  for (int k2 = 0; k2 <= P / 2; ++k2) {
    const float2 z = __ldcs(in + (int64_t)k2 * g.M);
    v[k2] = k2 == 0 ? cf{z.x, z.y} : cmul(cf{z.x, z.y}, cconj(twiddle_n(m, k2, g.N)));
  }
#pragma unroll
  for (int k2 = P / 2 + 1; k2 < P; ++k2) v[k2] = cconj(v[P - k2]);
  fft_reg<P, true>(v);
  IO* y = static_cast<IO*>(g.y) + s * g.L;
#pragma unroll
  for (int p = 0; p < P / 2; ++p) {
    const int64_t t = m + (int64_t)g.M * p;
    if (t < g.L) io_store<IO>(y + t, v[p].x);
  }
}

// ---------------------------------------------------------------- outer stage, P >= 128
// A CTA owns a tile of 2·SPB consecutive columns of one sequence. Each slot of Plan<log2 P>
// (P/32 threads, a shared-memory area) transforms two real columns at once, packed as one
// complex column z = x_a + i·x_b (columns m and m + SPB): one complex P-point DFT gives both
// spectra, X_a[k] = (Z[k] + conj Z[P-k])/2 and X_b[k] = (Z[k] - conj Z[P-k])/2i; the inverse
// packs the two Hermitian spectra as Z = C_a + i·C_b, and y_a, y_b are the real and the
// imaginary part of its inverse. Half the passes of one column per slot. The tile is loaded
// row by row (coalesced along m) into the slots, transformed by the Stockham passes
// (radices R1, R2, 16: natural order out), and stored row by row. Before its passes a CTA
// asks L2 for the rows of the tile one wave ahead (tile + tile_stride, the number of
// resident CTAs; prefetch.global.L2, no registers held), so that wave's loads come from L2.
template <int LOGP, bool INV>
__device__ __forceinline__ void column_passes(float* re, float* im, int tx, const SlotSmem<LOGP>& slot) {
  using Pl = Plan<LOGP>;
  constexpr int P = Pl::M, T = Pl::T;
  pass_smem<P, T, Pl::R1, 1, INV>(re, im, tx, nullptr);
  if constexpr (Pl::LR2 > 0) pass_smem<P, T, Pl::R2, Pl::R1, INV>(re, im, tx, slot.fp2());
  pass_smem<P, T, 16, Pl::R1 * Pl::R2, INV>(re, im, tx, slot.mid());
}

// Tile `tile`: columns m0 .. m0 + 2·SPB - 1 of sequence s (2·SPB divides M, so a tile never
// straddles two sequences). For the row-by-row loads and stores, thread tid serves the slot
// of columns m = m0 + tid % SPB and m + SPB, and the rows tid / SPB, tid / SPB + ROWS_PER_STEP,
// ...: consecutive threads touch consecutive m. `re`/`im` is that slot's area.
template <int LOGP>
struct ColumnTile {
  using Pl = Plan<LOGP>;
  static constexpr int ROWS_PER_STEP = Pl::THREADS / Pl::SPB;
  static constexpr int COLUMNS = 2 * Pl::SPB;
  int64_t s, m;
  int first_row;
  float *re, *im;

  __device__ __forceinline__ ColumnTile(const FourStepArgs& g, float* sm, int S, int64_t tile) {
    const int tid = threadIdx.y * Pl::T + threadIdx.x;
    const int64_t col0 = tile * COLUMNS;
    s = col0 >> g.logM;
    const int lane_col = tid % Pl::SPB;
    m = (col0 & (g.M - 1)) + lane_col;
    first_row = tid / Pl::SPB;
    re = sm + (size_t)lane_col * 2 * S;
    im = re + S;
  }
};

template <int LOGP>
__device__ __forceinline__ int64_t column_tiles(const FourStepArgs& g) { return g.columns / ColumnTile<LOGP>::COLUMNS; }

// Asks L2 for the first `rows` rows of the tile one wave ahead of this CTA's (blockIdx.x +
// tile_stride), in an array of Elements whose sequence s starts at sequence_base(s) and whose
// rows are M elements apart: one prefetch per 128-byte line, spread over the CTA.
template <int LOGP, typename Element, class SequenceBase>
__device__ __forceinline__ void prefetch_tile_ahead(const FourStepArgs& g, int rows, SequenceBase sequence_base) {
  using Pl = Plan<LOGP>;
  constexpr int kLinesPerRow = (ColumnTile<LOGP>::COLUMNS * (int)sizeof(Element) + 127) / 128;
  const int64_t tile = blockIdx.x + g.tile_stride;
  if (tile >= column_tiles<LOGP>(g)) return;
  const int64_t col0 = tile * ColumnTile<LOGP>::COLUMNS;
  const char* base = reinterpret_cast<const char*>(sequence_base(col0 >> g.logM) + (col0 & (g.M - 1)));
  const int64_t row_bytes = (int64_t)g.M * sizeof(Element);
  for (int i = threadIdx.y * Pl::T + threadIdx.x; i < rows * kLinesPerRow; i += Pl::THREADS)
    prefetch_l2(base + (i / kLinesPerRow) * row_bytes + (i % kLinesPerRow) * 128);
}

template <int LOGP, typename IO>
__global__ void __launch_bounds__(Plan<LOGP>::THREADS) outer_forward_smem_kernel(const FourStepArgs g, int S) {
  using Pl = Plan<LOGP>;
  using Tile = ColumnTile<LOGP>;
  constexpr int P = Pl::M, SPB = Pl::SPB;
  extern __shared__ float4 smem_raw[];
  float* sm = reinterpret_cast<float*>(smem_raw);
  const SlotSmem<LOGP> slot(sm, S);
  const Tile tile(g, sm, S, blockIdx.x);
  const IO* x = sequence<IO>(g, tile.s);
  for (int p = tile.first_row; p < P; p += Tile::ROWS_PER_STEP) {  // z = x_a + i·x_b; p >= P/2: padding
    const int64_t time = tile.m + (int64_t)g.M * p;
    tile.re[pidx(p)] = (p < P / 2 && time < g.L) ? io_load<IO>(x + time) : 0.f;
    tile.im[pidx(p)] = (p < P / 2 && time + SPB < g.L) ? io_load<IO>(x + time + SPB) : 0.f;
  }
  prefetch_tile_ahead<LOGP, IO>(g, P / 2, [&](int64_t s) { return sequence<IO>(g, s); });  // rows p >= P/2: padding
  __syncthreads();
  column_passes<LOGP, false>(slot.re, slot.im, threadIdx.x, slot);
  float2* out = g.a + tile.s * (int64_t)g.R * g.M + tile.m;
  for (int k2 = tile.first_row; k2 <= P / 2; k2 += Tile::ROWS_PER_STEP) {
    const int mirror = (P - k2) & (P - 1);
    const cf z = {tile.re[pidx(k2)], tile.im[pidx(k2)]};
    const cf zc = {tile.re[pidx(mirror)], -tile.im[pidx(mirror)]};  // conj Z[P - k2]
    cf xa = {0.5f * (z.x + zc.x), 0.5f * (z.y + zc.y)};                // (Z + conj Z[P-k]) / 2
    cf xb = {0.5f * (z.y - zc.y), 0.5f * (zc.x - z.x)};                // (Z - conj Z[P-k]) / 2i
    if (k2 > 0) {
      xa = cmul(xa, twiddle_n(tile.m, k2, g.N));
      xb = cmul(xb, twiddle_n(tile.m + SPB, k2, g.N));
    }
    __stcg(out + (int64_t)k2 * g.M, make_float2(xa.x, xa.y));
    __stcg(out + (int64_t)k2 * g.M + SPB, make_float2(xb.x, xb.y));
  }
}

template <int LOGP, typename IO>
__global__ void __launch_bounds__(Plan<LOGP>::THREADS) outer_inverse_smem_kernel(const FourStepArgs g, int S) {
  using Pl = Plan<LOGP>;
  using Tile = ColumnTile<LOGP>;
  constexpr int P = Pl::M, SPB = Pl::SPB;
  extern __shared__ float4 smem_raw[];
  float* sm = reinterpret_cast<float*>(smem_raw);
  const SlotSmem<LOGP> slot(sm, S);
  const Tile tile(g, sm, S, blockIdx.x);
  const float2* in = g.a + tile.s * (int64_t)g.R * g.M + tile.m;
  for (int k2 = tile.first_row; k2 <= P / 2; k2 += Tile::ROWS_PER_STEP) {
    const float2 za = __ldcs(in + (int64_t)k2 * g.M), zb = __ldcs(in + (int64_t)k2 * g.M + SPB);
    cf ca = {za.x, za.y}, cb = {zb.x, zb.y};
    if (k2 > 0) {
      ca = cmul(ca, cconj(twiddle_n(tile.m, k2, g.N)));
      cb = cmul(cb, cconj(twiddle_n(tile.m + SPB, k2, g.N)));
    }
    if (k2 == 0 || k2 == P / 2) {  // y real: only the real parts of these rows count
      tile.re[pidx(k2)] = ca.x;
      tile.im[pidx(k2)] = cb.x;
    } else {  // Z[k2] = C_a + i·C_b, Z[P - k2] = conj C_a + i·conj C_b
      tile.re[pidx(k2)] = ca.x - cb.y;
      tile.im[pidx(k2)] = ca.y + cb.x;
      tile.re[pidx(P - k2)] = ca.x + cb.y;
      tile.im[pidx(P - k2)] = cb.x - ca.y;
    }
  }
  prefetch_tile_ahead<LOGP, float2>(g, P / 2 + 1, [&](int64_t s) { return g.a + s * (int64_t)g.R * g.M; });
  __syncthreads();
  column_passes<LOGP, true>(slot.re, slot.im, threadIdx.x, slot);
  IO* y = static_cast<IO*>(g.y) + tile.s * g.L;
  for (int p = tile.first_row; p < P / 2; p += Tile::ROWS_PER_STEP) {  // y_a, y_b: Re and Im
    const int64_t time = tile.m + (int64_t)g.M * p;
    if (time < g.L) io_store<IO>(y + time, tile.re[pidx(p)]);
    if (time + SPB < g.L) io_store<IO>(y + time + SPB, tile.im[pidx(p)]);
  }
}

}  // namespace fp32_detail
}  // namespace
}  // namespace monarch_fftconv
