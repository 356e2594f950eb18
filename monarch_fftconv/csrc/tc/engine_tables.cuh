// monarch_fftconv: the tensor-core engine's DFT tables (tc/engine_kernel.cuh), host and device:
// tests/engine_tables_check.cu runs these very functions on the host, with a host sincospi, and
// checks that the two ways of building them give the same bits.
//
// F1 (k1, r) holds cos, sin(pi m / (n1/2)) of m = k1·r mod n1, F2 (j, s) those of m = j·s mod n2
// (F2's sine at j = 0 replaced by (-1)^s): 128 x 64 + 64 x 128 elements, but only n1 = n2 = 128
// distinct angles m.
//   per element (the first build): one double sincospi per element, 16,384 of them, 43 a thread;
//   per angle (the default): one double sincospi per angle m into fp32 scratch (cos, sin),
//     a barrier, then every element rounded from its angle's entry. The argument of angle m is the
//     same double expression, double(m) / double(n/2), so the double results, their fp32 roundings
//     and the T roundings are the same bits (tests/engine_tables_check.cu; the GPU tests compare
//     the outputs of both builds bit for bit).
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <cute/tensor.hpp>

namespace monarch_fftconv {
namespace engine {

// The angle index of F1's (k1, r) and F2's (j, s), and its argument for sincospi (pi · argument).
template <int kN>
__host__ __device__ constexpr int table_angle(int a, int b) { return (a * b) % kN; }
template <int kN>
__host__ __device__ inline double table_argument(int m) { return double(m) / double(kN / 2); }

// Element i of F1 and of F2, from the (cos, sin) of its angle. Sincos(m, &sin, &cos) gives
// the double sine and cosine of pi · table_argument(m).
template <class Cfg, class Tensor1, class CosSin>
__host__ __device__ inline void table_store_f1(Tensor1& sF1c, Tensor1& sF1s, int i, CosSin&& cos_sin) {
  using T = typename Cfg::T;
  const int k1 = i / Cfg::kInputRows, r = i % Cfg::kInputRows;
  float cs, sn;
  cos_sin(table_angle<Cfg::kN1>(k1, r), cs, sn);
  sF1c(k1, r) = T(cs);
  sF1s(k1, r) = T(sn);
}
template <class Cfg, class Tensor2, class CosSin>
__host__ __device__ inline void table_store_f2(Tensor2& sF2c, Tensor2& sF2s, int i, CosSin&& cos_sin) {
  using T = typename Cfg::T;
  const int j = i / Cfg::kN2, s = i % Cfg::kN2;
  float cs, sn;
  cos_sin(table_angle<Cfg::kN2>(j, s), cs, sn);
  sF2c(j, s) = T(cs);
  sF2s(j, s) = T(j == 0 ? ((s & 1) ? -1.0f : 1.0f) : sn);  // column n2/2 in the zero sines' slot
}

// The per-element build, thread `tid` of `threads`: Sincos(x, &sin, &cos) in double.
template <class Cfg, class TensorF1, class TensorF2, class Sincos>
__host__ __device__ inline void tables_per_element(TensorF1& sF1c, TensorF1& sF1s, TensorF2& sF2c, TensorF2& sF2s,
                                                   int tid, int threads, Sincos&& sincos_pi) {
  for (int i = tid; i < Cfg::kF1Elems; i += threads) {
    table_store_f1<Cfg>(sF1c, sF1s, i, [&](int m, float& cs, float& sn) {
      double s, c;
      sincos_pi(table_argument<Cfg::kN1>(m), &s, &c);
      cs = float(c);
      sn = float(s);
    });
  }
  for (int i = tid; i < Cfg::kF2Elems; i += threads) {
    table_store_f2<Cfg>(sF2c, sF2s, i, [&](int m, float& cs, float& sn) {
      double s, c;
      sincos_pi(table_argument<Cfg::kN2>(m), &s, &c);
      cs = float(c);
      sn = float(s);
    });
  }
}

// The per-angle build, first half: angles[m] = (float(cos), float(sin)) of angle m < n1.
template <class Cfg, class Sincos>
__host__ __device__ inline void table_angles(float2* angles, int tid, int threads, Sincos&& sincos_pi) {
  static_assert(Cfg::kN1 == Cfg::kN2, "one angle table serves F1 and F2");
  for (int m = tid; m < Cfg::kN1; m += threads) {
    double s, c;
    sincos_pi(table_argument<Cfg::kN1>(m), &s, &c);
    angles[m] = make_float2(float(c), float(s));
  }
}
// Second half, after a barrier that publishes every angle: the elements from the angles.
template <class Cfg, class TensorF1, class TensorF2>
__host__ __device__ inline void tables_from_angles(TensorF1& sF1c, TensorF1& sF1s, TensorF2& sF2c, TensorF2& sF2s,
                                                   const float2* angles, int tid, int threads) {
  const auto lookup = [&](int m, float& cs, float& sn) {
    const float2 a = angles[m];
    cs = a.x;
    sn = a.y;
  };
  for (int i = tid; i < Cfg::kF1Elems; i += threads) table_store_f1<Cfg>(sF1c, sF1s, i, lookup);
  for (int i = tid; i < Cfg::kF2Elems; i += threads) table_store_f2<Cfg>(sF2c, sF2s, i, lookup);
}

}  // namespace engine
}  // namespace monarch_fftconv
