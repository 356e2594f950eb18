// monarch_fftconv: the register fragments of the mma.sync Monarch kernel (tc/sm80_kernel.cuh):
// the m16n8kK operand and accumulator layouts, ldmatrix, the shared-memory operand views
// (each lane's address folded in once per stage), fragments computed from complex tables,
// and stores rounded to the operand type. Templates over the operand traits (OpTraits,
// tc/sm80_traits.cuh).
//
// CUDA headers only: never include torch here.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "common/ptx.cuh"

namespace monarch_fftconv {
namespace tc {

// ----------------------------- fragment helpers -----------------------------
// mma.sync m16n8kK, per lane g = lane/4, t = lane%4:
//   A (16 x K, row-major): 16-bit reg r holds (row g+8(r&1), k 2t+8(r>>1) +{0,1})
//                          tf32   reg r holds (row g+8(r&1), k t +4(r>>1))
//   B (K x 8, "col"):      16-bit reg r holds (k 2t+8r +{0,1}, col g)
//                          tf32   reg r holds (k t+4r, col g)
//   C (16 x 8):            e holds (row g+8(e>>1), col 2t+(e&1))

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// Shared-memory operand views. Each folds this lane's ldmatrix row (or scalar
// element) into one base address when a stage starts, so that every fragment
// load in the k loops is that base plus a compile-time offset: no per-load index
// math and no generic-to-shared conversion in the k loops.
template <class Op>
struct SmemView {
  using S = typename Op::Storage;
  uint32_t lane_addr;  // shared-space byte address of this lane's element (0, 0)
  const S* lane_ptr;   // the same as a pointer (tf32 scalar B loads)
  int stride;          // row stride in elements
  __device__ __forceinline__ uint32_t at(int row, int col) const {
    return lane_addr + uint32_t((row * stride + col) * int(sizeof(S)));
  }
};

// A operand (16 rows from r0, k from k0) of a row-major, k-contiguous buffer.
// One ldmatrix.x4 for both operand widths: a tf32 8x4 tile is an 8x8 b16 tile.
template <class Op>
__device__ __forceinline__ SmemView<Op> a_view(const typename Op::Storage* buf, int stride,
                                               int lane) {
  constexpr int kChunk = 16 / int(sizeof(typename Op::Storage));
  const typename Op::Storage* p = buf + (lane & 15) * stride + (lane >> 4) * kChunk;
  return {smem_address(p), p, stride};
}
template <class Op>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const SmemView<Op>& v, int r0, int k0) {
  ldsm_x4(a, v.at(r0, k0));
}

// The same A fragment from a buffer stored transposed, [k][m] with m contiguous
// (16-bit only): ldmatrix.trans, matrices ordered (m0,k0) (m8,k0) (m0,k8) (m8,k8).
template <class Op>
__device__ __forceinline__ SmemView<Op> at_view(const typename Op::Storage* buf, int stride,
                                                int lane) {
  const typename Op::Storage* p = buf + ((lane >> 4) * 8 + (lane & 7)) * stride + ((lane >> 3) & 1) * 8;
  return {smem_address(p), p, stride};
}
template <class Op>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const SmemView<Op>& v, int m0,
                                             int k0) {
  static_assert(Op::kPair, "ldmatrix.trans moves 16-bit elements");
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(v.at(k0, m0)));
}

// B operand (k from k0, 8 columns from n0) of a row-major [k][n] buffer
// (n contiguous): ldmatrix.trans for 16-bit, scalar loads for tf32.
template <class Op>
__device__ __forceinline__ SmemView<Op> b_view(const typename Op::Storage* buf, int stride,
                                               int lane) {
  const typename Op::Storage* p =
      Op::kPair ? buf + (lane & 15) * stride : buf + (lane & 3) * stride + (lane >> 2);
  return {smem_address(p), p, stride};
}
template <class Op>
__device__ __forceinline__ void load_b_kmajor(uint32_t (&b)[2], const SmemView<Op>& v, int k0,
                                              int n0) {
  if constexpr (Op::kPair) {
    ldsm_x2_trans(b, v.at(k0, n0));
  } else {
    b[0] = v.lane_ptr[k0 * v.stride + n0];
    b[1] = v.lane_ptr[(k0 + 4) * v.stride + n0];
  }
}

// Fragments of a complex table given by f(row, k) -> float2 (fp32 value,
// rounded here to the operand type; real and imaginary parts separately).
template <class Op, class F>
__device__ __forceinline__ void lookup_a(uint32_t (&re)[4], uint32_t (&im)[4], const F& f, int r0,
                                         int k0, int g, int t4) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = r0 + g + 8 * (r & 1);
    if constexpr (Op::kPair) {
      const int k = k0 + 2 * t4 + 8 * (r >> 1);
      const float2 v0 = f(row, k), v1 = f(row, k + 1);
      re[r] = Op::pack2(v0.x, v1.x);
      im[r] = Op::pack2(v0.y, v1.y);
    } else {
      const int k = k0 + t4 + 4 * (r >> 1);
      const float2 v = f(row, k);
      re[r] = Op::cvt1(v.x);
      im[r] = Op::cvt1(v.y);
    }
  }
}

template <class Op, class F>
__device__ __forceinline__ void lookup_b(uint32_t (&re)[2], uint32_t (&im)[2], const F& f, int c0,
                                         int k0, int g, int t4) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int col = c0 + g;
    if constexpr (Op::kPair) {
      const int k = k0 + 2 * t4 + 8 * r;
      const float2 v0 = f(col, k), v1 = f(col, k + 1);
      re[r] = Op::pack2(v0.x, v1.x);
      im[r] = Op::pack2(v0.y, v1.y);
    } else {
      const int k = k0 + t4 + 4 * r;
      const float2 v = f(col, k);
      re[r] = Op::cvt1(v.x);
      im[r] = Op::cvt1(v.y);
    }
  }
}

// Store two column-adjacent fp32 values, rounded to the operand type.
template <class Op>
__device__ __forceinline__ void store_pair(typename Op::Storage* buf, int idx, float a, float b) {
  if constexpr (Op::kPair) {
    *reinterpret_cast<uint32_t*>(buf + idx) = Op::pack2(a, b);
  } else {
    *reinterpret_cast<uint2*>(buf + idx) = make_uint2(Op::cvt1(a), Op::cvt1(b));
  }
}

}  // namespace tc
}  // namespace monarch_fftconv
