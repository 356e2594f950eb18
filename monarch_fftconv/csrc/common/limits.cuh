// monarch_fftconv: the sm_90 limits the kernels are sized against, in one place. Each kernel
// family states its own budget from these (a static_assert on its traits, or a host check).
#pragma once

#include <cstddef>

namespace monarch_fftconv {

// Shared memory per SM on sm_90 (H100, H200): 228 KB, of which the system reserves 1 KB per
// resident CTA. A CTA may use the rest once its kernel opts in
// (cudaFuncAttributeMaxDynamicSharedMemorySize, which residency() sets).
constexpr size_t kSmemPerSm = 228 * 1024;
constexpr size_t kSmemReservedPerCta = 1024;

// The most shared memory one CTA may use with `ctas` CTAs resident per SM: 227 KB for one,
// 113 KB each for two.
constexpr size_t max_smem_per_cta(int ctas) { return kSmemPerSm / ctas - kSmemReservedPerCta; }

static_assert(max_smem_per_cta(1) == 227 * 1024 && max_smem_per_cta(2) == 113 * 1024, "sm_90 limits");

}  // namespace monarch_fftconv
