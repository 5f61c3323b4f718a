// Makes a doctest run whose filters matched no test case fail: doctest itself exits 0 when
// -tc=/-ts=/-sf= (or --first/--last) leave nothing to run, so a renamed TEST_CASE would turn a
// filtered CTest run into one that passes having checked nothing. Included by every doctest main
// (tests/doctest_main.cpp, tests/mp/mp_main.cpp); the main calls ran_nothing_exit_code() on
// ctx.run()'s result.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>

namespace kolo_test {

// What the run did, filled in by the listener below (one doctest run per process).
struct RunCount {
  bool run_started = false;  // false for queries (--count, --list-test-cases) and --help
  unsigned started = 0;      // test cases that ran
  unsigned filtered = 0;     // test cases left out by a filter (not by a skip decorator)
};

inline RunCount& run_count() {
  static RunCount c;
  return c;
}

// A listener: it sees every test case started or skipped, and reports nothing.
struct RanNothingListener : doctest::IReporter {
  explicit RanNothingListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override { run_count().run_started = true; }
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++run_count().started; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData& tc) override {
    if (!tc.m_skip) ++run_count().filtered;
  }
};

// The exit code of the program: doctest's, or 2 when a filter left no test case to run.
inline int ran_nothing_exit_code(int doctest_result, const char* program) {
  const RunCount& c = run_count();
  if (doctest_result == 0 && c.run_started && c.started == 0 && c.filtered > 0) {
    std::fprintf(stderr,
                 "%s: the filters matched no test case (%u left out): nothing was checked, "
                 "failing (a renamed TEST_CASE?)\n",
                 program, c.filtered);
    return 2;
  }
  return doctest_result;
}

}  // namespace kolo_test

DOCTEST_REGISTER_LISTENER("kolo_ran_nothing", 0, kolo_test::RanNothingListener);
