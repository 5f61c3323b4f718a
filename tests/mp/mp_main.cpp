// doctest main for multi-process workers: every rank runs the same test cases in the same order
// (collectives must be called in the same order everywhere), and the exit code is non-zero on
// any failed check, which kolo-run passes on to CTest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "mp_common.hpp"

int main(int argc, char** argv) {
  doctest::Context ctx;
  ctx.setOption("order-by", "file");
  ctx.applyCommandLine(argc, argv);
  try {
    kolo_test::comm();  // connect before any test, so setup errors are reported as such
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "setup failed: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 3;
  }
  return ctx.run();
}
