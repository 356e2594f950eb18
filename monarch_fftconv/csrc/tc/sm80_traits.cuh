// monarch_fftconv: kernel traits of the fused tensor-core Monarch convolution
// (tc/sm80_kernel.cuh). The one home of tile shapes, shared-memory
// layout and operand precision policy. CUDA + CuTe only: never include torch.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cute/arch/mma_sm80.hpp>

#include "fftconv.h"
#include "common/limits.cuh"
#include "tc/io_traits.cuh"

namespace monarch_fftconv {
namespace tc {

// ---------------------------------------------------------------------------
// Operand precision policy: how one fp32 value is rounded to the MMA operand
// type, how it is kept in shared memory, and which CuTe MMA atom consumes it.
//   16-bit types: m16n8k16, two k-adjacent elements packed in one register,
//                 stored in smem as raw 16-bit words.
//   tf32:         m16n8k8, one element per register, stored in smem as the
//                 tf32-rounded fp32 bit pattern.
// ---------------------------------------------------------------------------
template <Precision P> struct OpTraits;

// The two 16-bit types differ only in the conversion and the MMA atom.
template <class ToBits, class Atom>
struct OpTraits16 {
  using Storage = uint16_t;
  static constexpr int kK = 16;
  static constexpr bool kPair = true;
  static constexpr uint32_t kNegMask = 0x80008000u;  // negate both halves
  __device__ __forceinline__ static Storage cvt1(float x) { return ToBits::rn(x); }
  __device__ __forceinline__ static uint32_t pack2(float lo, float hi) {
    return uint32_t(cvt1(lo)) | (uint32_t(cvt1(hi)) << 16);
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    Atom::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3], b[0], b[1], d[0], d[1], d[2], d[3]);
  }
};

struct BF16Bits {
  __device__ __forceinline__ static uint16_t rn(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};
struct FP16Bits {
  __device__ __forceinline__ static uint16_t rn(float x) { return __half_as_ushort(__float2half_rn(x)); }
};

template <> struct OpTraits<Precision::kBF16>
    : OpTraits16<BF16Bits, cute::SM80_16x8x16_F32BF16BF16F32_TN> {};
template <> struct OpTraits<Precision::kFP16>
    : OpTraits16<FP16Bits, cute::SM80_16x8x16_F32F16F16F32_TN> {};

template <> struct OpTraits<Precision::kTF32> {
  using Storage = uint32_t;
  static constexpr int kK = 8;
  static constexpr bool kPair = false;
  static constexpr uint32_t kNegMask = 0x80000000u;
  __device__ __forceinline__ static Storage cvt1(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    cute::SM80_16x8x8_F32TF32TF32F32_TN::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3],
                                             b[0], b[1], d[0], d[1], d[2], d[3]);
  }
};

constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int cmin(int a, int b) { return a < b ? a : b; }

// ---------------------------------------------------------------------------
// Kernel configuration for one (n1, n2, precision, io) instance.
//
// One CTA of 8 warps works on one (b, c) sequence at a time (persistent grid),
// 2 CTAs per SM (<= 128 registers).
// Every stage's whole output lives in registers spread over the 8 warps, so
// one shared-memory data buffer is reused in place between stages, always
// row-major with the n2 index contiguous (no transposes): operands whose
// contraction index is the row index are read with ldmatrix.trans (16-bit) or
// scalar loads (tf32).
//
// Shared memory:
//   W1[n1]  float2   exp(-2 pi i a / n1)
//   W2[n2]  float2   exp(-2 pi i a / n2)
//   TL[128] float2   exp(-2 pi i a / N), a < 128      (twiddle low digits; row steps)
//   TH[N/64]float2   exp(-2 pi i 64 a / N)            (twiddle, high digits)
//   data    Storage  X [kHK][kSD] (real), then A / P / A' as [2][kRP][kSD]
//                    (planar re, im; rows k1; zero rows k1 > H)
//   16-bit only (kTables): operand-type matrices
//     F1 [2][kRP][kSF1]    F1[k1][j] = exp(-2 pi i k1 j / n1), 0 for k1 > H or j >= H.
//                          Stage 1 reads it as A (rows k1); inverse stage 1 reads
//                          it transposed (rows j), its weights 1,2,..,2,1 being
//                          folded into A' (exact: a power of two).
//     G2 [kNT2][N2/kK][32] uint4, stage-2 B fragments of the half-column DFT
//                          matrix in lane order: one conflict-free 16-byte load
//                          per lane per k step, no index math.
//   Row strides are padded by 16 bytes (ldmatrix rows hit distinct banks).
// ---------------------------------------------------------------------------
template <int N1_, int N2_, Precision P_, IOType IO_>
struct Cfg {
  static constexpr int N1 = N1_, N2 = N2_;
  using Op = OpTraits<P_>;
  using Io = IoTraits<IO_>;
  using S = typename Op::Storage;

  static constexpr int kN = N1 * N2;
  static constexpr int kH = N1 / 2;                       // Hermitian rows 0..kH
  static constexpr int kRP = ((kH + 1 + 15) / 16) * 16;   // rows padded to m16
  static constexpr int kRowsLive8 = ((kH + 1 + 7) / 8) * 8; // rows written by the epilogues
  static constexpr int kK = Op::kK;
  static constexpr int kHK = cmax(kH, kK);                // rows of X (stage-1 K)
  static constexpr int kPadE = 16 / int(sizeof(S));
  static constexpr int kSD = N2 + kPadE;                  // data row stride
  static constexpr int kPlane = kRP * kSD;
  static constexpr int kDataElems = cmax(kHK * kSD, 2 * kPlane);

  static constexpr bool kTables = sizeof(S) == 2;
  static constexpr int kMT1 = (kH + 15) / 16;             // inverse stage-1 m tiles
  static constexpr int kRows1 = kMT1 * 16;                // <= kHK: F1's columns serve as its rows
  static constexpr int kSF1 = kHK + kPadE;
  static constexpr int kF1Plane = kRP * kSF1;
  static constexpr int kTabElems = kTables ? 2 * kF1Plane : 0;
  static constexpr int kKSteps2 = N2 / kK;                // stage-2 k steps
  static constexpr size_t kG2Bytes = kTables ? size_t(N2 / 16) * kKSteps2 * 32 * 16 : 0;

  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  // Stages 1 and 2 run their m tiles in passes of kPass, so that only one pass's
  // accumulators are live: the registers this frees let loads run ahead of the MMAs.
  static constexpr int kPass = 2;
  static constexpr int kMT = kRP / 16;                    // m16 tiles (rows k1)
  // stages 1 and inverse 1: n8 tiles over all n2 columns
  static constexpr int kNT = N2 / 8;
  static constexpr int kWN = cmin(kWarps, kNT);
  static constexpr int kWM = kWarps / kWN;
  static constexpr int kMTW = (kMT + kWM - 1) / kWM;
  static constexpr int kNTW = kNT / kWN;
  static constexpr int kMTW1 = (kMT1 + kWM - 1) / kWM;
  // stages 2 and inverse 2: n8 tiles over the half columns 0 .. n2/2-1
  // (column n2/2 rides in the imaginary slot of column 0)
  static constexpr int kNT2 = N2 / 16;
  static constexpr int kWN2 = cmin(kWarps, kNT2);
  static constexpr int kWM2 = kWarps / kWN2;
  static constexpr int kMTW2 = (kMT + kWM2 - 1) / kWM2;
  static constexpr int kNTW2 = kNT2 / kWN2;

  static constexpr int kTL = 128;                          // TL entries (>= kRP, >= 64)
  static constexpr int kSmallF2 = N1 + N2 + kTL + kN / 64;  // float2 entries
  static constexpr size_t kSmallBytes = ((size_t(kSmallF2) * 8 + 15) / 16) * 16;
  static constexpr size_t kSmemBytes =
      kSmallBytes + size_t(kDataElems) * sizeof(S) + size_t(kTabElems) * sizeof(S) + kG2Bytes;

  static_assert(N1 >= N2 && N1 <= 128 && N2 >= 16, "unsupported Monarch split");
  static_assert((N1 & (N1 - 1)) == 0 && (N2 & (N2 - 1)) == 0, "powers of two");
  static_assert(kNT % kWN == 0 && kNT2 % kWN2 == 0, "n tiles must split evenly over warps");
  static_assert(kN / 64 >= 1 && kRP <= N1 && kRP <= kTL, "twiddle tables");
  static_assert((kSD * sizeof(S)) % 16 == 0 && (kSF1 * sizeof(S)) % 16 == 0,
                "ldmatrix rows must be 16-byte aligned");
  static_assert((kPlane * sizeof(S)) % 16 == 0 && (kF1Plane * sizeof(S)) % 16 == 0 &&
                (kDataElems * sizeof(S)) % 16 == 0, "align");
  static_assert(!kTables || kRows1 <= kHK, "inverse stage 1 reads F1 transposed");
  static_assert(kRowsLive8 >= kHK, "X must not cover the always-zero padding rows");
  static_assert(kSmemBytes <= max_smem_per_cta(2), "two CTAs per SM");
};

}  // namespace tc
}  // namespace monarch_fftconv
