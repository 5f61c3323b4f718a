// doctest main for multi-process workers: every rank runs the same test cases in the same order
// (collectives must be called in the same order everywhere), and the exit code is non-zero on
// any failed check, which kolo-run passes on to CTest; so is a run whose filters matched no test
// case (doctest_ran_nothing.hpp), on every rank.
//
// This file holds doctest's implementation and nothing of kolo's communicator: the connection is
// made by kolo_test::connect_before_tests(), defined by the program's test file (mp_common.hpp),
// so the Communicator is instantiated once per program, in the file that uses it, and this main
// compiles once for every transport (header-only it took 22-32 s with the communicator in it).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <kolo/core/error.hpp>

#include "../doctest_ran_nothing.hpp"

namespace kolo_test {
void connect_before_tests();
}

int main(int argc, char** argv) {
  doctest::Context ctx;
  ctx.setOption("order-by", "file");
  ctx.applyCommandLine(argc, argv);
  try {
    kolo_test::connect_before_tests();  // connect before any test: setup errors reported as such
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "setup failed: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 3;
  }
  return kolo_test::ran_nothing_exit_code(ctx.run(), argv[0]);
}
