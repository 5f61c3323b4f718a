// The doctest main of every doctest program (one object, compiled once). Cases run in file
// order, stated here rather than left to doctest's default: the multi-rank workers (engine,
// optimizer) rely on every rank running the same cases in the same order. A run whose filters
// matched no test case fails (doctest_ran_nothing.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "doctest_ran_nothing.hpp"

int main(int argc, char** argv) {
  doctest::Context ctx;
  ctx.setOption("order-by", "file");
  ctx.applyCommandLine(argc, argv);
  return kolo_test::ran_nothing_exit_code(ctx.run(), argv[0]);
}
