// The harness of the host index checks (tests/*_check.cu, built with nvcc and run without a
// GPU): EXPECT fails a check with its reason; Tally counts the checks that must pass and the
// deliberately wrong maps that must be rejected, so that every checker is known to be able to fail.
#pragma once

#include <cstdio>
#include <functional>

namespace host_check {

inline int failures = 0;
inline bool quiet = false;  // while a wrong map is checked: its failures are expected

class Tally {
 public:
  void must_pass(const char* name, bool ok) {
    std::printf("%-52s %s\n", name, ok ? "ok" : "FAILED");
    ok ? ++passed_ : ++failures;
  }
  void must_reject(const char* name, const std::function<bool()>& check) {
    quiet = true;
    const bool ok = check();
    quiet = false;
    std::printf("%-52s %s\n", name, ok ? "NOT REJECTED" : "rejected");
    ok ? ++failures : ++rejected_;
  }
  // The summary line, and the program's exit status.
  int finish(const char* what) const {
    std::printf("%s: %d passed, %d wrong maps rejected, %d failed\n", what, passed_, rejected_, failures);
    return failures == 0 ? 0 : 1;
  }

 private:
  int passed_ = 0, rejected_ = 0;
};

}  // namespace host_check

// In a check returning bool: false, and why (unless a wrong map is being checked).
#define EXPECT(cond, ...)                                \
  do {                                                   \
    if (!(cond)) {                                       \
      if (!host_check::quiet) {                          \
        std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
        std::printf(__VA_ARGS__);                        \
        std::printf("\n");                               \
      }                                                  \
      return false;                                      \
    }                                                    \
  } while (0)
