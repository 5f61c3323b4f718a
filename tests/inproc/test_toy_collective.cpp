// Adding a collective takes one file: this one defines a toy inclusive scan (rank r gets the
// reduction of the inputs of ranks 0..r, passed down a chain) as a collective definition
// (kolo/communicator/collective.hpp) and runs it with Communicator::call<>, without a line of
// kolo changed: the call gets the signature, deadline and error agreement of every built-in
// collective (a refused argument fails every rank, ranks that disagree on the count fail with a
// MismatchError naming both). The built-ins broadcast, reduce_scatter, alltoall and barrier are
// definitions of the same shape (kolo/communicator/broadcast.hpp, ...).
#include <atomic>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "inproc_harness.hpp"

namespace {

struct ToyScan {
  // Stamped on its messages: an identity no built-in collective uses.
  static constexpr kolo::Collective collective = static_cast<kolo::Collective>(200);
  struct Args {
    kolo::TensorView in, out;
    kolo::ReduceOp op = kolo::ReduceOp::sum;
  };
  static kolo::CallShape shape(const Args& a, const kolo::CallFacts&) {
    return {a.in.dtype, a.op, a.in.count, -1, 0};
  }
  static void check(const Args& a, const kolo::CallFacts& f) {
    kolo::checks::check_buffer(a.in, "toy_scan input", f.device_ok);
    kolo::checks::check_buffer(a.out, "toy_scan output", f.device_ok);
    kolo::checks::check_same_dtype(a.in, a.out, "toy_scan");
    kolo::checks::check_same_count(a.in.count, a.out.count, "toy_scan");
    kolo::checks::check_overlap("toy_scan", kolo::checks::bytes_of(a.in),
                                kolo::checks::bytes_of(a.out), a.in.data);
  }
  static void run(kolo::TransportRef t, const Args& a, const kolo::AlgoOptions& opt,
                  const kolo::AlgoContext&) {
    const std::size_t bytes = a.in.bytes();
    if (bytes == 0) return;
    if (a.out.data != a.in.data) std::memcpy(a.out.data, a.in.data, bytes);
    const int r = t.rank();
    if (r > 0) {  // out = prefix of ranks 0..r-1 (op) this rank's input
      const kolo::ReduceSpec rs{kolo::reduce_function(a.in.dtype, a.op),
                                kolo::dtype_size(a.in.dtype)};
      auto q = t.irecv_reduce(r - 1, a.out.data, a.out.data, bytes, rs, opt.sig);
      t.wait(q, opt.deadline);
    }
    if (r + 1 < t.size()) {
      auto s = t.isend(r + 1, a.out.data, bytes, opt.sig);
      t.wait(s, opt.deadline);
    }
  }
};
static_assert(kolo::CollectiveDefinition<ToyScan>);

}  // namespace

TEST_CASE("toy collective: defined in one file, run by Communicator::call, exact, checked") {
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
        std::vector<std::int64_t> in(count), out(count, -1);
        for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<std::int64_t>(r + 1) * (i + 1);
        c.call<ToyScan>({kolo::TensorView(std::span(in)), kolo::TensorView(std::span(out))});
        const auto tri = static_cast<std::int64_t>((r + 1) * (r + 2) / 2);
        for (std::size_t i = 0; i < count; ++i) {
          if (out[i] != tri * static_cast<std::int64_t>(i + 1)) {
            throw std::runtime_error("element " + std::to_string(i) + " is " +
                                     std::to_string(out[i]));
          }
        }
        // In place too (the documented alias), then a built-in between two calls.
        c.call<ToyScan>({kolo::TensorView(std::span(in)), kolo::TensorView(std::span(in))});
        c.barrier();
      }
    });
  }

  // An argument refused on one rank fails the call on every rank (the error agreement).
  std::atomic<int> refused{0}, peers_failed{0};
  kolo::InprocFabric fabric(3, 30.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      inproc::Comm c(std::make_unique<kolo::InprocTransport>(fabric, r), inproc::options_from({}));
      std::vector<float> in(10), out(r == 1 ? 9 : 10);
      try {
        c.call<ToyScan>({kolo::TensorView(std::span(in)), kolo::TensorView(std::span(out))});
      } catch (const kolo::ConfigError& e) {
        const std::string w = e.what();
        if (r == 1 && w.find("toy_scan: input has 10 elements but output has 9") != w.npos) {
          ++refused;
        } else if (r != 1) {
          ++peers_failed;
        }
      } catch (const kolo::Error&) {
        if (r != 1) ++peers_failed;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(refused.load() == 1);
  CHECK(peers_failed.load() == 2);
}
