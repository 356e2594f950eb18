// Host checks of two of the tensor-core engine's fixed-cost changes, no GPU:
//   - the DFT tables (tc/engine_tables.cuh, the kernel's own functions run here): built from the
//     128 distinct angles, they are the bits of the per-element build, for bf16 and fp16. A host
//     sincospi stands in for the device's: what is checked is that every element takes the same
//     double argument and the same roundings, which is what makes the bits equal on the GPU too
//     (the GPU tests compare the kernel's outputs of both builds bit for bit);
//   - the resident filter's protocol (FilterPlan, tc/engine_traits.cuh), on the producer's item
//     streams (jobs of a CTA's range, reruns after a flagged job as settle emits them), with and
//     without the early release: against a model of the two mbarriers, every load finds the
//     buffer released as often as it was loaded before (load n waits for n releases, given by
//     the items up to its own: no deadlock), no item reads a filter released or not its
//     channel's, and no release frees a filter that is not held.
// Each checker also runs on a deliberately wrong rule and must reject it.
//
// Built by tests/test_engine_layout.py: nvcc -x cu (host code only runs), then run.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "tc/engine_traits.cuh"
#include "tc/engine_tables.cuh"
#include "host_check.cuh"

using namespace monarch_fftconv;
using namespace monarch_fftconv::engine;

// ---------------------------------------------------------------------------
// The tables
// ---------------------------------------------------------------------------
void host_sincospi(double x, double* s, double* c) {
  *s = std::sin(M_PI * x);
  *c = std::cos(M_PI * x);
}

template <Precision P>
struct Tables {
  using Cfg = EngineTraits<P, IOType::kFloat32>;
  using T = typename Cfg::T;
  // The swizzled layouts XOR address bits: each table 1024-byte aligned, as in shared memory.
  static constexpr size_t kF1Bytes = Cfg::kF1Elems * sizeof(T), kF2Bytes = Cfg::kF2Elems * sizeof(T);
  static constexpr size_t kBytes = 2 * kF1Bytes + 2 * kF2Bytes;
  static_assert(kF1Bytes % 1024 == 0 && kF2Bytes % 1024 == 0);
  uint8_t* base;
  T *f1c, *f1s, *f2c, *f2s;
  Tables() : base(static_cast<uint8_t*>(std::aligned_alloc(1024, kBytes))) {
    std::memset(base, 0xA5, kBytes);  // unwritten elements: caught by the comparison and the formula
    f1c = reinterpret_cast<T*>(base);
    f1s = reinterpret_cast<T*>(base + kF1Bytes);
    f2c = reinterpret_cast<T*>(base + 2 * kF1Bytes);
    f2s = reinterpret_cast<T*>(base + 2 * kF1Bytes + kF2Bytes);
  }
  ~Tables() { std::free(base); }
  Tables(const Tables&) = delete;
  bool same_bits(const Tables& o) const { return std::memcmp(base, o.base, kBytes) == 0; }
};

// The kernel's two builds, its 384 threads run one after another (the per-angle build's barrier
// between its halves: every thread's first half before any second half).
template <Precision P, class Sincos>
bool check_tables(Sincos&& angle_sincos, int threads) {
  using Cfg = typename Tables<P>::Cfg;
  Tables<P> per_element, per_angle;
  auto tensors = [](Tables<P>& t) {
    return std::make_tuple(cute::make_tensor(cute::make_smem_ptr(t.f1c), typename Cfg::LayoutF1{}),
                           cute::make_tensor(cute::make_smem_ptr(t.f1s), typename Cfg::LayoutF1{}),
                           cute::make_tensor(cute::make_smem_ptr(t.f2c), typename Cfg::LayoutF2{}),
                           cute::make_tensor(cute::make_smem_ptr(t.f2s), typename Cfg::LayoutF2{}));
  };
  {
    auto [c1, s1, c2, s2] = tensors(per_element);
    for (int tid = 0; tid < Cfg::kThreads; ++tid) tables_per_element<Cfg>(c1, s1, c2, s2, tid, Cfg::kThreads, host_sincospi);
  }
  {
    auto [c1, s1, c2, s2] = tensors(per_angle);
    std::vector<float2> angles(Cfg::kN1, make_float2(NAN, NAN));
    for (int tid = 0; tid < threads; ++tid) table_angles<Cfg>(angles.data(), tid, threads, angle_sincos);
    for (int tid = 0; tid < threads; ++tid) tables_from_angles<Cfg>(c1, s1, c2, s2, angles.data(), tid, threads);
  }
  EXPECT(per_element.same_bits(per_angle), "the per-angle tables differ from the per-element ones");
  // And both are the tables: spot values against the formula.
  auto [c1, s1, c2, s2] = tensors(per_element);
  for (int k1 = 0; k1 < Cfg::kN1; ++k1)
    for (int r = 0; r < Cfg::kInputRows; ++r) {
      const double a = 2.0 * M_PI * double(k1 * r) / Cfg::kN1;
      EXPECT(std::fabs(float(c1(k1, r)) - std::cos(a)) < 1e-2 && std::fabs(float(s1(k1, r)) - std::sin(a)) < 1e-2,
             "F1 (%d, %d)", k1, r);
    }
  for (int j = 0; j < Cfg::kHalfCols; ++j)
    for (int s = 0; s < Cfg::kN2; ++s) {
      const double a = 2.0 * M_PI * double(j * s) / Cfg::kN2;
      const double want_s = j == 0 ? ((s & 1) ? -1.0 : 1.0) : std::sin(a);
      EXPECT(std::fabs(float(c2(j, s)) - std::cos(a)) < 1e-2 && std::fabs(float(s2(j, s)) - want_s) < 1e-2,
             "F2 (%d, %d)", j, s);
    }
  return true;
}

// ---------------------------------------------------------------------------
// The filter protocol
// ---------------------------------------------------------------------------
// The producer's item stream for jobs [begin, end) of `batch`: each job, then the reruns of the
// job before it if that one is flagged (settle runs after the next emit), as engine_producer.cuh.
// Flags from `flags_of(plan, channel, release_after)`.
using FlagRule = std::function<uint32_t(FilterPlan&, int, bool)>;
std::vector<Item> item_stream(int begin, int end, int batch, bool early, const std::vector<bool>& flagged,
                              const FlagRule& rule) {
  std::vector<Item> items;
  FilterPlan plan;
  auto emit = [&](Item item, bool release_after) {
    item.flags |= rule(plan, item.channel, release_after);
    items.push_back(item);
  };
  for (int job = begin; job < end; ++job) {
    const Item item = job_item(job, batch);
    const bool last_of_channel = job + 1 < end && job_item(job + 1, batch).channel != item.channel;
    emit(item, early && last_of_channel);
    if (job > begin && flagged[job - 1]) {
      const Item prev = job_item(job - 1, batch);
      if (prev.seq_im >= 0) {
        emit(Item{prev.channel, prev.seq_re, -1, 0}, false);
        emit(Item{prev.channel, prev.seq_im, -1, 0}, false);
      }
    }
  }
  if (end > begin && flagged[end - 1]) {
    const Item prev = job_item(end - 1, batch);
    if (prev.seq_im >= 0) {
      emit(Item{prev.channel, prev.seq_re, -1, 0}, false);
      emit(Item{prev.channel, prev.seq_im, -1, 0}, false);
    }
  }
  return items;
}

// The two mbarriers' model, items in order (the consumers take them in order; the producer
// loads an item's filter after publishing it, so a load may rely on releases of items up to and
// including its own kItemReleaseFirst, made at that item's start, and on nothing later).
bool check_stream(const std::vector<Item>& items, int* releases_after = nullptr) {
  int held = -1;  // the channel loaded and not released (what the consumers may read)
  int loads = 0, releases = 0, early = 0;
  for (size_t n = 0; n < items.size(); ++n) {
    const Item& it = items[n];
    if (it.flags & kItemReleaseFirst) {
      EXPECT(held >= 0, "item %zu releases a filter that is not held", n);
      ++releases;
      held = -1;
    }
    if (it.flags & kItemLoad) {
      // load `loads` waits for phase loads - 1 of filter_free: `loads` releases so far, no more
      // possible (a release follows its load), and none that only a later item would make.
      EXPECT(releases == loads, "item %zu: load %d would wait for %d releases, %d made by then", n, loads, loads,
             releases);
      EXPECT(held < 0, "item %zu: load over a held filter", n);
      held = it.channel;
      ++loads;
    }
    EXPECT(held == it.channel, "item %zu (channel %d) reads the filter of %d", n, it.channel, held);
    if (it.flags & kItemReleaseAfter) {
      ++releases;
      ++early;
      held = -1;
    }
  }
  if (releases_after != nullptr) *releases_after = early;
  return true;
}

// Many CTA ranges and batches, a job flagged with probability 1/4: the protocol holds for each.
bool check_protocol(const FlagRule& rule, bool early, bool expect_early_releases) {
  std::mt19937 rng(1234);
  int early_releases = 0;
  for (int batch : {1, 2, 3, 5, 16, 17}) {
    const int jobs_per = int(jobs_per_channel(batch));
    for (int channels : {1, 2, 7, 33}) {
      const int jobs = jobs_per * channels;
      for (int ctas : {1, 3, 8, 132}) {
        for (int cta = 0; cta < ctas; ++cta) {
          const int begin = int(job_begin(jobs, cta, ctas)), end = int(job_begin(jobs, cta + 1, ctas));
          for (int trial = 0; trial < 3; ++trial) {
            std::vector<bool> flagged(jobs, false);
            if (trial > 0)
              for (int j = 0; j < jobs; ++j) flagged[j] = (rng() % 4) == 0 || (trial == 2 && j % 2 == 1);
            int released = 0;
            if (!check_stream(item_stream(begin, end, batch, early, flagged, rule), &released)) return false;
            early_releases += released;
          }
        }
      }
    }
  }
  EXPECT((early_releases > 0) == expect_early_releases, "%d early releases", early_releases);
  return true;
}

int main() {
  host_check::Tally tally;
  using Bf = EngineTraits<Precision::kBF16, IOType::kFloat32>;
  tally.must_pass("tables bf16: per angle = per element, bit for bit",
                  check_tables<Precision::kBF16>(host_sincospi, Bf::kThreads));
  tally.must_pass("tables fp16: per angle = per element, bit for bit",
                  check_tables<Precision::kFP16>(host_sincospi, Bf::kThreads));
  tally.must_pass("tables bf16: any thread count (7)", check_tables<Precision::kBF16>(host_sincospi, 7));

  const FlagRule plan_rule = [](FilterPlan& plan, int channel, bool release_after) {
    return plan.flags(channel, release_after);
  };
  tally.must_pass("filter protocol: release at the next channel (default)", check_protocol(plan_rule, false, false));
  tally.must_pass("filter protocol: early release, reruns", check_protocol(plan_rule, true, true));

  // The same checks on deliberately wrong rules.
  tally.must_reject("wrong: a table angle's argument off by one ulp", [] {
    return check_tables<Precision::kFP16>(
        [](double x, double* s, double* c) { host_sincospi(std::nextafter(x, 2.0), s, c); }, Bf::kThreads);
  });
  tally.must_reject("wrong: early release without forgetting the filter", [&] {
    const FlagRule rule = [](FilterPlan& plan, int channel, bool release_after) {
      const uint32_t f = plan.flags(channel, false);
      return release_after ? f | kItemReleaseAfter : f;
    };
    return check_protocol(rule, true, true);
  });
  tally.must_reject("wrong: a new channel without releasing the old", [&] {
    const FlagRule rule = [](FilterPlan& plan, int channel, bool release_after) {
      return plan.flags(channel, release_after) & ~kItemReleaseFirst;
    };
    return check_protocol(rule, false, false);
  });
  tally.must_reject("wrong: a reload only on a change of channel", [&] {
    int last = -1;  // reruns after an early release read a released buffer
    const FlagRule rule = [last](FilterPlan& plan, int channel, bool release_after) mutable {
      const uint32_t f = plan.flags(channel, release_after);
      const bool changed = channel != last;
      last = channel;
      return changed ? f : f & ~(kItemLoad | kItemReleaseFirst);
    };
    return check_protocol(rule, true, true);
  });
  return tally.finish("engine tables and filter protocol");
}
