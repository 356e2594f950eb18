// monarch_fftconv: the Hopper tensor-core engine's forward (docs/design.md, "The next tensor-core
// engine"; its float64 data flow: tests/test_tc_engine_dataflow.py), split 128 x 128
// (N = 16384), bf16/fp16 operands, fp32 accumulation, fp32 I/O.
//
// A persistent CTA of three warpgroups. The producer loads packed pairs z = u_a + i·u_b into a
// two-stage ring and the channel's filter spectrum into a resident buffer; two consumer
// warpgroups run per job: stage 1 (SS), twiddle, stage 2 (RS, A = stage 1's accumulator),
// filter, inverse 2 (RS), the one shared-memory hand-off, inverse 1 (SS), y_a = Re, y_b = Im.
// Traits: tc/engine_traits.cuh. Parts: tc/engine_primitives.cuh (barriers, wgmma issue, helpers),
// tc/engine_producer.cuh, tc/engine_consumer.cuh; here the tables, the kernel and its launcher.
//
// CUDA + CuTe headers only: never include torch here.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "fftconv.h"
#include "tc/engine_traits.cuh"
#include "tc/engine_primitives.cuh"
#include "tc/engine_producer.cuh"
#include "tc/engine_consumer.cuh"
#include "common/complex.cuh"
#include "common/ptx.cuh"
#include "common/residency.cuh"

namespace monarch_fftconv {
namespace engine {

using namespace cute;

// The DFT tables, once per CTA, from sincospi in double with the angle reduced in integers.
template <class Cfg>
__device__ __forceinline__ void build_tables(typename Cfg::Smem& sm) {
  using T = typename Cfg::T;
  Tensor sF1c = make_tensor(make_smem_ptr(sm.f1c), typename Cfg::LayoutF1{});
  Tensor sF1s = make_tensor(make_smem_ptr(sm.f1s), typename Cfg::LayoutF1{});
  Tensor sF2c = make_tensor(make_smem_ptr(sm.f2c), typename Cfg::LayoutF2{});
  Tensor sF2s = make_tensor(make_smem_ptr(sm.f2s), typename Cfg::LayoutF2{});
  for (int i = threadIdx.x; i < Cfg::kF1Elems; i += Cfg::kThreads) {
    const int k1 = i / Cfg::kInputRows, r = i % Cfg::kInputRows;
    double sn, cs;
    sincospi(double((k1 * r) % Cfg::kN1) / double(Cfg::kN1 / 2), &sn, &cs);
    sF1c(k1, r) = T(float(cs));
    sF1s(k1, r) = T(float(sn));
  }
  for (int i = threadIdx.x; i < Cfg::kF2Elems; i += Cfg::kThreads) {
    const int j = i / Cfg::kN2, s = i % Cfg::kN2;
    double sn, cs;
    sincospi(double((j * s) % Cfg::kN2) / double(Cfg::kN2 / 2), &sn, &cs);
    sF2c(j, s) = T(float(cs));
    sF2s(j, s) = T(j == 0 ? ((s & 1) ? -1.0f : 1.0f) : float(sn));  // column n2/2 in the zero sines' slot
  }
}

template <Precision P, IOType IO>
__global__ void __launch_bounds__(EngineTraits<P, IO>::kThreads, 1) engine_forward_kernel(const ConvForwardParams p) {
  using Cfg = EngineTraits<P, IO>;
  using Smem = typename Cfg::Smem;
  extern __shared__ uint8_t smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  // The CTA's contiguous range of the T = C·J jobs, channel-major.
  const int64_t jobs = p.channels * jobs_per_channel(p.batch);
  const int begin = int(job_begin(jobs, blockIdx.x, gridDim.x)), end = int(job_begin(jobs, blockIdx.x + 1, gridDim.x));
  const int warpgroup = threadIdx.x / Cfg::kWarpgroup;
  // The first item's inputs come into L2 while the tables are built.
  if (warpgroup == 0 && begin < end) prefetch_item<Cfg>(p, job_item(begin, int(p.batch)), -1, threadIdx.x);

  build_tables<Cfg>(sm);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&sm.full[s], Cfg::kWarpgroup);      // every producer thread, after its stores
      mbar_init(&sm.empty[s], 4 * Cfg::kConsumers);  // every consumer warp, after stage 1
      mbar_init(&sm.done[s], 4 * Cfg::kConsumers);   // every consumer warp, after its y stores
    }
    mbar_init(&sm.filter_full, Cfg::kWarpgroup);
    mbar_init(&sm.filter_free, 4 * Cfg::kConsumers);
    for (int s = 0; s < Cfg::kStages; ++s) sm.nonfinite[s] = 0;  // cleared again as each is read
  }
  fence_proxy_async();  // the tables, for the wgmma
  __syncthreads();

  if (warpgroup == 0) {
    regs_down<Cfg::kProducerRegs>();
    producer<Cfg>(p, sm, begin, end);
  } else {
    regs_up<Cfg::kConsumerRegs>();
    consumer<Cfg>(p, sm, warpgroup - 1);
  }
}

template <Precision P, IOType IO>
cudaError_t launch(const ConvForwardParams& p, cudaStream_t stream) {
  using Cfg = EngineTraits<P, IO>;
  constexpr auto kernel = &engine_forward_kernel<P, IO>;
  int ctas_per_sm = 0, sms = 0;
  cudaError_t err = residency<kernel>(Cfg::kThreads, Cfg::kSmemBytes, ctas_per_sm, sms);
  if (err != cudaSuccess) return err;
  const int64_t jobs = p.channels * jobs_per_channel(p.batch);
  const int64_t grid = jobs < int64_t(sms) ? jobs : int64_t(sms);
  if (grid == 0) return cudaSuccess;
  kernel<<<dim3(unsigned(grid)), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace engine
}  // namespace monarch_fftconv
