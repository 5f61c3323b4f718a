// doctest main for the optimizer worker: all ranks run the same cases in file order.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

int main(int argc, char** argv) {
  doctest::Context ctx;
  ctx.setOption("order-by", "file");
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
