// Host check of the four-step inner stage's row orders (fourstep/args.cuh, inner_row), no GPU:
// for each order and a spread of (B, C, R), the work items w < B·C·R visit every intermediate
// row (s, k2) = (b·C + c, k2) once, each with the filter row (c, k2) of its own channel; in the
// channel-major order the B rows of a filter row are consecutive work items, in the batch-major
// order w is the row itself. Deliberately wrong maps must be rejected.
//
// Built by tests/test_pair_sweep.py: nvcc -x cu (host code only runs), then run.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "fourstep/args.cuh"
#include "host_check.cuh"

using namespace monarch_fftconv::fp32_detail;

using RowMap = std::function<InnerRow(int64_t)>;

// Every intermediate row once, each with its own channel's filter row.
bool visits_every_row_once(const RowMap& row_of, int64_t B, int64_t C, int R) {
  const int64_t rows = B * C * R;
  std::vector<int> times(rows, 0);
  for (int64_t w = 0; w < rows; ++w) {
    const InnerRow row = row_of(w);
    EXPECT(0 <= row.data && row.data < rows, "B=%lld C=%lld R=%d w=%lld: row %lld out of range", (long long)B,
           (long long)C, R, (long long)w, (long long)row.data);
    const int64_t s = row.data / R, k2 = row.data % R, c = s % C;
    EXPECT(row.channel == c && row.filter == c * R + k2, "B=%lld C=%lld R=%d w=%lld: row (s=%lld, k2=%lld) given "
           "channel %lld, filter row %lld", (long long)B, (long long)C, R, (long long)w, (long long)s, (long long)k2,
           (long long)row.channel, (long long)row.filter);
    ++times[row.data];
  }
  for (int64_t r = 0; r < rows; ++r) EXPECT(times[r] == 1, "B=%lld C=%lld R=%d: row %lld visited %d times",
                                            (long long)B, (long long)C, R, (long long)r, times[r]);
  return true;
}

// The B rows of each filter row are the consecutive work items f·B .. f·B + B - 1.
bool filter_rows_together(const RowMap& row_of, int64_t B, int64_t C, int R) {
  for (int64_t w = 0; w < B * C * R; ++w) {
    EXPECT(row_of(w).filter == w / B, "B=%lld C=%lld R=%d: work item %lld has filter row %lld", (long long)B,
           (long long)C, R, (long long)w, (long long)row_of(w).filter);
  }
  return true;
}

bool is_identity(const RowMap& row_of, int64_t B, int64_t C, int R) {
  for (int64_t w = 0; w < B * C * R; ++w) EXPECT(row_of(w).data == w, "work item %lld is row %lld", (long long)w,
                                                 (long long)row_of(w).data);
  return true;
}

int main() {
  host_check::Tally tally;
  struct Shape { int64_t B, C; int R; };
  // R = P/2 + 1: 5 (N = 65536), 9, 17, 33 (N = 2^19 at M = 4096: 65), 513 (N = 2^23)
  const Shape shapes[] = {{1, 1, 5}, {3, 5, 9}, {8, 7, 17}, {2, 3, 65}, {5, 1, 33}, {1, 4, 513}, {6, 2, 513}};
  char name[96];
  for (const Shape& x : shapes) {
    const RowMap channel_major = [&](int64_t w) { return inner_row<true>(w, x.B, x.C, x.R); };
    const RowMap batch_major = [&](int64_t w) { return inner_row<false>(w, x.B, x.C, x.R); };
    std::snprintf(name, sizeof name, "channel-major, B=%lld C=%lld R=%d", (long long)x.B, (long long)x.C, x.R);
    tally.must_pass(name, visits_every_row_once(channel_major, x.B, x.C, x.R) &&
                              filter_rows_together(channel_major, x.B, x.C, x.R));
    std::snprintf(name, sizeof name, "batch-major, B=%lld C=%lld R=%d", (long long)x.B, (long long)x.C, x.R);
    tally.must_pass(name, visits_every_row_once(batch_major, x.B, x.C, x.R) && is_identity(batch_major, x.B, x.C, x.R));
  }
  const Shape x{3, 5, 9};
  tally.must_reject("wrong: rows (c·B + b, k2), B=3 C=5 R=9", [&] {
    return visits_every_row_once([&](int64_t w) {
      const int64_t f = w / x.B, b = w % x.B, c = f / x.R, k2 = f % x.R;
      return InnerRow{(c * x.B + b) * x.R + k2, c, f};
    }, x.B, x.C, x.R);
  });
  tally.must_reject("wrong: the batch left out, B=3 C=5 R=9", [&] {
    return visits_every_row_once([&](int64_t w) {
      const int64_t f = w / x.B, c = f / x.R, k2 = f % x.R;
      return InnerRow{c * x.R + k2, c, f};
    }, x.B, x.C, x.R);
  });
  tally.must_reject("wrong: channel s / C, B=3 C=5 R=9", [&] {
    return visits_every_row_once([&](int64_t w) {
      const int64_t s = w / x.R, k2 = w % x.R, c = s / x.C;
      return InnerRow{w, c, c * x.R + k2};
    }, x.B, x.C, x.R);
  });
  tally.must_reject("wrong: batch-major rows not together, B=3 C=5 R=9", [&] {
    return filter_rows_together([&](int64_t w) { return inner_row<false>(w, x.B, x.C, x.R); }, x.B, x.C, x.R);
  });
  return tally.finish("fourstep_rows_check");
}
