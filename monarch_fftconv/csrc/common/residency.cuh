// monarch_fftconv: how many CTAs of a kernel fit on an SM, asked once per kernel and device.
#pragma once

#include <cuda_runtime.h>

namespace monarch_fftconv {

// Host-side caches of per-device launch facts are sized for this many devices (others ask again).
constexpr int kMaxDevices = 64;

// Resident CTAs per SM and the SM count, for a kernel at a fixed dynamic smem size. The
// occupancy queries cost host time on every call; they are asked once per kernel and device.
template <auto Kernel>
inline cudaError_t residency(int threads, size_t smem, int& ctas_per_sm, int& sms) {
  static int cached_ctas[kMaxDevices], cached_sms[kMaxDevices];  // 0: not asked yet
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < kMaxDevices && cached_ctas[dev] > 0) {
    ctas_per_sm = cached_ctas[dev];
    sms = cached_sms[dev];
    return cudaSuccess;
  }
  if ((err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
    return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return err;
  if ((err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, Kernel, threads, smem)) != cudaSuccess)
    return err;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  if (dev < kMaxDevices) {
    cached_sms[dev] = sms;
    cached_ctas[dev] = ctas_per_sm;
  }
  return cudaSuccess;
}

}  // namespace monarch_fftconv
