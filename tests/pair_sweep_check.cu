// Host check of the grad kernel's uniform pair sweep (fp32/radix_pairs.cuh, for_each_pair_uniform)
// against for_each_pair, no GPU: for every thread tx of every plan size, the pairs each sweep
// hands its op, as (slot, frequency k, registers of Z[k] and Z[M-k], twiddle), must be the same
// set, and the output registers V[k], V[M-k] must end where for_each_pair puts them (so the
// inverse butterflies and filter_grad_kernel's slots see the same values). for_each_pair's
// assignment is written out here from its code; the uniform sweep's is read from the index
// functions the kernel itself uses (UniformPairStep, uniform_pair_freq, lane0_output_source).
// The filter sweep's walks (UniformFilterWalks, the kernel's KWalk) must read the entries of the
// staged spectrum that kspec reads, for every split the uniform sweep is launched with, and its
// stepped filter copy must fill the slots stage_index gives.
// The forward kernel's variant (for_each_pair_uniform_moved) reads every step's operands from
// A[u], Bv[15-u] after moving thread 0's there (lane0_input_source): the same pairs again. Its
// twiddles (uniform_pair_twiddles_rotated) take the others' tw_const(wp0, u), u >= 8, as
// -i·tw_const(wp0, u - 8): bit for bit the same, for every thread's wp0 = ω_N^tx of every size,
// checked with tw_const and cmul written out here in host fmaf (correctly rounded, as the GPU's).
// Each check also runs on a deliberately wrong map and must reject it.
//
// Built by tests/test_pair_sweep.py: nvcc -x cu (host code only runs), then run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <functional>
#include <tuple>
#include <vector>

#include "fp32/radix_pairs.cuh"
#include "host_check.cuh"

using namespace monarch_fftconv::fp32_detail;


// A twiddle: tw_const(base == 0 ? wp0 : wp1, step, 32), or a constant: 1 (kOne) or -i (kMinusI).
constexpr int kOne = -1, kMinusI = -2;
// Registers: [0, 16) A / A2, [16, 32) Bv / B2; kDropped: an output the sweep discards.
constexpr int kDropped = -1;

struct Pair {
  int slot, k, zk, zm, tw_base, tw_step;
  bool operator<(const Pair& o) const {
    return std::tie(slot, k, zk, zm, tw_base, tw_step) < std::tie(o.slot, o.k, o.zk, o.zm, o.tw_base, o.tw_step);
  }
  bool operator==(const Pair& o) const { return !(*this < o) && !(o < *this); }
};
// What a sweep leaves in the 32 output registers: (slot, +1) for the pair's V[k], (slot, -1)
// for its V[M-k], (-1, 0) for nothing.
using Registers = std::vector<std::pair<int, int>>;
struct Sweep {
  std::vector<Pair> pairs;
  Registers outputs = Registers(32, {-1, 0});
  void op(const Pair& p, int out_k, int out_m) {  // op writes V[k] to out_k, V[M-k] to out_m
    pairs.push_back(p);
    outputs[out_k] = {p.slot, +1};
    if (out_m != kDropped) outputs[out_m] = {p.slot, -1};
  }
};

// for_each_pair, as written in fp32/radix_pairs.cuh.
Sweep original_sweep(int M, int tx) {
  const int NS = M / 16;
  Sweep sw;
  if (tx != 0) {
    for (int i = 0; i < 16; ++i) sw.op({i, tx + i * NS, i, 16 + 15 - i, 0, i}, i, 16 + 15 - i);
    return sw;
  }
  sw.op({0, 0, 0, 0, kOne, 0}, 0, kDropped);
  sw.op({8, M / 2, 8, 8, kMinusI, 0}, 8, kDropped);
  for (int i = 1; i < 8; ++i) sw.op({i, i * NS, i, 16 - i, 0, i}, i, 16 - i);
  for (int i = 0; i < 8; ++i) sw.op({9 + i, M / 32 + i * NS, 16 + i, 16 + 15 - i, 1, i}, 16 + i, 16 + 15 - i);
  return sw;
}

// The uniform sweep's index functions; the kernel's, or deliberately wrong ones.
struct UniformMaps {
  std::function<UniformPairStep(int u, bool lane0)> step = [](int u, bool lane0) { return UniformPairStep(u, lane0); };
  std::function<int(int M, int u, int tx)> freq = [](int M, int u, int tx) {
    switch (M) {  // uniform_pair_freq at the sizes Plan covers
      case 1 << 7: return uniform_pair_freq<1 << 7>(u, tx);
      case 1 << 8: return uniform_pair_freq<1 << 8>(u, tx);
      case 1 << 9: return uniform_pair_freq<1 << 9>(u, tx);
      case 1 << 10: return uniform_pair_freq<1 << 10>(u, tx);
      case 1 << 11: return uniform_pair_freq<1 << 11>(u, tx);
      case 1 << 12: return uniform_pair_freq<1 << 12>(u, tx);
      case 1 << 13: return uniform_pair_freq<1 << 13>(u, tx);
      default: return uniform_pair_freq<1 << 14>(u, tx);
    }
  };
  std::function<int(int d)> source = [](int d) { return lane0_output_source(d); };
  // for_each_pair_uniform_moved: thread 0's operand registers moved first (-1: kept)
  bool moved_inputs = false;
  std::function<int(int d)> input_source = [](int d) { return lane0_input_source(d); };
};

// for_each_pair_uniform, from the index functions: step u writes A2[u], B2[15-u] in every
// thread; then thread 0's registers move (all read before any is written) and its pair
// k = M/2 runs.
Sweep uniform_sweep(const UniformMaps& maps, int M, int tx) {
  Sweep sw;
  for (int u = 0; u < 16; ++u) {
    const UniformPairStep s = maps.step(u, tx == 0);
    const int base = s.tw_base < 0 ? kOne : s.tw_base;
    int zk = s.zk, zm = s.zm;
    if (maps.moved_inputs) {  // every thread reads registers u and 31 - u, thread 0's moved there
      const auto held = [&](int d) { return tx == 0 && maps.input_source(d) >= 0 ? maps.input_source(d) : d; };
      zk = held(u);
      zm = held(31 - u);
    }
    sw.op({s.slot, maps.freq(M, u, tx), zk, zm, base, base == kOne ? 0 : s.tw_step}, u, 16 + 15 - u);
  }
  if (tx == 0) {
    const Registers natural = sw.outputs;
    for (int d = 0; d < 32; ++d) {
      const int src = maps.source(d);
      if (src >= 0) sw.outputs[d] = natural[src];
    }
    sw.op({kHalfPairSlot, M / 2, 8, 8, kMinusI, 0}, 8, kDropped);
  }
  return sw;
}

bool check_sweeps(const UniformMaps& maps) {
  for (int logm = 7; logm <= 14; ++logm) {
    const int M = 1 << logm, T = M / 32;
    std::vector<int> seen(M / 2 + 1, 0);  // each pair (k, M-k), k <= M/2, once over all threads
    for (int tx = 0; tx < T; ++tx) {
      Sweep a = original_sweep(M, tx), b = uniform_sweep(maps, M, tx);
      EXPECT(a.pairs.size() == (tx == 0 ? (size_t)kPairSlots : 16u), "M %d tx %d: %zu pairs", M, tx, a.pairs.size());
      EXPECT(b.pairs.size() == a.pairs.size(), "M %d tx %d: the uniform sweep runs %zu pairs, not %zu", M, tx,
             b.pairs.size(), a.pairs.size());
      std::sort(a.pairs.begin(), a.pairs.end());
      std::sort(b.pairs.begin(), b.pairs.end());
      for (size_t i = 0; i < a.pairs.size(); ++i) {
        const Pair &p = a.pairs[i], &q = b.pairs[i];
        EXPECT(p == q,
               "M %d tx %d: (slot, k, zk, zm, twiddle) (%d, %d, %d, %d, %d/%d) in for_each_pair, "
               "(%d, %d, %d, %d, %d/%d) in the uniform sweep",
               M, tx, p.slot, p.k, p.zk, p.zm, p.tw_base, p.tw_step, q.slot, q.k, q.zk, q.zm, q.tw_base, q.tw_step);
        EXPECT(i == 0 || a.pairs[i - 1].slot != p.slot, "M %d tx %d: slot %d twice", M, tx, p.slot);
        EXPECT(0 <= p.k && p.k < M, "M %d tx %d: k %d", M, tx, p.k);
        ++seen[std::min(p.k, M - p.k)];
      }
      for (int r = 0; r < 32; ++r)
        EXPECT(a.outputs[r] == b.outputs[r],
               "M %d tx %d: register %d holds slot %d's %s in for_each_pair, slot %d's %s in the uniform sweep", M, tx,
               r, a.outputs[r].first, a.outputs[r].second > 0 ? "V[k]" : "V[M-k]", b.outputs[r].first,
               b.outputs[r].second > 0 ? "V[k]" : "V[M-k]");
    }
    for (int k = 0; k <= M / 2; ++k) EXPECT(seen[k] == 1, "M %d: pair (%d, M - %d) owned %d times", M, k, k, seen[k]);
  }
  return true;
}

// The filter sweep's walks (UniformFilterWalks) against kspec, written out here: K[k] and
// K[M-k] of every step of every thread from the same stage entry, conjugated alike, for every
// split n1·n2 = N with n1 | M/16 (the launcher's condition; n1_max = 2·M/16 breaks it).
// rebase_by: thread 0's u >= 8 walks rebased by that many steps (the kernel's 8).
struct StageRead {
  int entry;
  bool conj;
};
StageRead kspec_read(int f, const KArgs& a) {
  const int k1 = f & (a.n1 - 1);
  const bool dir = k1 <= (a.n1 >> 1);
  const int ff = dir ? f : a.N - f;
  return {(ff & (a.n1 - 1)) * (a.n2 + 1) + (ff >> a.ln1), !dir};
}

template <int M>
bool check_walks_at(int rebase_by, int n1_max) {
  for (int ln1 = 1; (1 << ln1) <= n1_max; ++ln1) {
    KArgs a{};
    a.N = 2 * M;
    a.ln1 = ln1;
    a.n1 = 1 << ln1;
    a.n2 = a.N / a.n1;
    for (a.ln2 = 0; (1 << a.ln2) < a.n2; ++a.ln2) {}
    for (int tx = 0; tx < M / 32; ++tx) {
      UniformFilterWalks<M> walks(tx, a);
      if (tx == 0) {
        walks.k_hi.base += (8 - rebase_by) * walks.k_hi.step;
        walks.m_hi.base += (8 - rebase_by) * walks.m_hi.step;
      }
      for (int u = 0; u < 16; ++u) {
        const int k = uniform_pair_freq<M>(u, tx);
        const KWalk &wk = u < 8 ? walks.k_lo : walks.k_hi, &wm = u < 8 ? walks.m_lo : walks.m_hi;
        const StageRead want_k = kspec_read(k, a), want_m = kspec_read(M - k, a);
        EXPECT(wk.base + u * wk.step == want_k.entry && wk.neg == want_k.conj,
               "M %d n1 %d tx %d u %d: K[%d] from entry %d%s, kspec reads %d%s", M, a.n1, tx, u, k,
               wk.base + u * wk.step, wk.neg ? " conjugated" : "", want_k.entry, want_k.conj ? " conjugated" : "");
        EXPECT(wm.base + u * wm.step == want_m.entry && wm.neg == want_m.conj,
               "M %d n1 %d tx %d u %d: K[%d] from entry %d%s, kspec reads %d%s", M, a.n1, tx, u, M - k,
               wm.base + u * wm.step, wm.neg ? " conjugated" : "", want_m.entry, want_m.conj ? " conjugated" : "");
      }
    }
  }
  return true;
}

// n1_max_over_ns: the largest n1 checked, in units of M/16.
bool check_walks(int rebase_by, int n1_max_over_ns) {
  const auto at = [&](auto logm) {
    constexpr int M = 1 << decltype(logm)::value;
    return check_walks_at<M>(rebase_by, n1_max_over_ns * M / 16);
  };
  return at(std::integral_constant<int, 7>{}) && at(std::integral_constant<int, 8>{}) &&
         at(std::integral_constant<int, 9>{}) && at(std::integral_constant<int, 10>{}) &&
         at(std::integral_constant<int, 11>{}) && at(std::integral_constant<int, 12>{}) &&
         at(std::integral_constant<int, 13>{}) && at(std::integral_constant<int, 14>{});
}

// The uniform kernel's filter copy where n2 | T (stage_filter_begin_fixed_column): entry
// tx + j·T at stage_index(tx) + j·stage_fixed_column_step, the slot stage_index gives it.
// T: threads per sequence of the plan, M/32.
template <int T>
bool check_fixed_column_copy(int step_error) {
  for (int ln2 = 0; (1 << ln2) <= T; ++ln2) {
    for (int ln1 = 1; ln1 <= 8; ++ln1) {
      KArgs a{};
      a.n1 = 1 << ln1, a.ln1 = ln1, a.n2 = 1 << ln2, a.ln2 = ln2;
      a.N = a.n1 * a.n2;
      const int step = stage_fixed_column_step<T>(a) + step_error;
      for (int tx = 0; tx < T; ++tx)
        for (int e = tx, j = 0; e < stage_entries(a); e += T, ++j)
          EXPECT(stage_index(a, tx) + j * step == stage_index(a, e), "T %d n1 %d n2 %d: entry %d at %d, not %d", T,
                 a.n1, a.n2, e, stage_index(a, tx) + j * step, stage_index(a, e));
    }
  }
  return true;
}

bool check_fixed_column_copies(int step_error) {
  return check_fixed_column_copy<4>(step_error) && check_fixed_column_copy<8>(step_error) &&
         check_fixed_column_copy<16>(step_error) && check_fixed_column_copy<32>(step_error) &&
         check_fixed_column_copy<64>(step_error) && check_fixed_column_copy<128>(step_error) &&
         check_fixed_column_copy<256>(step_error);
}

// tw_const<false> and cmul (fp32/radix_dft.cuh) written out in host arithmetic: fmaf and float
// products are correctly rounded here as on the GPU. The table is the kernel's (make_tw32).
struct HostCf {
  float x, y;
  bool operator==(const HostCf& o) const { return std::memcmp(this, &o, sizeof o) == 0; }  // bits, signed zeros too
};
HostCf host_cmul(HostCf a, HostCf b) { return {std::fmaf(a.x, b.x, -a.y * b.y), std::fmaf(a.x, b.y, a.y * b.x)}; }
HostCf host_tw_const(HostCf d, int k) {
  static constexpr Tw32Table t = make_tw32();
  const int m = k & 31;
  if (m == 0) return d;
  if (m == 16) return {-d.x, -d.y};
  if (m == 8) return {d.y, -d.x};
  if (m == 24) return {-d.y, d.x};
  const float wr = t.c[m], wi = t.s[m];
  if ((m & 3) == 0) {
    const float h = 0.70710678118654752440f;
    const float sr = wr > 0.f ? 1.f : -1.f, si = wi > 0.f ? 1.f : -1.f;
    return {h * (sr * d.x - si * d.y), h * (si * d.x + sr * d.y)};
  }
  return host_cmul(d, {wr, wi});
}

// uniform_pair_twiddles_rotated's other threads: w[u] for u >= 8 from tw_const(wp0, u - 8) turned
// by -i (turn(t) = (t.y, -t.x); a wrong turn for the rejection), against tw_const(wp0, u), for
// wp0 = ω_N^tx as build_twiddles rounds it, every 0 < tx < M/32 of every plan size.
bool check_rotated_twiddles(HostCf (*turn)(HostCf)) {
  for (int logm = 7; logm <= 14; ++logm) {
    const int M = 1 << logm;
    for (int tx = 1; tx < M / 32; ++tx) {
      const double angle = 2.0 * tx / (2.0 * M);  // in units of π, as sincospi takes it
      const HostCf wp0 = {(float)std::cos(kPi * angle), (float)(-std::sin(kPi * angle))};
      for (int u = 8; u < 16; ++u) {
        const HostCf want = host_tw_const(wp0, u), got = turn(host_tw_const(wp0, u - 8));
        EXPECT(got == want, "M %d tx %d u %d: (%a, %a) by the turn, tw_const gives (%a, %a)", M, tx, u, got.x, got.y,
               want.x, want.y);
      }
    }
  }
  return true;
}

int main() {
  host_check::Tally tally;
  tally.must_pass("uniform sweep = for_each_pair, every thread, M 2^7..2^14", check_sweeps(UniformMaps{}));
  tally.must_pass("filter walks = kspec, every step, split n1 | M/16", check_walks(8, 1));
  tally.must_pass("filter copy by columns = stage_index, n2 | T", check_fixed_column_copies(0));
  UniformMaps moved;
  moved.moved_inputs = true;
  tally.must_pass("moved-input sweep = for_each_pair, every thread", check_sweeps(moved));
  tally.must_pass("rotated twiddles = tw_const, every thread", check_rotated_twiddles([](HostCf t) {
    return HostCf{t.y, -t.x};
  }));

  // The same checks on deliberately wrong maps.
  UniformMaps m;
  m.step = [](int u, bool lane0) {  // thread 0 at u = 3 takes Bv[12] for Z[M-k], as the others do
    UniformPairStep s(u, lane0);
    if (lane0 && u == 3) s.zm = UniformPairStep(u, false).zm;
    return s;
  };
  tally.must_reject("wrong: thread 0's Z[M-k] of step 3", [&] { return check_sweeps(m); });
  m = UniformMaps{};
  m.step = [](int u, bool lane0) {  // thread 0's k = 0 turned by wp0 (the table's ω^0 = 1 - 0i)
    UniformPairStep s(u, lane0);
    if (lane0 && u == 0) s.tw_base = 0;
    return s;
  };
  tally.must_reject("wrong: thread 0's k = 0 twiddle from wp0", [&] { return check_sweeps(m); });
  m = UniformMaps{};
  m.step = [](int u, bool lane0) {  // slots 8..15 for thread 0's steps u >= 8, k = M/2 in 16
    UniformPairStep s(u, lane0);
    s.slot = u;
    return s;
  };
  tally.must_reject("wrong: thread 0's slots u for u >= 8", [&] { return check_sweeps(m); });
  m = UniformMaps{};
  m.freq = [](int M, int u, int tx) { return tx + u * (M / 16); };
  tally.must_reject("wrong: thread 0's k = u·M/16 for u >= 8", [&] { return check_sweeps(m); });
  m = UniformMaps{};
  m.source = [](int d) { return d < 16 ? lane0_output_source(d) : d; };
  tally.must_reject("wrong: thread 0's B2 left in place", [&] { return check_sweeps(m); });
  m = UniformMaps{};
  m.source = [](int d) { return d > 8 && d < 16 ? 16 + d : lane0_output_source(d); };
  tally.must_reject("wrong: thread 0's A2[9..15] from B2[9..15]", [&] { return check_sweeps(m); });
  tally.must_reject("wrong: thread 0's u >= 8 walks rebased by 7", [] { return check_walks(7, 1); });
  tally.must_reject("wrong: walks where n1 = 2·M/16", [] { return check_walks(8, 2); });
  tally.must_reject("wrong: filter copy rows n2 apart, not n2 + 1", [] { return check_fixed_column_copies(-1); });
  m = UniformMaps{};
  m.moved_inputs = true;
  m.input_source = [](int d) { return d == 24 ? 10 : lane0_input_source(d); };
  tally.must_reject("wrong: thread 0's Z[M-k] of step 7 from A[10]", [&] { return check_sweeps(m); });
  m = UniformMaps{};
  m.moved_inputs = true;
  m.input_source = [](int d) { return d >= 16 ? -1 : lane0_input_source(d); };
  tally.must_reject("wrong: thread 0's Bv left in place", [&] { return check_sweeps(m); });
  tally.must_reject("wrong: twiddles turned by +i", [] {
    return check_rotated_twiddles([](HostCf t) { return HostCf{-t.y, t.x}; });
  });
  tally.must_reject("wrong: twiddles swapped, not turned", [] {
    return check_rotated_twiddles([](HostCf t) { return HostCf{t.y, t.x}; });
  });

  return tally.finish("pair sweep checks");
}
