// Host check of the fp32 forward kernel's p1 input map (fp32/forward_stages.cuh, p1_pair_start),
// no GPU: for every plan size, the pairs u[t0], u[t0 + 1] of every thread's p1 (butterfly
// j = tx + q·T, q < 32/R1, its lower half r < R1/2) tile the sequence's nonzero half [0, M) with
// each pair once. So the own-pairs staging (prefetch_own_pairs, ForwardIoChoices::kOwnPairs),
// which copies each thread's pairs by this map, stages every value p1 can read (L <= M), and no
// pair is copied or read by two threads: p1 may wait on its own copies without a CTA barrier.
// Deliberately wrong maps (the zero half included; q left out) must be rejected.
//
// Built by tests/test_pair_sweep.py: nvcc -x cu (host code only runs), then run.
#include <cstdio>
#include <vector>

#include "fp32/forward_stages.cuh"
#include "host_check.cuh"

using namespace monarch_fftconv::fp32_detail;

// Whether start(tx, q, r) over every thread tx < T, q < 32/R1 and r < r_end tiles [0, M) in pairs.
template <int LOGM, typename Start>
bool tiles_the_nonzero_half(Start start, int r_end) {
  using P = Plan<LOGM>;
  std::vector<int> times(P::M / 2, 0);
  for (int tx = 0; tx < P::T; ++tx) {
    for (int q = 0; q < 32 / P::R1; ++q) {
      for (int r = 0; r < r_end; ++r) {
        const int t0 = start(tx, q, r);
        EXPECT(t0 >= 0 && t0 % 2 == 0 && t0 < P::M, "LOGM=%d tx=%d q=%d r=%d: t0=%d is no pair of [0, %d)", LOGM, tx,
               q, r, t0, P::M);
        ++times[t0 / 2];
      }
    }
  }
  for (int pair = 0; pair < P::M / 2; ++pair) {
    EXPECT(times[pair] == 1, "LOGM=%d: the pair at %d is read %d times", LOGM, 2 * pair, times[pair]);
  }
  return true;
}

template <int LOGM>
void check(host_check::Tally& tally) {
  using P = Plan<LOGM>;
  char name[64];
  std::snprintf(name, sizeof name, "p1 pairs tile [0, M), LOGM=%d", LOGM);
  tally.must_pass(name, tiles_the_nonzero_half<LOGM>(
                            [](int tx, int q, int r) { return p1_pair_start<LOGM>(tx + q * P::T, r); }, P::R1 / 2));
  std::snprintf(name, sizeof name, "wrong: the zero half too, LOGM=%d", LOGM);
  tally.must_reject(name, [] {
    return tiles_the_nonzero_half<LOGM>([](int tx, int q, int r) { return p1_pair_start<LOGM>(tx + q * P::T, r); },
                                        P::R1);
  });
  if constexpr (32 / P::R1 > 1) {  // with one butterfly a thread, q is always 0
    std::snprintf(name, sizeof name, "wrong: q left out, LOGM=%d", LOGM);
    tally.must_reject(name, [] {
      return tiles_the_nonzero_half<LOGM>([](int tx, int, int r) { return p1_pair_start<LOGM>(tx, r); }, P::R1 / 2);
    });
  }
}

int main() {
  host_check::Tally tally;
  check<7>(tally);
  check<8>(tally);
  check<9>(tally);
  check<10>(tally);
  check<11>(tally);
  check<12>(tally);
  check<13>(tally);
  check<14>(tally);
  return tally.finish("p1_pairs_check");
}
