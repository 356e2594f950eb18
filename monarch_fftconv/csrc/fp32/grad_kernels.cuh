// monarch_fftconv: the fused fp32-accurate backward of the causal FFT convolution: its kernels
// and launchers (the checks and the entry points: fp32/fftconv_fp32_backward.cu; the instances:
// fp32/grad_instances_*_part<n>.cu, one unit per io type, gating and size part, which build in
// parallel).
//
// The forward computed y = x * k' for each sequence, k' the channel's filter with the skip
// term D added at lag 0, through Y = X·K' (K' = FFT(k')/N, the forward's filter spectrum).
// Given dy:
//   du[b,c]   = correlation(dy[b,c], k')           = IFFT(DY · conj K')
//   dk[c, s]  = Σ_b Σ_t dy[b,c,t]·u[b,c,t-s]       = IFFT(Σ_b DY_b · conj U_b)[s],  s < Lk
//   dD[c]     = Σ_b Σ_t dy[b,c,t]·u[b,c,t]         = dk[c, 0]
// N = 2·next_pow2(L) leaves room for every lag of both correlations: nothing wraps.
//
// Two kernels, built from the forward's passes (fp32/radix.cuh, same plan, same shared-memory
// layout, same thread <-> frequency-pair assignment in the mid pass):
//
//   grad_kernel: one work item per (channel c, chunk of the batch). For each b of the chunk,
//     in order:
//       U  = forward passes of u[b,c]: each thread parks the spectrum pairs X_u[k], X_u[M-k]
//            of its mid-pass frequency pairs: all in shared memory on the on-chip route,
//            half in smem and half in a per-item global scratch on the scratch route
//            (GradLayout). Each thread reads back only what it wrote itself: no
//            synchronisation.
//       DY = forward passes of dy[b,c] (the same code as U's: one copy keeps the kernel
//            small enough for the instruction cache), then two sweeps over the pairs:
//              acc += conj(X_u)·X_dy            (fp32, per item, fixed b order; in smem or
//                                               the scratch), while the channel's K' is
//                                               copied into smem
//              V    = inverse split of X_dy · conj K'
//            and the forward's inverse passes store du[b,c].
//   filter_grad_kernel: per channel, the chunks' accumulators summed in chunk order, ·1/N,
//     the inverse split and inverse passes, the first Lk samples stored as dk[c] (and
//     dk[c, 0] as dD[c]); two-sided, also bins N - s as lag -s (dk (C, 2, Lk)).
//
// Gated (the fused gated training step, issue #39; ConvBackwardParams' gates): the forward was
// y = postgate ⊙ z, z = x * k', x = pregate ⊙ u. The GATED instance of the grad kernel runs the
// same passes on x = pregate ⊙ u (the u pass's load) and dz = postgate ⊙ dy (the dy pass's
// load), so its accumulator is Σ_b conj(X)·DZ: filter_grad_kernel then gives dk = Σ_b dz ⋆ x
// and dD = dk[c, 0] = Σ dz·x, the gradients of the gated forward, unchanged. Its store takes
// dx = IFFT(DZ · conj K') to du = pregate ⊙ dx and dpregate = u ⊙ dx (u and pregate read again:
// L2 holds them since the u pass, one sequence per CTA on the on-chip route). fp32 io only
// (kGatedGradIO); the ungated kernels are untouched.
//
// Deterministic: no atomics; every sum has a fixed order. The chunking (how many work items
// share a channel) depends only on the shape, the device and the route (GradLayout: the
// default or MONARCH_FFTCONV_GRAD_ACCUMULATOR=global), so a given call on a given GPU gives
// the same bits run after run. MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS (the uniform pair sweeps by
// default, =0 thread 0's own path) changes only the control flow of the pair sweeps (on the
// on-chip route), not the bits.

#pragma once

#include "fp32/radix.cuh"

#include <cuda/annotated_ptr>
#include <type_traits>

namespace monarch_fftconv {
namespace {
namespace fp32_detail {

struct GradArgs {
  KArgs k;           // u (+ strides), the filter spectrum K', the skip term, geometry; k.y unused
  const void* dy;    // (B, C, L) contiguous
  void* du;          // (B, C, L) contiguous
  float* dk;         // (C, Lk) contiguous; (C, 2, Lk) for filter_grad_kernel<LOGM, true>
  float* dskip;      // (C,) or nullptr
  float4* xu;        // per work item: GradLayout::kScratchSlots·T pairs (X_u[k], X_u[M-k]); the rest in smem
  float4* acc;       // per work item: kPairSlots·T pairs of Σ_b conj(X_u)·X_dy
  int64_t items;     // C · chunks; item w covers channel w / chunks
  int64_t chunk;     // batch entries per work item (the last may have fewer)
  int64_t Lk;
  int chunks;
  int row_shift;     // the ungated kernels' grouped rows (filter_row; in the padding before dpre)
  // The GATED grad kernel's (k.pregate, k.postgate: the gates, or nullptr): dpregate = u ⊙ dx,
  // (B, C, L) contiguous, given with k.pregate. Last, so the ungated kernels' fields keep their offsets.
  void* dpre;
  // dpostgate = dy ⊙ z, stored where both are given (ConvBackwardParams::postgate_z,
  // grad_postgate: (B, C, L) contiguous, fp32), else nullptr.
  const void* z;
  void* dpost;
};

// The io types the gated grad kernel is built for: those of backends.FUSED_GATE_IO_DTYPES (fp32;
// each more would add its three routes' instances to this unit's build).
template <typename IO>
constexpr bool kGatedGradIO = std::is_same_v<IO, float>;

// How the scratch meets L2. The scratch (X_u and the accumulator: ~36 MB at every N, as the
// slots hold 32768 points per SM) and the channels' spectra outgrow L2 (H200: 50 MB), so the
// accumulator sweep waits on DRAM. At N <= 8192 the scratch is loaded and stored with the
// persisting (evict-last) L2 property: 0.750 -> 0.717 ms fwd+bwd at 16x256x4096. At N = 16384
// it measured 2% slower (1.183 -> 1.208 ms) and left the L2 hit rate as it was (56 -> 54%), so
// it is off there (docs/performance.md, session 11).
template <int LOGM>
__device__ __forceinline__ float4* scratch_view(float4* p) {
  if constexpr (LOGM <= 12) {
    return cuda::associate_access_property(p, cuda::access_property::persisting{});
  } else {
    return p;
  }
}

// Where the grad kernel keeps a work item's X_u and its accumulator across the batch loop.
//   Scratch (ON_CHIP = false): two CTAs of 256 threads per SM, or at N = 32768 (the route's one
//     default use) one of 512 (128 registers a thread either way). X_u's first
//     8 pair slots of each thread live in the shared memory two CTAs leave over
//     (half of X_u at every N), the rest and the accumulator in a global scratch: 1.38 GB
//     moved at 16x256x8192 against 0.40 GB compulsory, as the scratch and the spectra outgrow
//     L2 (ncu, docs/performance.md, session 16). Parking half of X_u measured 804 -> 738 us
//     (session 12).
//   On chip (ON_CHIP = true): one CTA per SM, all of X_u and the accumulator in shared memory
//     (2 x 17 float4 a thread: 139 KB for 256 threads, beside the 76 KB of areas and tables at
//     N = 16384), and the register cap lifted to 255 (the scratch route spills at 128). The
//     accumulator leaves the chip once per work item, for filter_grad_kernel. Half the warps
//     per SM; N = 32768 (512 threads) does not fit and keeps the scratch route.
template <int LOGM, bool ON_CHIP>
struct GradLayout {
  using P = Plan<LOGM>;
  static constexpr int kMinCtas = ON_CHIP ? 1 : P::MIN_CTAS;
  static constexpr int kParkedSlots = ON_CHIP ? kPairSlots : 8;  // X_u's pair slots in smem
  static constexpr int kScratchSlots = kPairSlots - kParkedSlots;  // X_u's pair slots in the scratch
  static constexpr int kAccSmemSlots = ON_CHIP ? kPairSlots : 0;   // the accumulator's, in smem

  // The float offset of the parked slots in the kernel's shared memory: after the slots'
  // areas and the tables, 16-byte aligned. The accumulator's slots follow them.
  __host__ __device__ __forceinline__ static size_t parked_offset_floats(int S) {
    return ((size_t)P::SPB * 2 * S + 2 * (size_t)P::N_TW + 3) & ~size_t(3);
  }
  static size_t smem_bytes(int n1, int n2) {
    return parked_offset_floats(area_floats<LOGM>(n1, n2)) * sizeof(float) +
           (size_t)(kParkedSlots + kAccSmemSlots) * P::THREADS * sizeof(float4);
  }
  // Per work item: X_u's scratch slots and the accumulator (the on-chip route's leaves once).
  static size_t workspace_bytes(int64_t items) {
    return (size_t)items * (kScratchSlots + kPairSlots) * P::T * sizeof(float4);
  }
};

// The gated grad kernel's store (GATED): dx, the correlation of dz with K', from the inverse
// passes into du = pregate ⊙ dx and dpregate = u ⊙ dx where the pregate is given, into du = dx
// where it is not. u is read through its strides, as the u pass read it.
template <int LOGM, typename IO>
__device__ __forceinline__ void inverse_passes_gated(float* re, float* im, int tx, const float2* twM,
                                                     const float2* twIP2, cf (&A2)[16], cf (&B2)[16],
                                                     const GradArgs& g, int64_t b, int64_t c, int Lv) {
  using P = Plan<LOGM>;
  constexpr int T = P::T, R = P::R1, NB = 32 / R, NS = P::M / R;
  const KArgs& a = g.k;
  const int64_t row = (b * a.C + c) * a.L;  // du, dpregate and the gates are contiguous (B, C, L)
  cf v[NB][R];
  inverse_to_registers<LOGM>(re, im, tx, twM, twIP2, A2, B2, v);
  IO* du = static_cast<IO*>(g.du) + row;
  const bool opair = (reinterpret_cast<uintptr_t>(du) & (2 * sizeof(IO) - 1)) == 0;  // dpregate's too
  if (a.pregate != nullptr) {
    cf dpre[NB][R];
#pragma unroll
    for (int q = 0; q < NB; ++q) {
#pragma unroll
      for (int r = 0; r < R / 2; ++r) dpre[q][r] = v[q][r];
    }
    apply_gate<T>(dpre, static_cast<const IO*>(a.u) + b * a.ubs + c * a.ucs, tx, NS, Lv);
    store_causal_half<T>(static_cast<IO*>(g.dpre) + row, dpre, tx, NS, Lv, opair);
    apply_gate<T>(v, static_cast<const IO*>(a.pregate) + row, tx, NS, Lv);
  }
  store_causal_half<T>(du, v, tx, NS, Lv, opair);
}

// The grad kernel's body. UNIFORM_PAIRS: the pair sweeps in one code path for every thread
// (for_each_pair_uniform), thread 0 included; otherwise for_each_pair's separate thread-0 path.
// GATED: the gated step's (x = pregate ⊙ u and dz = postgate ⊙ dy transformed, du and dpregate
// stored by inverse_passes_gated); the ungated instance is the code as it was.
// WITH_DU = false: the accumulator alone (the split backward's filter sums: no filter stage,
// no filter sweep, no inverse passes; du (GATED: du and dpregate) is the caller's, a forward
// call with the conjugated spectrum). The next iteration's forward passes start with a barrier
// before they write smem, so nothing here waits for the other threads' mid passes.
template <int LOGM, typename IO, bool ON_CHIP, bool UNIFORM_PAIRS, bool GATED = false, bool WITH_DU = true>
__device__ __forceinline__ void grad_iterations(const GradArgs& g) {
  using P = Plan<LOGM>;
  using Layout = GradLayout<LOGM, ON_CHIP>;
  constexpr int M = P::M, T = P::T, SPB = P::SPB;
  constexpr int kParked = Layout::kParkedSlots;
  const KArgs& a = g.k;
  extern __shared__ float4 smem_raw[];
  const SlotSmem<LOGM> slot(reinterpret_cast<float*>(smem_raw), a.S);
  float *re = slot.re, *im = slot.im;
  float2* stage = reinterpret_cast<float2*>(re);
  const float2 *twFP2 = slot.fp2(), *twM = slot.mid(), *twIP2 = slot.ip2();
  const cf wp0 = slot.wp0, wp1 = slot.wp1;
  const int tx = threadIdx.x, ty = threadIdx.y;
  cf pair_tw[16];
  if constexpr (UNIFORM_PAIRS) uniform_pair_twiddles(tx, wp0, wp1, pair_tw);

  const int64_t item = (int64_t)blockIdx.x * SPB + ty;
  const bool has_item = item < g.items;
  const int64_t c = has_item ? item / g.chunks : 0;
  const int64_t b_begin = has_item ? (item % g.chunks) * g.chunk : 0;
  const int64_t b_end = b_begin + g.chunk < a.B ? b_begin + g.chunk : a.B;
  // The item's scratch: only this thread reads back what it wrote, so restrict holds and
  // the loads of later pairs may be issued early.
  float4* __restrict__ xu = scratch_view<LOGM>(g.xu + item * (Layout::kScratchSlots * T) + tx);
  float4* __restrict__ acc_out = g.acc + item * (kPairSlots * T) + tx;
  float4* __restrict__ acc_scratch = scratch_view<LOGM>(acc_out);
  // This thread's smem slots: X_u's parked pair `pair` at parked[pair * THREADS], the on-chip
  // accumulator's at acc_smem[pair * THREADS] (consecutive threads, consecutive float4: no
  // bank conflicts).
  float4* parked = reinterpret_cast<float4*>(reinterpret_cast<float*>(smem_raw) + Layout::parked_offset_floats(a.S)) +
                   (ty * T + tx);
  float4* acc_smem = parked + kParked * P::THREADS;
  const auto acc_at = [&](int pair) -> float4& { return ON_CHIP ? acc_smem[pair * P::THREADS] : acc_scratch[pair * T]; };
  const int64_t L = a.L;
  cf A[16], Bv[16], A2[16], B2[16];
  const auto pairs = [&](auto&& op) {
    if constexpr (UNIFORM_PAIRS) {
      for_each_pair_uniform<M>(tx, A, Bv, A2, B2, pair_tw,
                               [&](int pair, int f, cf zk, cf zm, cf w, cf& vk, cf& vm, auto) {
                                 op(pair, f, zk, zm, w, vk, vm);
                               });
    } else {
      for_each_pair<M>(tx, A, Bv, A2, B2, wp0, wp1, op);
    }
  };

  // Every slot of the CTA runs g.chunk iterations (the barriers must match); iterations past
  // the slot's own range compute on zeros and store nothing.
  for (int64_t i = 0; i < g.chunk; ++i) {
    const int64_t b = b_begin + i;
    const bool valid = has_item && b < b_end;
    const int Lv = valid ? (int)L : 0;
    const int64_t row = (b * a.C + c) * L;
    // The next sequence's u and dy, asked of L2 now: their loads then wait on L2, not DRAM, while
    // this iteration's passes run. Measured (session 27, H200, the same process alternating): the
    // uniform grad kernel 253 -> 235 us at 16x256x4096, 475 -> 456 at 16x256x8192, the same bits.
    // (The four-step inner kernels' next rows, 64 KB each, asked the same way, lost: 6.38 -> 7.16
    // ms at 8x256x65536, L2 thrashed.)
    if (valid && b + 1 < b_end) {
      const int64_t bytes = L * (int64_t)sizeof(IO);
      prefetch_span_l2(static_cast<const IO*>(a.u) + (b + 1) * a.ubs + c * a.ucs, bytes, tx, T);
      prefetch_span_l2(static_cast<const IO*>(g.dy) + row + a.C * L, bytes, tx, T);
      if constexpr (GATED && MONARCH_FFTCONV_GATED_L2_PREFETCH != 0) {  // and its gates
        if (a.pregate != nullptr) prefetch_span_l2(static_cast<const IO*>(a.pregate) + row + a.C * L, bytes, tx, T);
        if (a.postgate != nullptr) prefetch_span_l2(static_cast<const IO*>(a.postgate) + row + a.C * L, bytes, tx, T);
      }
    }
    // dpostgate = dy ⊙ z where it is asked for, a pass of its own while no transform values are
    // live (inside the dy pass's loads it raised the scratch routes' spills, 328/964 -> 852/2096 B
    // at N = 8192); dy, asked of L2 by the previous iteration, stays there for the dy pass.
    if constexpr (GATED && std::is_same_v<IO, float>) {
      if (g.dpost != nullptr)
        multiply_rows(static_cast<float*>(g.dpost) + row, static_cast<const float*>(g.dy) + row,
                      static_cast<const float*>(g.z) + row, Lv, tx, T);
    }
    // The scratch accumulator is read at the end of the iteration: ask L2 for it now.
    if (!ON_CHIP && valid && i > 0) {
#pragma unroll
      for (int pair = 0; pair < kPairSlots; ++pair) prefetch_l2(acc_scratch + pair * T);
    }

    // Forward passes of u, then of dy, through one copy of the code (the kernel's size, not
    // its registers, limits it: instruction-fetch stalls). After the u pass, each thread
    // parks its spectrum pairs X_u[k], X_u[M-k].
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
      const IO* x = pass == 0 ? static_cast<const IO*>(a.u) + b * a.ubs + c * a.ucs : static_cast<const IO*>(g.dy) + row;
      if constexpr (GATED) {
        // x = pregate ⊙ u, then dz = postgate ⊙ dy (a missing gate: the sequence as it is)
        const IO* gate = static_cast<const IO*>(pass == 0 ? a.pregate : a.postgate);
        forward_passes<LOGM, IO, true>(re, im, tx, twFP2, x, Lv, gate == nullptr ? nullptr : gate + row);
      } else {
        forward_passes<LOGM, IO>(re, im, tx, twFP2, x, Lv);
      }
      mid_forward<M>(re, im, tx, twM, A, Bv);
      if (pass == 1) break;
      pairs([&](int pair, int, cf zk, cf zm, cf w, cf&, cf&) {
        cf xk, xm;
        split_pair(zk, zm, w, xk, xm);
        const float4 x4 = make_float4(xk.x, xk.y, xm.x, xm.y);
        if (pair < kParked) parked[pair * P::THREADS] = x4;  // pair is a constant once unrolled
        else if (valid) xu[(pair - kParked) * T] = x4;
      });
    }

    // The filter stage's copy runs while the accumulator sweep below waits on memory.
    if constexpr (WITH_DU) {
      __syncthreads();  // all of Z is in registers: smem becomes the filter stage
      const int row_shift = GATED ? 0 : g.row_shift;  // the gated kernel: a row per channel
      if (UNIFORM_PAIRS && T % a.n2 == 0) stage_filter_begin_fixed_column<T>(stage, a, c, row_shift, valid, tx);
      else stage_filter_begin<T>(stage, a, c, row_shift, valid, tx);
    }

    // acc += conj(X_u)·X_dy per pair, in a sweep of its own: the filter sweep below then
    // holds no X_u values (the split is cheap to redo).
    if (valid) {
      pairs([&](int pair, int, cf zk, cf zm, cf w, cf&, cf&) {
        cf xk, xm;
        split_pair(zk, zm, w, xk, xm);
        const float4 x4 = pair < kParked ? parked[pair * P::THREADS] : xu[(pair - kParked) * T];
        cf pk = cmul(cf{x4.x, -x4.y}, xk), pm = cmul(cf{x4.z, -x4.w}, xm);
        float4& sum = acc_at(pair);
        if (i > 0) {
          const float4 o = sum;
          pk = cadd(pk, cf{o.x, o.y});
          pm = cadd(pm, cf{o.z, o.w});
        }
        sum = make_float4(pk.x, pk.y, pm.x, pm.y);
      });
    }
    if constexpr (!WITH_DU) continue;

    // du = IFFT(X_dy · conj K')
    stage_filter_end<T>(stage, a, c, valid, tx);
    if constexpr (UNIFORM_PAIRS) {
      // K' by walks (the launcher's n1 | M/16): the same entries as kspec, fewer index operations
      const UniformFilterWalks<M> walks(tx, a);
      const auto filter_pair = [&](int, int f, cf zk, cf zm, cf w, cf& vk, cf& vm, auto step) {
        cf kk, km;
        if constexpr (step == kHalfPairStep) {
          kk = km = kspec(stage, f, a);
        } else {
          kk = (step < 8 ? walks.k_lo : walks.k_hi).at(stage, step);
          km = (step < 8 ? walks.m_lo : walks.m_hi).at(stage, step);
        }
        cf xk, xm;
        split_pair(zk, zm, w, xk, xm);
        merge_pair(cmul(xk, cconj(kk)), cmul(xm, cconj(km)), w, vk, vm);
      };
      for_each_pair_uniform<M>(tx, A, Bv, A2, B2, pair_tw, filter_pair);
    } else {
      pairs([&](int, int f, cf zk, cf zm, cf w, cf& vk, cf& vm) {
        fence(f);
        cf xk, xm;
        split_pair(zk, zm, w, xk, xm);
        merge_pair(cmul(xk, cconj(kspec(stage, f, a))), cmul(xm, cconj(kspec(stage, M - f, a))), w, vk, vm);
      });
    }
    if constexpr (GATED) {
      inverse_passes_gated<LOGM, IO>(re, im, tx, twM, twIP2, A2, B2, g, b, c, Lv);
    } else {
      inverse_passes<LOGM, IO>(re, im, tx, twM, twIP2, A2, B2, static_cast<IO*>(g.du) + row, Lv);
    }
  }

  // The on-chip accumulator leaves once, for filter_grad_kernel: the 16 pair slots of every
  // thread, and thread 0's 17th (kPairSlots).
  if constexpr (ON_CHIP) {
    if (has_item) {
#pragma unroll
      for (int pair = 0; pair < kPairSlots; ++pair) {
        if (pair == kPairSlots - 1 && tx != 0) continue;
        acc_out[pair * T] = acc_smem[pair * P::THREADS];
      }
    }
  }
}

template <int LOGM, typename IO, bool ON_CHIP>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, (GradLayout<LOGM, ON_CHIP>::kMinCtas))
    fftconv_fp32_grad_kernel(const GradArgs g) {
  grad_iterations<LOGM, IO, ON_CHIP, false>(g);
}

// The uniform pair sweeps, on the on-chip route only (one CTA per SM: nothing hides the thread-0
// path there); the default there since session 20 (H100: 331 -> 257 us at 16x256x4096, 585 ->
// 483 at 16x256x8192). Its filter walks need n1 | M/16 (launch_grad_route).
template <int LOGM, typename IO>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, (GradLayout<LOGM, true>::kMinCtas))
    fftconv_fp32_grad_uniform_pairs_kernel(const GradArgs g) {
  grad_iterations<LOGM, IO, true, true>(g);
}

// The gated training step's grad kernel (GATED grad_iterations), on each route and sweep: kernels
// of their own, so that the ungated kernels keep their names and code.
template <int LOGM, typename IO, bool ON_CHIP, bool UNIFORM_PAIRS>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, (GradLayout<LOGM, ON_CHIP>::kMinCtas))
    fftconv_fp32_gated_grad_kernel(const GradArgs g) {
  grad_iterations<LOGM, IO, ON_CHIP, UNIFORM_PAIRS, true>(g);
}

// The split backward's filter sums (WITH_DU = false): the scratch route's accumulator without
// du, built where the grad kernel cannot keep its sums on chip (kSplitBackward); the caller
// stores du with a forward call on the conjugated spectrum (binding.cpp, grad_split_from_env).
// UNIFORM_PAIRS (the default, as on the on-chip route): with no filter sweep the uniform sweeps
// fit 128 registers (ptxas at N = 32768: 8/8 B spilled, thread 0's own path 96/176), and with
// one CTA per SM nothing hides thread 0's path. Its sweeps need no filter walks (no n1 | M/16).
template <int LOGM>
constexpr bool kSplitBackward = (Plan<LOGM>::THREADS > 256);

// GATED: the sums of x = pregate ⊙ u and dz = postgate ⊙ dy (the gated step's).
template <int LOGM, typename IO, bool UNIFORM_PAIRS, bool GATED>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, (GradLayout<LOGM, false>::kMinCtas))
    fftconv_fp32_filter_sums_kernel(const GradArgs g) {
  grad_iterations<LOGM, IO, false, UNIFORM_PAIRS, GATED, false>(g);
}

// TWO_SIDED: dk (C, 2, Lk), lag -s stored from the circle's bin N - s beside lag s.
template <int LOGM, bool TWO_SIDED>
__global__ void __launch_bounds__(Plan<LOGM>::THREADS, Plan<LOGM>::MIN_CTAS) filter_grad_kernel(const GradArgs g) {
  using P = Plan<LOGM>;
  constexpr int M = P::M, T = P::T, SPB = P::SPB;
  const KArgs& a = g.k;
  extern __shared__ float4 smem_raw[];
  const SlotSmem<LOGM> slot(reinterpret_cast<float*>(smem_raw), a.S);
  const int tx = threadIdx.x, ty = threadIdx.y;

  const int64_t c = (int64_t)blockIdx.x * SPB + ty;
  const bool valid = c < a.C;
  const float4* acc = g.acc + c * g.chunks * (kPairSlots * T);
  const float inv_n = 1.f / (float)a.N;  // a power of two: exact
  // The chunks' accumulators summed in chunk order (deterministic), a chunk's pairs loaded all
  // at once: one L2 round trip per chunk. (Summed pair by pair, the loads of one pair's chunks
  // waited on each other: 49 us at 16x256x1024, where a channel has 8 chunks.) Slot 16 is thread
  // 0's alone (kPairSlots).
  float4 sum[kPairSlots];
#pragma unroll
  for (int pair = 0; pair < kPairSlots; ++pair) sum[pair] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (valid) {
#pragma unroll 1
    for (int q = 0; q < g.chunks; ++q) {
      const float4* chunk = acc + q * (kPairSlots * T) + tx;
#pragma unroll
      for (int pair = 0; pair < kPairSlots; ++pair) {
        if (pair == kPairSlots - 1 && tx != 0) continue;
        const float4 o = chunk[pair * T];
        sum[pair].x += o.x;
        sum[pair].y += o.y;
        sum[pair].z += o.z;
        sum[pair].w += o.w;
      }
    }
  }
  cf A[16] = {}, Bv[16] = {}, A2[16], B2[16];
  for_each_pair<M>(tx, A, Bv, A2, B2, slot.wp0, slot.wp1, [&](int pair, int, cf, cf, cf w, cf& vk, cf& vm) {
    const float4 s = sum[pair];
    merge_pair(cf{s.x * inv_n, s.y * inv_n}, cf{s.z * inv_n, s.w * inv_n}, w, vk, vm);
  });
  float* dk = g.dk + c * g.Lk * (TWO_SIDED ? 2 : 1);
  if constexpr (!TWO_SIDED) {
    inverse_passes<LOGM, float>(slot.re, slot.im, tx, slot.mid(), slot.ip2(), A2, B2, dk, valid ? (int)g.Lk : 0);
  } else {
    // Lag s at bin s, lag -s at bin N - s (lag 0 in both rows).
    const int64_t Lk = valid ? g.Lk : 0;
    float* dk_rev = dk + g.Lk;
    inverse_passes_circle<LOGM>(slot.re, slot.im, tx, slot.mid(), slot.ip2(), A2, B2, [&](int t, float v) {
      if (t < Lk) dk[t] = v;
      const int s = t == 0 ? 0 : a.N - t;
      if (s < Lk) dk_rev[s] = v;
    });
  }
  // dD[c] = dk[c, 0], which this very thread stored (t = 0 belongs to thread 0)
  if (g.dskip != nullptr && valid && tx == 0) g.dskip[c] = dk[0];
}

// ------------------------------------------------------------------------------------
// host side
// ------------------------------------------------------------------------------------
struct GradShape {
  int64_t chunks, chunk, items;
  size_t workspace_bytes;
  size_t smem;  // the grad kernel's dynamic shared memory
};

// The grad kernel of a route and sweep, gated or not, with du or without (the split backward).
template <int LOGM, typename IO, bool ON_CHIP, bool UNIFORM_PAIRS, bool GATED, bool WITH_DU>
constexpr auto grad_kernel() {
  static_assert(ON_CHIP || !UNIFORM_PAIRS || !WITH_DU,
                "the uniform pair sweeps are built for the on-chip route and the filter sums only");
  static_assert(!GATED || kGatedGradIO<IO>, "the gated grad kernel is built for kGatedGradIO only");
  static_assert(WITH_DU || (kSplitBackward<LOGM> && !ON_CHIP), "the filter sums alone: kSplitBackward");
  if constexpr (!WITH_DU) return fftconv_fp32_filter_sums_kernel<LOGM, IO, UNIFORM_PAIRS, GATED>;
  else if constexpr (GATED) return fftconv_fp32_gated_grad_kernel<LOGM, IO, ON_CHIP, UNIFORM_PAIRS>;
  else if constexpr (UNIFORM_PAIRS) return fftconv_fp32_grad_uniform_pairs_kernel<LOGM, IO>;
  else return fftconv_fp32_grad_kernel<LOGM, IO, ON_CHIP>;
}

// How the batch is cut into work items: enough items to fill the GPU once, each as long a
// run of the batch as that allows (fewer partial accumulators to sum).
template <int LOGM, typename IO, bool ON_CHIP, bool UNIFORM_PAIRS, bool GATED, bool WITH_DU>
cudaError_t grad_shape(const ConvBackwardParams& p, GradShape& shape) {
  using P = Plan<LOGM>;
  using Layout = GradLayout<LOGM, ON_CHIP>;
  int ctas = 0, sms = 0;
  shape.smem = Layout::smem_bytes(p.n1, p.n2);
  if (shape.smem > max_smem_per_cta(Layout::kMinCtas)) return cudaErrorInvalidConfiguration;
  const cudaError_t err = residency<grad_kernel<LOGM, IO, ON_CHIP, UNIFORM_PAIRS, GATED, WITH_DU>()>(P::THREADS, shape.smem, ctas, sms);
  if (err != cudaSuccess) return err;
  const int64_t slots = (int64_t)ctas * sms * P::SPB;
  int64_t chunks = slots / p.channels;
  chunks = chunks < 1 ? 1 : chunks > p.batch ? p.batch : chunks;
  shape.chunk = (p.batch + chunks - 1) / chunks;
  shape.chunks = (p.batch + shape.chunk - 1) / shape.chunk;  // every chunk non-empty
  shape.items = p.channels * shape.chunks;
  shape.workspace_bytes = Layout::workspace_bytes(shape.items);
  return cudaSuccess;
}

template <int LOGM, typename IO, bool ON_CHIP, bool UNIFORM_PAIRS, bool GATED, bool WITH_DU = true>
cudaError_t launch_grad(const ConvBackwardParams& p, cudaStream_t stream, size_t* workspace_bytes) {
  using P = Plan<LOGM>;
  using Layout = GradLayout<LOGM, ON_CHIP>;
  // before the workspace query, too
  if (!takes_row_shift(p.filter_row_shift, GATED)) return cudaErrorInvalidValue;
  GradShape shape;
  cudaError_t err = grad_shape<LOGM, IO, ON_CHIP, UNIFORM_PAIRS, GATED, WITH_DU>(p, shape);
  if (err != cudaSuccess) return err;
  if (workspace_bytes != nullptr) {
    *workspace_bytes = shape.workspace_bytes;
    return cudaSuccess;
  }
  GradArgs g{};
  g.k = conv_kargs<LOGM>(p);  // its y unused; its gates the gated kernel's
  g.row_shift = p.filter_row_shift;
  if constexpr (GATED) {
    g.k.pregate = p.pregate;
    g.k.postgate = p.postgate;
    g.dpre = p.grad_pregate;
    g.z = p.postgate_z;
    g.dpost = p.grad_postgate;
  }
  g.dy = p.grad;
  g.du = p.grad_u;
  g.dk = p.grad_filter;
  g.dskip = p.grad_skip;
  g.xu = static_cast<float4*>(p.workspace);
  g.acc = g.xu + shape.items * Layout::kScratchSlots * P::T;
  g.items = shape.items;
  g.chunk = shape.chunk;
  g.chunks = (int)shape.chunks;
  g.Lk = p.filter_len;
  const size_t smem = smem_bytes<LOGM>(p.n1, p.n2);
  int ctas = 0, sms = 0;
  const auto filter_grad = p.two_sided ? filter_grad_kernel<LOGM, true> : filter_grad_kernel<LOGM, false>;
  if ((err = p.two_sided ? residency<filter_grad_kernel<LOGM, true>>(P::THREADS, smem, ctas, sms)
                         : residency<filter_grad_kernel<LOGM, false>>(P::THREADS, smem, ctas, sms)) != cudaSuccess)
    return err;
  const dim3 block(P::T, P::SPB);
  grad_kernel<LOGM, IO, ON_CHIP, UNIFORM_PAIRS, GATED, WITH_DU>()
      <<<(unsigned)((shape.items + P::SPB - 1) / P::SPB), block, shape.smem, stream>>>(g);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  filter_grad<<<(unsigned)((p.channels + P::SPB - 1) / P::SPB), block, smem, stream>>>(g);
  return cudaGetLastError();
}

// The route: on chip where its shared memory fits one CTA per SM (never at 512 threads: N =
// 32768, not even instantiated), unless the caller asks for the scratch route. The uniform
// pair sweeps on the on-chip route where n1 | M/16 (N >= 1024 with the planner's splits),
// unless the caller asks for thread 0's own path.
// GATED: the gated kernels, on the same routes as the ungated ones.
template <int LOGM, typename IO, bool GATED>
cudaError_t launch_grad_route_of(const ConvBackwardParams& p, cudaStream_t stream, size_t* workspace_bytes) {
  if (p.filter_grad_only) {  // the split backward's filter sums (the binding's grad_split_from_env)
    if constexpr (kSplitBackward<LOGM>) {
      return p.uniform_pairs ? launch_grad<LOGM, IO, false, true, GATED, false>(p, stream, workspace_bytes)
                             : launch_grad<LOGM, IO, false, false, GATED, false>(p, stream, workspace_bytes);
    } else {
      return cudaErrorInvalidValue;
    }
  }
  if constexpr (Plan<LOGM>::THREADS <= 256) {
    if (p.accumulator == GradAccumulator::kAuto &&
        GradLayout<LOGM, true>::smem_bytes(p.n1, p.n2) <= max_smem_per_cta(1))
      return p.uniform_pairs && p.n1 <= Plan<LOGM>::M / 16  // its filter walks
                 ? launch_grad<LOGM, IO, true, true, GATED>(p, stream, workspace_bytes)
                 : launch_grad<LOGM, IO, true, false, GATED>(p, stream, workspace_bytes);
  }
  return launch_grad<LOGM, IO, false, false, GATED>(p, stream, workspace_bytes);
}

}  // namespace fp32_detail
}  // namespace

namespace fp32_grad {
// One io type's grad kernels (GATED: the gated ones), every route, at the sizes of one part
// (fp32_detail::size_part; cudaErrorInvalidValue at the other part's). Instantiated by the
// fp32/grad_instances_<io>[_gated]_part<PART>.cu units, which build in parallel; called by
// fp32/fftconv_fp32_backward.cu once it has checked the call.
template <typename IO, bool GATED, int PART>
cudaError_t launch_io(const ConvBackwardParams& p, cudaStream_t stream, size_t* workspace_bytes) {
  return fp32_detail::with_plan_in_part<PART>(p.fft_size, cudaErrorInvalidValue, [&](auto logm) {
    return fp32_detail::launch_grad_route_of<decltype(logm)::value, IO, GATED>(p, stream, workspace_bytes);
  });
}
}  // namespace fp32_grad
}  // namespace monarch_fftconv
