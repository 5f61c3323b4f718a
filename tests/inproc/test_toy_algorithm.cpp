// Adding an algorithm takes one file: this one registers a toy allreduce (a star: every rank
// sends its vector to rank 0, which folds them in in rank order and sends the result back), and
// kolo then treats it like a built-in: KOLO_ALLREDUCE names it, the Selector runs it, and the
// registry-driven matrix of test_algorithms.cpp runs it on every rank count and element count
// without a line there. The test below checks the first two: selected by the variable, exact
// results through the correctness matrix.
#include "inproc_harness.hpp"

namespace {

void toy_star_allreduce(kolo::TransportRef t, const kolo::AllreduceArgs& a,
                        const kolo::AlgoOptions& opt, const kolo::AlgoContext&) {
  const int n = t.size();
  const std::size_t bytes = a.bytes();
  const auto* in = static_cast<const std::byte*>(a.in);
  auto* out = static_cast<std::byte*>(a.out);
  if (a.count == 0) return;
  if (t.rank() != 0) {
    auto s = t.isend(0, in, bytes, opt.sig);
    auto r = t.irecv(0, out, bytes, opt.sig);  // the root answers only after it has our vector
    t.wait(s, opt.deadline);
    t.wait(r, opt.deadline);
    return;
  }
  if (out != in) std::memcpy(out, in, bytes);
  const kolo::ReduceSpec rs{kolo::reduce_function(a.dtype, a.op), kolo::dtype_size(a.dtype)};
  for (int q = 1; q < n; ++q) {
    auto r = t.irecv_reduce(q, out, out, bytes, rs, opt.sig);
    t.wait(r, opt.deadline);
  }
  if (a.op == kolo::ReduceOp::average) kolo::finish_average(out, a.count, a.dtype, n);
  std::vector<kolo::TransportRef::Request> sends;
  for (int q = 1; q < n; ++q) sends.push_back(t.isend(q, out, bytes, opt.sig));
  for (auto& s : sends) t.wait(s, opt.deadline);
}

kolo::AlgorithmEntry<kolo::AllreduceAlgorithm> toy_entry() {
  kolo::AlgorithmEntry<kolo::AllreduceAlgorithm> e;
  e.name = "toy-star";
  e.aliases = {"star"};
  // Rank 0 receives and folds n-1 vectors, then sends n-1: never cheaper than the built-ins, so
  // only an override selects it.
  e.cost = [](const kolo::CostQuery& q) {
    return 2.0 * (q.n - 1) * (q.link.alpha + q.bytes * q.link.beta) + (q.n - 1) * q.bytes * q.gamma;
  };
  e.run = toy_star_allreduce;
  return e;
}

// The registration: before main, so every communicator of the binary sees it.
const kolo::AllreduceAlgorithm kToy = kolo::register_algorithm(toy_entry());

}  // namespace

TEST_CASE(
    "toy algorithm: registered in one file, selected by KOLO_ALLREDUCE, exact on the matrix") {
  CHECK(kolo::parse_allreduce_algorithm("toy-star") == kToy);
  CHECK(kolo::parse_allreduce_algorithm("STAR") == kToy);
  CHECK(std::string(kolo::algorithm_name(kToy)) == "toy-star");
  // The model never picks it on its own.
  kolo::SelectionShape shape;
  shape.size = shape.local_size = 8;
  shape.flat = shape.intra = kolo::Tuning{}.shm;
  shape.inter = kolo::Tuning{}.tcp;
  const kolo::Selector sel(kolo::Tuning{}, shape);
  for (std::size_t b = 8; b <= (std::size_t{1} << 28); b *= 16) {
    CHECK(sel.model_allreduce(b) != kToy);
  }

  // Selected by the variable: every count on a spread of rank counts (the registry-driven
  // matrix in test_algorithms.cpp runs it, forced, on all of them).
  const auto opts = inproc::options_from({{"KOLO_ALLREDUCE", "toy-star:0-max"}});
  for (int n : {1, 2, 3, 4, 7, 9}) {
    CAPTURE(n);
    inproc::Failures f;
    inproc::run_ranks(
        n,
        [&](inproc::Comm& c, int r) {
          for (std::size_t count : inproc::kCounts) {
            inproc::allreduce_cell(c, r, count, f, "KOLO_ALLREDUCE=toy-star", kToy);
          }
        },
        opts);
    CHECK_MESSAGE(f.count() == 0, n, " ranks: ", f.text());
  }
  // Names it shares with nobody: a second registration of the name is refused, naming it.
  try {
    kolo::register_algorithm(toy_entry());
    FAIL("registered the same name twice");
  } catch (const kolo::ConfigError& e) {
    CHECK(std::string(e.what()).find("'toy-star' is taken") != std::string::npos);
  }
}
