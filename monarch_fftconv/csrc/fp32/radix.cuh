// monarch_fftconv: the fp32 radix library, the building blocks of the fp32-accurate radix kernels,
// shared by the forward (fp32/forward_kernels.cuh), the backward (fp32/grad_kernels.cuh), the
// filter spectrum (fp32/filter_spectrum.cu) and the four-step kernels (fourstep/). The
// algorithm is described at the top of fp32/forward_kernels.cuh. Its parts, each building on the
// ones before it:
//   radix_dft.cuh      complex helpers, fences, compile-time twiddles, in-register radix-R DFTs
//   radix_memory.cuh   shared-memory indexing, io conversions, cp.async and prefetches
//   radix_plan.cuh     the plan of passes per FFT size, twiddle tables, KArgs, host-side sizes
//   radix_passes.cuh   the Stockham passes and the whole forward, mid and inverse passes
//   radix_pairs.cuh    the mid pass's frequency pairs: filter reads, real-FFT split, stage copy
// Everything is in an anonymous namespace (fp32_detail): each kernel unit has its own copy.
#pragma once

#include "fftconv.h"
#include "common/residency.cuh"

#include "fp32/radix_dft.cuh"
#include "fp32/radix_memory.cuh"
#include "fp32/radix_plan.cuh"
#include "fp32/radix_passes.cuh"
#include "fp32/radix_pairs.cuh"
