// tests/common/skip.hpp — the C++ tests' skip: a skip outside CI, a failure in CI unless its reason
// is on tests/common/skip_allowlist.txt (the shell twin is skip.sh, the Python one kolo_skip.py;
// all three read that list and decide alike).
//
//   return kolo_test::skip_exit_code("no-gpu", "no CUDA device");   // a main(): 77 or 1
//   KOLO_TEST_SKIP_CASE("cpu-feature", "this CPU has no F16C");     // a doctest case: returns,
//                                                                   // with MESSAGE or FAIL_CHECK
//
// A skip is allowed outside CI (CI unset, empty, "0" or "false"), and in CI only for a reason the
// list names; with KOLO_TEST_REQUIRE_GPU=1 never for the reason no-gpu. The list is found next to
// this header (its __FILE__), or at KOLO_SKIP_ALLOWLIST; where it cannot be read, no reason is
// allowed in CI.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace kolo_test {

inline bool skip_in_ci() {
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  const std::string_view v(ci);
  return !(v.empty() || v == "0" || v == "false" || v == "FALSE" || v == "False" || v == "no");
}

inline std::string skip_allowlist_path() {
  if (const char* p = std::getenv("KOLO_SKIP_ALLOWLIST"); p != nullptr && *p != '\0') return p;
  std::string here = __FILE__;
  const std::size_t slash = here.find_last_of('/');
  here = slash == std::string::npos ? std::string(".") : here.substr(0, slash);
  return here + "/skip_allowlist.txt";
}

inline bool skip_reason_listed(std::string_view reason) {
  std::ifstream in(skip_allowlist_path());
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name, listed;
    if (!(words >> name >> listed) || name.front() == '#') continue;
    if (listed == reason) return true;
  }
  return false;
}

// Why a skip for `reason` is a failure here; empty where it is allowed.
inline std::string skip_refusal(std::string_view reason) {
  const char* gpu = std::getenv("KOLO_TEST_REQUIRE_GPU");
  if (reason == "no-gpu" && gpu != nullptr && std::string_view(gpu) == "1") {
    return "KOLO_TEST_REQUIRE_GPU=1";
  }
  if (skip_in_ci() && !skip_reason_listed(reason)) {
    return "CI=" + std::string(std::getenv("CI")) + " and '" + std::string(reason) +
           "' is not on tests/common/skip_allowlist.txt";
  }
  return {};
}

inline std::string skip_failure_text(std::string_view reason, std::string_view message,
                                     const std::string& why) {
  return "FAILED: this test would skip (" + std::string(reason) + ": " + std::string(message) +
         "), and a skip is a failure here (" + why + ")";
}

// For a main(): says why, and returns 77 (CTest's SKIP_RETURN_CODE) or 1.
inline int skip_exit_code(std::string_view reason, std::string_view message) {
  const std::string why = skip_refusal(reason);
  if (why.empty()) {
    std::printf("SKIP (%.*s): %.*s\n", static_cast<int>(reason.size()), reason.data(),
                static_cast<int>(message.size()), message.data());
    std::fflush(stdout);
    return 77;
  }
  std::fprintf(stderr, "%s\n", skip_failure_text(reason, message, why).c_str());
  return 1;
}

}  // namespace kolo_test

// Ends a doctest case early: a MESSAGE where the skip is allowed, a FAIL_CHECK where it is not
// (doctest's macros, resolved where it is used).
#define KOLO_TEST_SKIP_CASE(reason, message)                                                     \
  do {                                                                                           \
    std::ostringstream kolo_skip_text_;                                                          \
    kolo_skip_text_ << message;                                                                  \
    const std::string kolo_skip_why_ = ::kolo_test::skip_refusal(reason);                        \
    if (kolo_skip_why_.empty()) {                                                                \
      MESSAGE("SKIP (" << (reason) << "): " << kolo_skip_text_.str());                           \
    } else {                                                                                     \
      FAIL_CHECK(::kolo_test::skip_failure_text(reason, kolo_skip_text_.str(), kolo_skip_why_)); \
    }                                                                                            \
    return;                                                                                      \
  } while (false)
