// The transport contract (transport/transport.hpp): which layers each transport models, that
// Communicator compiles over every one of them (ShmTransport, TcpTransport, RoutedTransport,
// MeshTransport through their factory; MPI and the in-process transport adopted), and that the
// in-process transport drives a whole Communicator: the collectives without a registry
// (reduce, gather, scatter, alltoallv, barrier), point-to-point, and errors that reach every
// rank. A compile-time test (CMake, inproc/contract/static_assert_names_the_member) checks that
// a transport missing a member is refused with a message naming it.
#include "inproc_harness.hpp"

#include <cstring>

#include <kolo/algorithm/allreduce_halving_doubling.hpp>
#include <kolo/algorithm/ring_allreduce_wire.hpp>
#include <kolo/kolo.hpp>
#include <kolo/transport/transport_ref.hpp>

namespace {

// What each transport is, stated at compile time.
static_assert(kolo::Transport<kolo::InprocTransport> && !kolo::Connectable<kolo::InprocTransport>);
static_assert(kolo::Transport<kolo::TransportRef>);
static_assert(kolo::Connectable<kolo::MeshTransport> && kolo::HasPeerRoutes<kolo::MeshTransport>);
static_assert(kolo::Connectable<kolo::ShmTransport> && kolo::Connectable<kolo::TcpTransport> &&
              kolo::Connectable<kolo::RoutedTransport>);
static_assert(!kolo::HasNativeAllreduce<kolo::MeshTransport> &&
              !kolo::AcceptsDeviceBuffers<kolo::MeshTransport>);
// Vectored messages (allreduce_coalesced in pieces): the mesh family has them, others pack.
static_assert(kolo::VectoredP2P<kolo::MeshTransport> && kolo::VectoredP2P<kolo::ShmTransport> &&
              kolo::VectoredP2P<kolo::TcpTransport> && kolo::VectoredP2P<kolo::RoutedTransport> &&
              !kolo::VectoredP2P<kolo::InprocTransport>);

}  // namespace

// Communicator over every connectable transport instantiates (README advertises
// Communicator<ShmTransport>; the multi-process suites run them), and over an adopted one. On
// the compiled core the library's own build instantiates the four connectable ones
// (src/lib/communicator_*.cpp), so this file does not do it again (35 -> 21 s of compile time
// at -O2 on a 2-core CI machine, and the same share under the sanitizers); header-only it does.
#if !KOLO_USE_COMPILED_CORE
template class kolo::Communicator<kolo::ShmTransport>;
template class kolo::Communicator<kolo::TcpTransport>;
template class kolo::Communicator<kolo::RoutedTransport>;
template class kolo::Communicator<kolo::MeshTransport>;
#endif
template class kolo::Communicator<kolo::InprocTransport>;

TEST_CASE("contract: the in-process transport runs reduce, gather, scatter, alltoallv, barrier") {
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    inproc::Failures f;
    inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
      const std::string at = "rank " + std::to_string(r) + "/" + std::to_string(n);
      c.barrier();
      for (std::size_t count : {std::size_t{0}, std::size_t{7}, std::size_t{100000}}) {
        for (int root : {0, n - 1}) {
          std::vector<std::int64_t> in(count), out(count, -1);
          for (std::size_t i = 0; i < count; ++i) in[i] = (r + 1) * static_cast<std::int64_t>(i);
          c.reduce(kolo::TensorView(in.data(), count, kolo::DataType::int64),
                   kolo::TensorView(out.data(), count, kolo::DataType::int64), kolo::ReduceOp::sum,
                   root);
          if (r == root) {
            for (std::size_t i = 0; i < count; ++i) {
              if (out[i] !=
                  static_cast<std::int64_t>(n * (n + 1) / 2) * static_cast<std::int64_t>(i)) {
                f.add(at + ": reduce element " + std::to_string(i));
                break;
              }
            }
          }
          std::vector<std::int32_t> mine(count), all(count * static_cast<std::size_t>(n), -1);
          for (std::size_t i = 0; i < count; ++i) mine[i] = inproc::gather_value(r, i);
          c.gather(kolo::TensorView(mine.data(), count, kolo::DataType::int32),
                   kolo::TensorView(all.data(), all.size(), kolo::DataType::int32), root);
          if (r == root) {
            for (std::size_t k = 0; k < all.size(); ++k) {
              if (all[k] != inproc::gather_value(static_cast<int>(k / count), k % count)) {
                f.add(at + ": gather element " + std::to_string(k));
                break;
              }
            }
          }
          std::vector<std::int32_t> got(count, -1);
          c.scatter(kolo::TensorView(all.data(), all.size(), kolo::DataType::int32),
                    kolo::TensorView(got.data(), count, kolo::DataType::int32), root);
          if (got != mine) f.add(at + ": scatter from " + std::to_string(root));
        }
      }
      // alltoallv: rank r sends q+1 elements to rank q (some of them empty for q = ... none),
      // and receives r+1 from everyone.
      std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
      std::vector<std::int32_t> in,
          out(static_cast<std::size_t>(n) * static_cast<std::size_t>(r + 1), -1);
      for (int q = 0; q < n; ++q) {
        sc[static_cast<std::size_t>(q)] = static_cast<std::size_t>((q + r) % 3);
        rc[static_cast<std::size_t>(q)] = static_cast<std::size_t>((r + q) % 3);
        for (std::size_t k = 0; k < sc[static_cast<std::size_t>(q)]; ++k)
          in.push_back(inproc::a2a_value(r, q, k));
      }
      std::size_t total = 0;
      for (auto x : rc) total += x;
      out.assign(total, -1);
      c.alltoallv(kolo::TensorView(in.data(), in.size(), kolo::DataType::int32), sc,
                  kolo::TensorView(out.data(), out.size(), kolo::DataType::int32), rc);
      std::size_t at_k = 0;
      for (int q = 0; q < n; ++q) {
        for (std::size_t k = 0; k < rc[static_cast<std::size_t>(q)]; ++k, ++at_k) {
          if (out[at_k] != inproc::a2a_value(q, r, k))
            f.add(at + ": alltoallv from " + std::to_string(q));
        }
      }
      c.barrier();
    });
    CHECK_MESSAGE(f.count() == 0, f.text());
  }
}

TEST_CASE("contract: point-to-point over the in-process transport, several messages in flight") {
  for (int n : {2, 3, 6}) {
    CAPTURE(n);
    inproc::Failures f;
    inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      std::vector<std::vector<double>> sent(4), got(4);
      std::vector<inproc::Comm::P2PRequest> reqs;
      for (int k = 0; k < 4; ++k) {
        sent[k].assign(static_cast<std::size_t>(1000 * k + 1), r * 10.0 + k);
        got[k].assign(sent[k].size(), -1);
        reqs.push_back(c.irecv(
            kolo::TensorView(got[k].data(), got[k].size(), kolo::DataType::float64), left, k));
        reqs.push_back(c.isend(
            kolo::TensorView(sent[k].data(), sent[k].size(), kolo::DataType::float64), right, k));
      }
      for (auto& q : reqs) c.wait(q);
      for (int k = 0; k < 4; ++k) {
        for (double v : got[k]) {
          if (v != left * 10.0 + k) {
            f.add("rank " + std::to_string(r) + ": message " + std::to_string(k));
            break;
          }
        }
      }
    });
    CHECK_MESSAGE(f.count() == 0, f.text());
  }
}

TEST_CASE("contract: an error on one rank reaches every rank, as the same error") {
  for (int n : {2, 4, 7}) {
    CAPTURE(n);
    std::vector<std::string> what(static_cast<std::size_t>(n));
    std::vector<int> kind(static_cast<std::size_t>(n), -1);
    inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
      // Rank 1 (or 0) disagrees on the count: a MismatchError, on every rank.
      std::vector<float> v(r == n - 1 ? 999 : 1000, 1.0f);
      try {
        c.allreduce(v);
      } catch (const kolo::MismatchError& e) {
        what[static_cast<std::size_t>(r)] = e.what();
        kind[static_cast<std::size_t>(r)] = 1;
      } catch (const kolo::Error& e) {
        what[static_cast<std::size_t>(r)] = e.what();
        kind[static_cast<std::size_t>(r)] = 2;
      }
      // Afterwards every call throws the stored error.
      try {
        c.barrier();
        what[static_cast<std::size_t>(r)] += " | barrier passed";
      } catch (const kolo::MismatchError&) {
      }
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CAPTURE(what[static_cast<std::size_t>(r)]);
      CHECK(kind[static_cast<std::size_t>(r)] == 1);
      CHECK(what[static_cast<std::size_t>(r)].find("barrier passed") == std::string::npos);
    }
  }
  // A local argument error on one rank (a bad root) aborts the others instead of leaving them
  // waiting: every rank throws a ConfigError naming the root (the root of the others' broadcast
  // may finish it first, having sent everything; then its next call throws).
  const int n = 3;
  std::vector<std::string> what(n);
  inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
    std::vector<std::int32_t> v(10, r);
    try {
      c.broadcast(v, r == 2 ? 7 : 0);
      c.barrier();
    } catch (const kolo::ConfigError& e) {
      what[static_cast<std::size_t>(r)] = e.what();
    } catch (const kolo::Error& e) {
      what[static_cast<std::size_t>(r)] = std::string("other error: ") + e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(what[static_cast<std::size_t>(r)]);
    CHECK(what[static_cast<std::size_t>(r)].find("root 7") != std::string::npos);
  }
}

TEST_CASE("contract: a GroupView is a TransportRef over a subset, and groups nest") {
  const int n = 6;
  inproc::Failures f;
  inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
    kolo::TransportRef t(c.transport());
    // Even ranks, then every other of those (0 and 4): an allreduce on each.
    if (r % 2 != 0) return;
    kolo::GroupView evens(t, {0, 2, 4});
    std::vector<std::int32_t> v(5, r + 1);
    kolo::AlgoOptions opt;
    opt.sig.collective = kolo::Collective::user;
    kolo::allreduce_ring(evens, v.data(), v.data(), v.size(), kolo::DataType::int32,
                         kolo::ReduceOp::sum, opt);
    for (auto x : v) {
      if (x != 1 + 3 + 5) f.add("evens: rank " + std::to_string(r) + " got " + std::to_string(x));
    }
    if (r == 2) return;
    kolo::GroupView ends(evens, {0, 2});  // group ranks 0 and 2 of evens: ranks 0 and 4
    if (ends.global(1) != 4)
      f.add("nested group maps group rank 1 to " + std::to_string(ends.global(1)));
    std::vector<std::int32_t> w(3, r);
    kolo::allreduce_halving_doubling(ends, w.data(), w.data(), w.size(), kolo::DataType::int32,
                                     kolo::ReduceOp::max, opt);
    for (auto x : w) {
      if (x != 4) f.add("ends: rank " + std::to_string(r) + " got " + std::to_string(x));
    }
  });
  CHECK_MESSAGE(f.count() == 0, f.text());
}

// The ring allreduce with its allgather interleaved with the last reduce-scatter step
// (AlgoOptions::ring_overlap_lag, what the Communicator sets where every link is TCP): the
// message order changes, the values must not. Small segments cut every block into many
// messages; lags shorter and longer than a block; sum exact in int32, average in float32.
TEST_CASE("contract: ring allreduce with the allgather interleaved, exact on every rank") {
  for (int n : {2, 3, 4, 5}) {
    for (std::size_t lag : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000}}) {
      inproc::Failures f;
      inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
        kolo::TransportRef t(c.transport());
        kolo::AlgoOptions opt;
        opt.sig.collective = kolo::Collective::user;
        opt.segment_bytes = 64;  // 16 elements per message
        opt.ring_overlap_lag = lag;
        for (std::size_t count : {0u, 1u, 7u, 100u, 1001u}) {
          for (bool in_place : {false, true}) {
            const std::string where = "n " + std::to_string(n) + ", lag " + std::to_string(lag) +
                                      ", count " + std::to_string(count) +
                                      (in_place ? ", in place" : "") + ", rank " +
                                      std::to_string(r);
            std::vector<std::int32_t> in(count), out(count, -1);
            for (std::size_t i = 0; i < count; ++i) in[i] = (r + 1) * 1000 + static_cast<int>(i);
            std::int32_t* dst = in_place ? in.data() : out.data();
            kolo::allreduce_ring(t, in.data(), dst, count, kolo::DataType::int32,
                                 kolo::ReduceOp::sum, opt);
            for (std::size_t i = 0; i < count; ++i) {
              const std::int32_t want = 1000 * n * (n + 1) / 2 + n * static_cast<int>(i);
              if (dst[i] != want) {
                f.add("sum, " + where + ": element " + std::to_string(i) + " is " +
                      std::to_string(dst[i]) + ", not " + std::to_string(want));
                break;
              }
            }
            std::vector<float> x(count), y(count, -1.0f);
            for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r + 1 + i % 5);
            float* d = in_place ? x.data() : y.data();
            kolo::allreduce_ring(t, x.data(), d, count, kolo::DataType::float32,
                                 kolo::ReduceOp::average, opt);
            for (std::size_t i = 0; i < count; ++i) {
              // Small integers add exactly in any order; the owner divides the sum once.
              const float sum = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 5));
              if (d[i] != sum / static_cast<float>(n)) {
                f.add("average, " + where + ": element " + std::to_string(i) + " is " +
                      std::to_string(d[i]));
                break;
              }
            }
          }
        }
      });
      CAPTURE(n);
      CAPTURE(lag);
      CHECK_MESSAGE(f.count() == 0, f.text());
    }
  }
}

// The compressed ring (allreduce_ring_wire): the finishing stage's fold leaves each finished
// segment's 16-bit values in a finished slot, and the next stage sends them from there; when no
// slot is free the send compresses the segment again. Few slots (0, 1, 2) force that fallback
// for most segments: the values must be those of the default (kWireFinSlots), bit for bit, and
// sums of small integers exact. 64-byte segments (32 fp16 values) cut blocks into many messages.
TEST_CASE("contract: compressed ring with too few finished slots, same values on every rank") {
  for (const char* wire : {"fp16", "bf16"}) {
    const kolo::CompressionPolicy c = kolo::CompressionPolicy::parse(wire);
    REQUIRE((c.fold != nullptr));
    for (int n : {2, 3, 5}) {
      inproc::Failures f;
      inproc::run_ranks(n, [&](inproc::Comm& comm, int r) {
        kolo::TransportRef t(comm.transport());
        kolo::AlgoOptions opt;
        opt.sig.collective = kolo::Collective::user;
        opt.segment_bytes = 64;
        std::vector<std::byte> scratch;
        kolo::WireSlots ws(c, opt, scratch);
        const std::size_t slots = ws.fin;
        for (std::size_t count : {1u, 100u, 1001u, 5000u}) {
          std::vector<float> in(count);
          for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r + 1 + i % 7);
          for (int divisor : {1, n}) {
            std::vector<float> want(count);
            ws.fin = slots;
            kolo::allreduce_ring_wire_divided(t, in.data(), want.data(), count, divisor, opt, ws);
            for (std::size_t fin : {0u, 1u, 2u}) {
              const std::string where = std::string(wire) + ", n " + std::to_string(n) +
                                        ", count " + std::to_string(count) + ", divisor " +
                                        std::to_string(divisor) + ", " + std::to_string(fin) +
                                        " finished slots, rank " + std::to_string(r);
              std::vector<float> got(count, -1.0f);
              ws.fin = fin;
              kolo::allreduce_ring_wire_divided(t, in.data(), got.data(), count, divisor, opt, ws);
              if (std::memcmp(got.data(), want.data(), count * sizeof(float)) != 0) {
                f.add(where + ": differs from the default's values");
              }
            }
            if (divisor == 1) {
              for (std::size_t i = 0; i < count; ++i) {
                const float sum = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
                if (want[i] != sum) {
                  f.add(std::string(wire) + ", n " + std::to_string(n) + ", count " +
                        std::to_string(count) + ": element " + std::to_string(i) + " is " +
                        std::to_string(want[i]) + ", not " + std::to_string(sum));
                  break;
                }
              }
            }
          }
        }
      });
      CAPTURE(wire);
      CAPTURE(n);
      CHECK_MESSAGE(f.count() == 0, f.text());
    }
  }
}

// allreduce_coalesced refuses tensors that overlap, with the same list that passed before
// unchanged in between: a list equal to the last one checked skips the check (the engine submits
// the same list every step), so a list that differs only in one size must still be checked.
TEST_CASE("contract: allreduce_coalesced refuses overlapping tensors, also after a list passed") {
  using kolo::TensorView;
  for (int n : {1, 2, 3}) {
    for (bool outputs : {true, false}) {
      CAPTURE(n);
      CAPTURE(outputs);
      std::vector<std::string> errors(static_cast<std::size_t>(n));
      inproc::Failures f;
      inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
        // The error of the last call reaches every rank, and may reach a rank that is still in
        // an earlier collective (a faster rank got to the bad call first): every call is inside
        // the try.
        try {
          // Out of address order (the sort runs): the upper half first, then the lower half.
          std::vector<float> in(16), out(16);
          const auto view = [](std::vector<float>& v, std::size_t at, std::size_t k) {
            return TensorView(v.data() + at, k, kolo::DataType::float32);
          };
          for (int step = 0; step < 3; ++step) {
            for (std::size_t i = 0; i < 16; ++i) in[i] = static_cast<float>(r + step + i);
            const std::vector<TensorView> ins{view(in, 8, 8), view(in, 0, 8)};
            const std::vector<TensorView> outs{view(out, 8, 8), view(out, 0, 8)};
            c.allreduce_coalesced(ins, outs, kolo::ReduceOp::sum);
            for (std::size_t i = 0; i < 16; ++i) {
              const float want =
                  static_cast<float>(n * (n - 1) / 2 + n * (step + static_cast<int>(i)));
              if (out[i] != want) {
                f.add("rank " + std::to_string(r) + " step " + std::to_string(step) + ": element " +
                      std::to_string(i));
                break;
              }
            }
          }
          // The same addresses, one size grown by one element: the lower output now runs into
          // the upper one, or (outputs == false) the second input runs into the first tensor's
          // output (out of place, inputs and outputs in one vector).
          if (outputs) {
            const std::vector<TensorView> ins{view(in, 8, 8), view(in, 0, 9)};
            const std::vector<TensorView> outs{view(out, 8, 8), view(out, 0, 9)};
            c.allreduce_coalesced(ins, outs, kolo::ReduceOp::sum);
          } else {
            // First a list that passes: tensor 0 out of place (in[0..4) -> in[8..12)), tensor 1
            // in place (in[4..8)); then tensor 1 grown over tensor 0's output.
            std::vector<TensorView> ins{view(in, 0, 4), view(in, 4, 4)};
            std::vector<TensorView> outs{view(in, 8, 4), view(in, 4, 4)};
            c.allreduce_coalesced(ins, outs, kolo::ReduceOp::sum);
            c.allreduce_coalesced(ins, outs, kolo::ReduceOp::sum);
            ins[1] = view(in, 4, 5);
            outs[1] = view(out, 0, 5);
            c.allreduce_coalesced(ins, outs, kolo::ReduceOp::sum);
          }
          errors[static_cast<std::size_t>(r)] = "no error";
        } catch (const kolo::ConfigError& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        } catch (const kolo::Error& e) {
          errors[static_cast<std::size_t>(r)] = std::string("not a ConfigError: ") + e.what();
        }
      });
      CHECK_MESSAGE(f.count() == 0, f.text());
      for (const std::string& e : errors) {
        CHECK_MESSAGE(e.find(outputs ? "two outputs overlap"
                                     : "the input of tensor 1 overlaps another tensor's output") !=
                          std::string::npos,
                      e);
      }
    }
  }
}
