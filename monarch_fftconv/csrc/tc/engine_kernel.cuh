// monarch_fftconv: the Hopper tensor-core engine's forward (docs/design.md, "The next tensor-core
// engine"; its float64 data flow: tests/test_tc_engine_dataflow.py), split 128 x 128
// (N = 16384), bf16/fp16 operands, fp32 accumulation, fp32 or 2-byte (bf16/fp16) I/O.
//
// A persistent CTA of three warpgroups. The producer loads packed pairs z = u_a + i·u_b into a
// two-stage ring and the channel's filter image (filter_image_kernel, launched first) into a
// resident buffer; two consumer warpgroups run per job: stage 1 (SS), twiddle, stage 2 (RS,
// A = stage 1's accumulator), filter, inverse 2 (RS), the one shared-memory hand-off, inverse 1
// (SS), y_a = Re, y_b = Im.
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
#include "tc/engine_tables.cuh"
#include "tc/engine_primitives.cuh"
#include "tc/engine_producer.cuh"
#include "tc/engine_consumer.cuh"
#include "common/complex.cuh"
#include "common/ptx.cuh"
#include "common/residency.cuh"

namespace monarch_fftconv {
namespace engine {

using namespace cute;

// The DFT tables, once per CTA (tc/engine_tables.cuh): by default from the 128 distinct angles,
// their (cos, sin) in fp32 scratch in the hand-off's first plane, which nothing else touches
// before the kernel's __syncthreads (the consumers first write it after their first stage 2);
// with p.engine_tables_per_element, one sincospi per element as first written. The same bits.
template <class Cfg>
__device__ __forceinline__ void build_tables(typename Cfg::Smem& sm, bool per_element) {
  Tensor sF1c = make_tensor(make_smem_ptr(sm.f1c), typename Cfg::LayoutF1{});
  Tensor sF1s = make_tensor(make_smem_ptr(sm.f1s), typename Cfg::LayoutF1{});
  Tensor sF2c = make_tensor(make_smem_ptr(sm.f2c), typename Cfg::LayoutF2{});
  Tensor sF2s = make_tensor(make_smem_ptr(sm.f2s), typename Cfg::LayoutF2{});
  const auto sincos_pi = [](double x, double* s, double* c) { sincospi(x, s, c); };
  if (per_element) {
    tables_per_element<Cfg>(sF1c, sF1s, sF2c, sF2s, threadIdx.x, Cfg::kThreads, sincos_pi);
    return;
  }
  static_assert(Cfg::kN1 * sizeof(float2) <= sizeof(sm.handoff[0]), "the angles fit the hand-off's first plane");
  float2* angles = reinterpret_cast<float2*>(sm.handoff[0]);
  table_angles<Cfg>(angles, threadIdx.x, Cfg::kThreads, sincos_pi);
  __syncthreads();  // every thread of the CTA is here (before the warpgroups part)
  tables_from_angles<Cfg>(sF1c, sF1s, sF2c, sF2s, angles, threadIdx.x, Cfg::kThreads);
}

// Programmatic dependent launch (p.engine_pdl): the kernel may start before the one before it in
// the stream has finished. Everything before this wait touches only shared memory, or asks L2
// for lines (prefetch: a hint, L2 being where every SM's writes meet, it cannot return stale
// data later); after it, the grid before is complete and its writes visible. Every thread waits,
// so no global load or store of the kernel (the producer's u and spectrum, the consumers' y)
// precedes it. Without the launch attribute it returns at once.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

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

  build_tables<Cfg>(sm, p.engine_tables_per_element);
  grid_dependency_wait();
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&sm.full[s], Cfg::kWarpgroup);      // every producer thread, after its stores
      mbar_init(&sm.empty[s], 4 * Cfg::kConsumers);  // every consumer warp, after stage 1
      mbar_init(&sm.done[s], 4 * Cfg::kConsumers);   // every consumer warp, after its y stores
    }
    mbar_init(&sm.filter_full, 1);  // the producer's thread 0, with the image's bulk copy
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
    consumer<Cfg>(p, sm, warpgroup - 1, Twiddles<Cfg>{FilterImages<Cfg>::twiddles(p.workspace, p.channels)});
  }
}

template <Precision P, IOType IO>
size_t workspace_bytes(const ConvForwardParams& p) {
  using Cfg = EngineTraits<P, IO>;
  return FilterImages<Cfg>::bytes(p.channels);
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
  // The channels' resident images, for the producer's bulk copies.
  if (p.workspace == nullptr || reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0) return cudaErrorInvalidValue;
  filter_image_kernel<Cfg><<<dim3(unsigned(p.channels)), dim3(Cfg::kWarpgroup), 0, stream>>>(p);
  if (const cudaError_t image_err = cudaGetLastError(); image_err != cudaSuccess) return image_err;
  if (!p.engine_pdl) {
    kernel<<<dim3(unsigned(grid)), dim3(Cfg::kThreads), Cfg::kSmemBytes, stream>>>(p);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(grid));
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = Cfg::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, p);
}

}  // namespace engine
}  // namespace monarch_fftconv
