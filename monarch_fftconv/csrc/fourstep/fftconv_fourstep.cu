// monarch_fftconv: long sequences, N = P·M > 32768, by the four-step algorithm.
//
// One FFT of N points does not fit on chip, so it is cut in two: t = m + M·p (m < M inner,
// p < P outer), f = P·k1 + k2. Then
//   X[P·k1 + k2] = Σ_m W_M^(m·k1) · [ W_N^(m·k2) · Σ_p x[m + M·p]·W_P^(p·k2) ]
// The bracket is the outer stage: a P-point DFT down each column m (stride M in memory),
// times the twiddle. The outer sum is the inner stage: an M-point FFT along each row k2,
// which is contiguous. Three kernels, one complex intermediate (B·C, P/2+1, M) in HBM:
//
//   outer forward   per column (s, m): the P/2 samples x[m + M·p], p < P/2 (the rest is the
//                   zero padding), a P-point DFT, the twiddles, rows k2 = 0 .. P/2 stored (x
//                   is real: the rows above are conjugates)
//   inner           one CTA slot per row (s, k2): the fp32 radix kernels' Stockham passes
//                   (fp32/radix.cuh, plan of M), the filter product between the last forward
//                   and the first inverse pass, the unnormalised inverse; in place
//   outer inverse   per column: the twiddles' conjugates, the rows k2 > P/2 as conjugates of
//                   P - k2, an inverse P-point DFT, the real part of the first P/2 outputs
//                   stored where t < L
// The outer kernels come in two forms: for P <= 32 one thread per column, the DFT in
// registers; for P >= 128 a CTA per tile of consecutive columns, two real columns packed
// into each slot of the radix plan of P in shared memory. M = 8192 (4096 at N = 2^19:
// fourstep_inner_size).
// The filter spectrum K[c][k2][k1] = FFT_N(k_c)[P·k1 + k2] / N carries the 1/N; every transform
// here is unnormalised. Arithmetic is fp32 throughout, the intermediate fp32. The filter
// spectrum itself is the outer forward and the inner forward half run on k (InnerMode::kSpectrum).
//
// Each sequence is independent: nothing is shared between two sequences' arithmetic.

#include "fp32/radix.cuh"

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

constexpr int kOuterThreads = 256;

struct FourStepArgs {
  const void* x;
  int64_t xbs, xcs;
  const float2* K;     // (C, R, M)
  const float* skip;   // (C,) or null: the filter is K + skip/N
  void* y;             // (B, C, L)
  float2* a;           // (B·C, R, M)
  float2* products;    // InnerMode::kGrad: (B·C, R, M), X in, conj(X)·DY out
  int64_t B, C, L;
  int64_t columns;     // B·C·M
  int N, M, logM, R;   // R = P/2 + 1
  int conj;            // kConv, kGrad: multiply by the conjugate filter
  float scale;         // kSpectrum: the spectrum times this
  int64_t tile_stride; // outer stage, P >= 128: the CTAs resident at once (the prefetch distance)
};

// What the inner kernel does to each row, in place:
//   kConv      FFT_M, times the filter (or its conjugate), inverse FFT_M
//   kSpectrum  FFT_M, times `scale`; stored
//   kGrad      as kConv; on the way, the row's spectrum DY turns `products` (X) into conj(X)·DY
//   kInverse   inverse FFT_M only
enum class InnerMode { kConv, kSpectrum, kGrad, kInverse };

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

// One row (s, k2) of M complex values per CTA slot: forward FFT_M (Stockham passes p1, p2 and
// the radix-16 "mid" pass, whose outputs are Z[j + r·M/16] in natural order), the filter
// product, and the inverse passes in the mirror order, in place.
template <int LOGM, InnerMode MODE>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS) inner_kernel(const FourStepArgs g, int S) {
  using Pl = Plan<LOGM>;
  constexpr int M = Pl::M, T = Pl::T, SPB = Pl::SPB, R1 = Pl::R1;
  extern __shared__ float4 smem_raw[];
  const SlotSmem<LOGM> slot(reinterpret_cast<float*>(smem_raw), S);
  float *re = slot.re, *im = slot.im;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t rows = (g.columns >> g.logM) * g.R;

  for (int64_t rb = (int64_t)blockIdx.x * SPB; rb < rows; rb += (int64_t)gridDim.x * SPB) {
    const int64_t row = rb + ty;
    const bool valid = row < rows;
    float2* data = g.a + (valid ? row : 0) * M;

    // ---- forward p1: global -> smem, radix R1, NS = 1
    if constexpr (MODE != InnerMode::kInverse) {
      constexpr int NB = 32 / R1;
      cf v[NB][R1];
#pragma unroll
      for (int q = 0; q < NB; ++q) {
        const int j = tx + q * T;
#pragma unroll
        for (int r = 0; r < R1; ++r) {
          const float2 z = valid ? __ldcg(data + j + r * (M / R1)) : make_float2(0.f, 0.f);
          v[q][r] = {z.x, z.y};
        }
      }
#pragma unroll
      for (int q = 0; q < NB; ++q) {
        if (q > 0) fence(v[q]);
        fft_reg<R1, false>(v[q]);
        fence(v[q]);
      }
      __syncthreads();  // the previous row's last pass has read smem
      store_butterflies<T>(re, im, tx, v);
      __syncthreads();
    }
    if constexpr (Pl::LR2 > 0 && MODE != InnerMode::kInverse) pass_smem<M, T, Pl::R2, R1, false>(re, im, tx, slot.fp2());

    // ---- mid: forward radix 16 (NS = M/16) -> Z[k], k = j + r·M/16; times K[k]; inverse radix 16
    {
      constexpr int NS = M / 16, NB = NS / T;
      cf v[NB][16];
      const float2* twM = slot.mid();
      const int64_t s = row / g.R;
      const int k2 = (int)(row % g.R);
      const int64_t c = s % g.C;
      const float2* Krow = g.K + (c * g.R + k2) * (int64_t)M;
      // the skip term D·u is the convolution with D at lag 0: K + D/N
      const float d = (g.skip != nullptr && valid) ? g.skip[c] / (float)g.N : 0.f;
#pragma unroll
      for (int q = 0; q < NB; ++q) {
        const int j = tx + q * T, pj = pidx(j);
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          if constexpr (MODE == InnerMode::kInverse) {
            const float2 z = valid ? __ldcs(data + j + r * NS) : make_float2(0.f, 0.f);
            v[q][r] = {z.x, z.y};
          } else {
            v[q][r] = lds_s<NS>(re, im, j, pj, r);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < NB; ++q) {
        const int j = tx + q * T;
        if (q > 0) fence(v[q]);
        if constexpr (MODE != InnerMode::kInverse) {
          const float2 w = twM[j];
          apply_pow<16>(v[q], cf{w.x, w.y});
          fft_reg<16, false>(v[q]);
        }
        if constexpr (MODE == InnerMode::kSpectrum) {
          if (valid) {
#pragma unroll
            for (int r = 0; r < 16; ++r) __stcs(data + j + r * NS, make_float2(v[q][r].x * g.scale, v[q][r].y * g.scale));
          }
          continue;
        }
        if constexpr (MODE == InnerMode::kGrad) {
          float2* prow = g.products + (valid ? row : 0) * M;
          if (valid) {
#pragma unroll
            for (int r = 0; r < 16; ++r) {
              const float2 x = __ldcs(prow + j + r * NS);
              __stcg(prow + j + r * NS, make_float2(x.x * v[q][r].x + x.y * v[q][r].y,  // conj(X)·DY
                                                    x.x * v[q][r].y - x.y * v[q][r].x));
            }
          }
        }
        if constexpr (MODE == InnerMode::kConv || MODE == InnerMode::kGrad) {
#pragma unroll
          for (int r = 0; r < 16; ++r) {
            const float2 kk = valid ? __ldg(Krow + j + r * NS) : make_float2(0.f, 0.f);
            v[q][r] = cmul(v[q][r], cf{kk.x + d, g.conj ? -kk.y : kk.y});
          }
        }
        fft_reg<16, true>(v[q]);
        fence(v[q]);
      }
      if constexpr (MODE == InnerMode::kSpectrum) continue;
      __syncthreads();  // everyone has read the forward pass's smem (or the last row's)
      store_butterflies<T>(re, im, tx, v);
      __syncthreads();
    }
    if constexpr (Pl::LR2 > 0) pass_smem<M, T, Pl::R2, 16, true>(re, im, tx, slot.ip2());

    // ---- inverse last: radix R1, NS = M/R1, smem -> global
    {
      constexpr int NB = 32 / R1, NS = M / R1;
      cf v[NB][R1];
      last_inverse_butterflies<LOGM>(re, im, tx, slot.mid(), v, [&](int q) {
        if (!valid) return;  // stored as each butterfly completes: fewer live registers
        const int j = tx + q * T;
#pragma unroll
        for (int r = 0; r < R1; ++r) __stcg(data + j + r * NS, make_float2(v[q][r].x, v[q][r].y));
      });
    }
  }
}

// f(std::integral_constant<int, I>{}) for the I with 2^I = value, I in [LO, HI]
template <int LO, int HI, class F>
cudaError_t with_log2(int64_t value, F&& f) {
  if constexpr (LO > HI) {
    return cudaErrorInvalidValue;
  } else {
    if (value == (int64_t(1) << LO)) return f(std::integral_constant<int, LO>{});
    return with_log2<LO + 1, HI>(value, f);
  }
}

template <class F>
cudaError_t with_io(IOType io, F&& f) {
  switch (io) {
    case IOType::kFloat32: return f(float{});
    case IOType::kBFloat16: return f(__nv_bfloat16{});
    case IOType::kFloat16: return f(__half{});
  }
  return cudaErrorInvalidValue;
}

bool valid_params(const FourStepParams& p) {
  return kFourStepMinSize <= p.fft_size && p.fft_size <= kFourStepMaxSize && (p.fft_size & (p.fft_size - 1)) == 0 &&
         p.batch > 0 && p.channels > 0 && 1 <= p.seq_len && 2 * p.seq_len <= p.fft_size && p.x && p.intermediate &&
         reinterpret_cast<uintptr_t>(p.intermediate) % 16 == 0;
}

FourStepArgs make_args(const FourStepParams& p) {
  FourStepArgs g{};
  g.x = p.x;
  g.xbs = p.x_batch_stride;
  g.xcs = p.x_channel_stride;
  g.K = reinterpret_cast<const float2*>(p.filter_spectrum);
  g.y = p.y;
  g.a = reinterpret_cast<float2*>(p.intermediate);
  g.B = p.batch;
  g.C = p.channels;
  g.L = p.seq_len;
  g.N = (int)p.fft_size;
  g.M = fourstep_inner_size(p.fft_size);
  g.logM = ilog2_host(g.M);
  g.columns = p.batch * p.channels * g.M;
  g.R = fourstep_rows(p.fft_size);
  g.skip = p.skip;
  return g;
}

// The sequence area of one slot of Plan<LOGM> (no filter stage) and the CTA's smem.
template <int LOGM>
int slot_floats() { return area_floats<LOGM>(2, 1); }
template <int LOGM>
size_t slots_smem(int S) {
  using Pl = Plan<LOGM>;
  return (size_t)Pl::SPB * 2 * S * sizeof(float) + (size_t)Pl::N_TW * sizeof(float2);
}

template <int LOGM, InnerMode MODE>
cudaError_t launch_inner(const FourStepArgs& g, cudaStream_t stream) {
  using Pl = Plan<LOGM>;
  constexpr auto kern = &inner_kernel<LOGM, MODE>;
  const int S = slot_floats<LOGM>();
  const size_t smem = slots_smem<LOGM>(S);
  int ctas = 0, sms = 0;
  cudaError_t err = residency<kern>(Pl::THREADS, smem, ctas, sms);
  if (err != cudaSuccess) return err;
  const int64_t rows = (g.columns >> g.logM) * g.R;
  int64_t grid = (int64_t)ctas * sms;
  const int64_t needed = (rows + Pl::SPB - 1) / Pl::SPB;
  if (grid > needed) grid = needed;
  kern<<<(unsigned)grid, dim3(Pl::T, Pl::SPB), smem, stream>>>(g, S);
  return cudaGetLastError();
}

template <InnerMode MODE>
cudaError_t launch_inner_any(const FourStepArgs& g, cudaStream_t stream) {
  return with_log2<12, 13>(g.M, [&](auto logm) { return launch_inner<decltype(logm)::value, MODE>(g, stream); });
}

// The filter gradient's spectrum, summed over the batch in a fixed order (deterministic):
// a[c] = scale · Σ_b a[b·C + c] for every (k2, k1), into the first C sequences of a.
__global__ void __launch_bounds__(kOuterThreads) batch_sum_kernel(float2* a, int64_t B, int64_t per_batch, float scale) {
  const int64_t e = (int64_t)blockIdx.x * kOuterThreads + threadIdx.x;
  if (e >= per_batch) return;
  float2 sum = __ldcs(a + e);
  for (int64_t b = 1; b < B; ++b) {
    const float2 z = __ldcs(a + b * per_batch + e);
    sum.x += z.x;
    sum.y += z.y;
  }
  a[e] = make_float2(sum.x * scale, sum.y * scale);
}

// The outer stage, forward or inverse, for the call's P and io type.
template <bool INVERSE>
cudaError_t launch_outer(const FourStepArgs& g, IOType io, cudaStream_t stream) {
  const int64_t outer = g.N / g.M;
  return with_io(io, [&](auto io_value) -> cudaError_t {
    using IO = decltype(io_value);
    if (outer <= 32) {
      const unsigned blocks = (unsigned)((g.columns + kOuterThreads - 1) / kOuterThreads);
      return with_log2<3, 5>(outer, [&](auto logp) {
        constexpr int P = 1 << decltype(logp)::value;
        if constexpr (INVERSE) outer_inverse_reg_kernel<P, IO><<<blocks, kOuterThreads, 0, stream>>>(g);
        else outer_forward_reg_kernel<P, IO><<<blocks, kOuterThreads, 0, stream>>>(g);
        return cudaGetLastError();
      });
    }
    return with_log2<7, 10>(outer, [&](auto logp) {
      constexpr int LOGP = decltype(logp)::value;
      using Pl = Plan<LOGP>;
      const int S = slot_floats<LOGP>();
      const size_t smem = slots_smem<LOGP>(S);
      constexpr auto kern = INVERSE ? &outer_inverse_smem_kernel<LOGP, IO> : &outer_forward_smem_kernel<LOGP, IO>;
      int ctas = 0, sms = 0;
      const cudaError_t err = residency<kern>(Pl::THREADS, smem, ctas, sms);  // sets the smem limit once
      if (err != cudaSuccess) return err;
      FourStepArgs prefetching = g;
      prefetching.tile_stride = (int64_t)ctas * sms;
      kern<<<(unsigned)(g.columns / ColumnTile<LOGP>::COLUMNS), dim3(Pl::T, Pl::SPB), smem, stream>>>(prefetching, S);
      return cudaGetLastError();
    });
  });
}

}  // namespace fp32_detail
}  // namespace

cudaError_t fourstep_conv(const FourStepParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  if (!valid_params(p) || !p.y || !p.filter_spectrum || reinterpret_cast<uintptr_t>(p.filter_spectrum) % 8 != 0)
    return cudaErrorInvalidValue;
  const FourStepArgs g = make_args(p);
  cudaError_t err = launch_outer<false>(g, p.io_type, stream);
  if (err == cudaSuccess) err = launch_inner_any<InnerMode::kConv>(g, stream);
  if (err == cudaSuccess) err = launch_outer<true>(g, p.io_type, stream);
  return err;
}

cudaError_t fourstep_spectrum(const FourStepParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  if (!valid_params(p)) return cudaErrorInvalidValue;
  FourStepArgs g = make_args(p);
  g.scale = p.spectrum_scale;
  const cudaError_t err = launch_outer<false>(g, p.io_type, stream);
  return err == cudaSuccess ? launch_inner_any<InnerMode::kSpectrum>(g, stream) : err;
}

size_t fourstep_backward_workspace_bytes(const FourStepBackwardParams& p) {
  if (p.fft_size < kFourStepMinSize || p.fft_size > kFourStepMaxSize) return 0;
  const int64_t per_intermediate = p.batch * p.channels * fourstep_rows(p.fft_size) * fourstep_inner_size(p.fft_size);
  return 2 * (size_t)per_intermediate * sizeof(float2);
}

// Eight launches through two intermediates, X (u's spectrum, then the filter gradient's) and
// the dy pipeline's:
//   X  = spectrum(u)                                   outer forward, inner kSpectrum
//   du = correlation(dy, K): outer forward of dy, inner kGrad (X <- conj(X)·DY on the way,
//        the product with conj K, the inverse), outer inverse
//   G  = Σ_b conj(X_b)·DY_b / N                        batch_sum, into X's first C rows
//   dk = the first filter_len samples of G's inverse   inner kInverse, outer inverse (fp32)
// The filter gradient is the spectrum's adjoint applied to w ⊙ G, w the row weights (rows
// 0 and P/2 once, the others twice, as the outer inverse counts them); the adjoint divides
// by w again, so G goes through the outer inverse as it is (docs/design.md).
cudaError_t fourstep_backward(const FourStepBackwardParams& p, cudaStream_t stream) {
  using namespace fp32_detail;
  if (fourstep_backward_workspace_bytes(p) == 0 || p.batch <= 0 || p.channels <= 0 || p.seq_len < 1 ||
      2 * p.seq_len > p.fft_size || p.filter_len < 1 || p.filter_len > p.seq_len || !p.u || !p.grad ||
      !p.filter_spectrum || !p.grad_u || !p.grad_filter || !p.workspace ||
      reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return cudaErrorInvalidValue;
  FourStepParams fp{};
  fp.filter_spectrum = p.filter_spectrum;
  fp.skip = p.skip;
  fp.batch = p.batch;
  fp.channels = p.channels;
  fp.seq_len = p.seq_len;
  fp.fft_size = p.fft_size;
  fp.io_type = p.io_type;
  const size_t half = fourstep_backward_workspace_bytes(p) / 2;
  float2* spectra = reinterpret_cast<float2*>(p.workspace);
  float2* dy_rows = reinterpret_cast<float2*>(static_cast<char*>(p.workspace) + half);

  // X = spectrum(u)
  fp.x = p.u;
  fp.x_batch_stride = p.u_batch_stride;
  fp.x_channel_stride = p.u_channel_stride;
  fp.intermediate = reinterpret_cast<float*>(spectra);
  FourStepArgs g = make_args(fp);
  g.scale = 1.f;
  cudaError_t err = launch_outer<false>(g, p.io_type, stream);
  if (err == cudaSuccess) err = launch_inner_any<InnerMode::kSpectrum>(g, stream);

  // du, and conj(X)·DY per sequence
  fp.x = p.grad;
  fp.x_batch_stride = p.channels * p.seq_len;
  fp.x_channel_stride = p.seq_len;
  fp.intermediate = reinterpret_cast<float*>(dy_rows);
  fp.y = p.grad_u;
  g = make_args(fp);
  g.conj = 1;
  g.products = spectra;
  if (err == cudaSuccess) err = launch_outer<false>(g, p.io_type, stream);
  if (err == cudaSuccess) err = launch_inner_any<InnerMode::kGrad>(g, stream);
  if (err == cudaSuccess) err = launch_outer<true>(g, p.io_type, stream);

  // G = Σ_b conj(X_b)·DY_b / N, then its inverse: dk
  const int64_t per_batch = p.channels * fourstep_rows(p.fft_size) * (int64_t)fourstep_inner_size(p.fft_size);
  if (err == cudaSuccess) {
    batch_sum_kernel<<<(unsigned)((per_batch + kOuterThreads - 1) / kOuterThreads), kOuterThreads, 0, stream>>>(
        spectra, p.batch, per_batch, 1.f / (float)p.fft_size);
    err = cudaGetLastError();
  }
  fp.batch = 1;
  fp.seq_len = p.filter_len;
  fp.intermediate = reinterpret_cast<float*>(spectra);
  fp.y = p.grad_filter;
  fp.skip = nullptr;
  g = make_args(fp);
  if (err == cudaSuccess) err = launch_inner_any<InnerMode::kInverse>(g, stream);
  if (err == cudaSuccess) err = launch_outer<true>(g, IOType::kFloat32, stream);
  return err;
}

}  // namespace monarch_fftconv
