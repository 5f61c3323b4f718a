// The rooted collectives (reduce, gather, scatter), alltoallv, point-to-point send/recv,
// split() and argument checks (overlap, ranges) — every rank runs these in the same order under
// kolo-run (tests/mp/CMakeLists.txt registers shm and tcp, several rank counts). Exact checks:
// every input is integer-valued.
#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mp_common.hpp"

using kolo::DataType;
using kolo::ReduceOp;
using kolo::TensorView;
using namespace kolo_test;

KOLO_TEST_DEFINE_CONNECT

namespace {

const std::size_t kCounts[] = {0, 1, 7, 1000, 70001};  // 70001: above reduce's tree threshold

std::string what(const char* op, DataType dt, std::size_t count, int root, const char* mode) {
  return std::string(op) + " " + std::string(kolo::dtype_name(dt)) + " x " + std::to_string(count) +
         " root " + std::to_string(root) + " " + mode;
}

// A child communicator of this rank alone... of all ranks, with its own connections: error
// cases abort it, not the communicator the other tests use.
kolo::Communicator<> scratch_comm() {
  auto c = comm().split(0, comm().rank());
  REQUIRE(c.has_value());
  return std::move(*c);
}

}  // namespace

TEST_CASE("reduce: every dtype x op x count x root, in-place and out-of-place") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  for (DataType dt : kolo::all_dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (ReduceOp op : kolo::all_reduce_ops) {
        for (std::size_t count : kCounts) {
          if (count == 70001 && dt != DataType::float32 && dt != DataType::int64) continue;
          const int roots[] = {0, n - 1};
          for (int root : roots) {
            std::vector<T> in(count), out(count, from_double<T>(99));
            for (std::size_t i = 0; i < count; ++i)
              in[i] = from_double<T>(input_value<T>(op, r, i));
            const std::vector<T> original = in;
            c.reduce(TensorView(in.data(), count, dt),
                     r == root ? TensorView(out.data(), count, dt) : TensorView(), op, root);
            std::size_t wrong = 0;
            if (r == root) {
              for (std::size_t i = 0; i < count; ++i)
                wrong += !close(out[i], expected_value<T>(op, n, i), op);
            }
            // the input is left alone on every rank
            wrong += count > 0 && std::memcmp(in.data(), original.data(), count * sizeof(T)) != 0;
            CHECK_MESSAGE(wrong == 0, what("reduce", dt, count, root, "out-of-place"));
            // in place on the root
            c.reduce(TensorView(in.data(), count, dt),
                     r == root ? TensorView(in.data(), count, dt) : TensorView(), op, root);
            wrong = 0;
            if (r == root) {
              for (std::size_t i = 0; i < count; ++i)
                wrong += !close(in[i], expected_value<T>(op, n, i), op);
            }
            CHECK_MESSAGE(wrong == 0, what("reduce", dt, count, root, "in-place"));
          }
        }
      }
    });
  }
}

TEST_CASE("gather and scatter: dtypes x counts x every root, in place on the root too") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  const auto un = static_cast<std::size_t>(n);
  const DataType dtypes[] = {DataType::float32, DataType::int64, DataType::float16,
                             DataType::uint8};
  for (DataType dt : dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      auto value = [](int rank, std::size_t i) {
        return static_cast<double>((static_cast<std::size_t>(rank) * 37 + i) % 100);
      };
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000},
                                std::size_t{1048579}}) {
        if (count == 1048579 && dt != DataType::float32) continue;
        for (int root = 0; root < n; ++root) {
          if (count == 1048579 && root != n - 1) continue;
          // gather
          std::vector<T> in(count), out(r == root ? count * un : 0, from_double<T>(7));
          for (std::size_t i = 0; i < count; ++i) in[i] = from_double<T>(value(r, i));
          c.gather(TensorView(in.data(), count, dt),
                   r == root ? TensorView(out.data(), out.size(), dt) : TensorView(), root);
          std::size_t wrong = 0;
          if (r == root) {
            for (int q = 0; q < n; ++q)
              for (std::size_t i = 0; i < count; ++i)
                wrong += to_double(out[static_cast<std::size_t>(q) * count + i]) != value(q, i);
          }
          CHECK_MESSAGE(wrong == 0, what("gather", dt, count, root, "out-of-place"));
          // scatter the gathered buffer back: every rank gets its own block
          std::vector<T> mine(count, from_double<T>(5));
          c.scatter(r == root ? TensorView(out.data(), out.size(), dt) : TensorView(),
                    TensorView(mine.data(), count, dt), root);
          wrong = 0;
          for (std::size_t i = 0; i < count; ++i) wrong += to_double(mine[i]) != value(r, i);
          CHECK_MESSAGE(wrong == 0, what("scatter", dt, count, root, "out-of-place"));
          // in place on the root: gather with the input in the root's block, scatter with the
          // output there
          if (r == root) {
            std::vector<T> io(count * un, from_double<T>(3));
            std::copy_n(in.data(), count, io.data() + static_cast<std::size_t>(r) * count);
            c.gather(TensorView(io.data() + static_cast<std::size_t>(r) * count, count, dt),
                     TensorView(io.data(), io.size(), dt), root);
            CHECK_MESSAGE((io.empty() || io == out), what("gather", dt, count, root, "in-place"));
            c.scatter(TensorView(io.data(), io.size(), dt),
                      TensorView(io.data() + static_cast<std::size_t>(r) * count, count, dt), root);
            wrong = 0;
            for (std::size_t i = 0; i < count; ++i)
              wrong += to_double(io[static_cast<std::size_t>(r) * count + i]) != value(r, i);
            CHECK_MESSAGE(wrong == 0, what("scatter", dt, count, root, "in-place"));
          } else {
            c.gather(TensorView(in.data(), count, dt), TensorView(), root);
            c.scatter(TensorView(), TensorView(mine.data(), count, dt), root);
            wrong = 0;
            for (std::size_t i = 0; i < count; ++i) wrong += to_double(mine[i]) != value(r, i);
            CHECK_MESSAGE(wrong == 0, what("scatter", dt, count, root, "in-place (peer)"));
          }
        }
      }
    });
  }
}

TEST_CASE("alltoallv: uneven and empty blocks, two dtypes, small and large") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t m : {std::size_t{0}, std::size_t{5}, std::size_t{1000}, std::size_t{300000}}) {
    // rank s sends ((s*3 + d*5 + 1) * 7919) % (m+1) elements to rank d: uneven, some empty
    auto amount = [&](int s, int d) {
      return static_cast<std::size_t>((s * 3 + d * 5 + 1) * 7919) % (m + 1);
    };
    auto value = [](int s, int d, std::size_t k) {
      return static_cast<double>(s * 1000 + d * 10 + static_cast<int>(k % 7));
    };
    std::vector<std::size_t> sc(un), rc(un);
    for (int q = 0; q < n; ++q) {
      sc[static_cast<std::size_t>(q)] = amount(r, q);
      rc[static_cast<std::size_t>(q)] = amount(q, r);
    }
    const std::size_t stotal = std::accumulate(sc.begin(), sc.end(), std::size_t{0});
    const std::size_t rtotal = std::accumulate(rc.begin(), rc.end(), std::size_t{0});
    for (DataType dt : {DataType::int32, DataType::float64}) {
      kolo::visit_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> in(stotal), out(rtotal + 3, from_double<T>(-1));
        std::size_t off = 0;
        for (int q = 0; q < n; ++q)
          for (std::size_t k = 0; k < sc[static_cast<std::size_t>(q)]; ++k)
            in[off++] = from_double<T>(value(r, q, k));
        c.alltoallv(TensorView(in.data(), in.size(), dt), sc,
                    TensorView(out.data(), out.size(), dt), rc);
        std::size_t wrong = 0;
        off = 0;
        for (int q = 0; q < n; ++q)
          for (std::size_t k = 0; k < rc[static_cast<std::size_t>(q)]; ++k)
            wrong += to_double(out[off++]) != value(q, r, k);
        for (std::size_t k = rtotal; k < out.size(); ++k) wrong += to_double(out[k]) != -1;
        CHECK_MESSAGE(wrong == 0, "alltoallv m=" << m << " " << kolo::dtype_name(dt));
      });
    }
  }
}

TEST_CASE("send/recv: a ring of simultaneous exchanges, several messages in flight per peer") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{1048579}}) {
    // Everyone posts its sends before its receives: large messages must not deadlock.
    std::vector<float> a(count), b(count + 1);
    std::vector<float> ra(count, -1), rb(count + 1, -1);
    for (std::size_t i = 0; i < count; ++i) a[i] = static_cast<float>(r * 100000 + i % 1000);
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<float>(-r - static_cast<int>(i % 3));
    auto s1 = c.isend(TensorView(a.data(), a.size(), DataType::float32), next, 7);
    auto s2 = c.isend(TensorView(b.data(), b.size(), DataType::float32), next, 8);
    auto q1 = c.irecv(TensorView(ra.data(), ra.size(), DataType::float32), prev, 7);
    auto q2 = c.irecv(TensorView(rb.data(), rb.size(), DataType::float32), prev, 8);
    // test() until one completes, then wait for the rest
    while (!c.test(q2) && !c.test(q1)) std::this_thread::yield();
    c.wait(q1);
    c.wait(q2);
    c.wait(s1);
    c.wait(s2);
    CHECK(q1.done());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i)
      wrong += ra[i] != static_cast<float>(prev * 100000 + i % 1000);
    for (std::size_t i = 0; i < rb.size(); ++i)
      wrong += rb[i] != static_cast<float>(-prev - static_cast<int>(i % 3));
    CHECK_MESSAGE(wrong == 0, "ring exchange of " << count);
  }
  // blocking forms between rank 0 and the last rank, then a collective still works
  std::array<std::int64_t, 4> x{1, 2, 3, 4};
  if (r == 0) c.send(TensorView(x.data(), 4, DataType::int64), n - 1, 3);
  if (r == n - 1) {
    std::array<std::int64_t, 4> y{};
    c.recv(TensorView(y.data(), 4, DataType::int64), 0, 3);
    CHECK(y == x);
  }
  std::vector<int> one(5, 1);
  c.allreduce(one);
  CHECK(one == std::vector<int>(5, n));
}

namespace {

using CommTransport = std::remove_reference_t<decltype(comm().transport())>;

// A message of `total` int32 elements laid over runs of the given sizes (the last run takes the
// rest), with a gap of 2 elements after each run: the runs as IoPieces (dst and src alike), and
// the elements where each logical index lies.
struct Scattered {
  std::vector<std::int32_t> mem;
  std::vector<kolo::IoPiece> pieces;
  std::vector<std::size_t> where;  // logical index -> index in mem
  Scattered(std::size_t total, std::vector<std::size_t> runs, std::int32_t fill) {
    std::size_t sum = 0;
    for (std::size_t& k : runs) sum += k = std::min(k, total - sum);
    runs.push_back(total - sum);
    mem.assign(total + 2 * runs.size(), fill);
    std::size_t at = 0;
    for (std::size_t k : runs) {
      auto* p = reinterpret_cast<std::byte*>(mem.data() + at);
      pieces.push_back({p, p, k * sizeof(std::int32_t)});
      for (std::size_t i = 0; i < k; ++i) where.push_back(at + i);
      at += k + 2;
    }
  }
};

}  // namespace

TEST_CASE("vectored messages: pieces meet plain messages and pieces of other cuts, exactly") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  if constexpr (kolo::VectoredP2P<CommTransport>) {
    if (n == 1) return;
    auto& t = c.transport();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    auto value = [](int rank, std::size_t i) {
      return static_cast<std::int32_t>(rank * 1000003 + static_cast<int>(i % 100000));
    };
    std::uint64_t seq = 0;
    auto sig = [&](std::size_t bytes) {
      kolo::Signature g;
      g.collective = kolo::Collective::send_recv;
      g.dtype = DataType::int32;
      g.count = bytes;
      g.seq = ++seq;
      g.extra = 0x7665637475726564ull;  // "vectured"
      return g;
    };
    const kolo::Deadline dl = kolo::Deadline::after(60);
    const kolo::ReduceSpec rs{kolo::reduce_function(DataType::int32, ReduceOp::sum),
                              sizeof(std::int32_t)};
    for (std::size_t total : {std::size_t{0}, std::size_t{9}, std::size_t{200003}}) {
      const std::size_t bytes = total * sizeof(std::int32_t);
      // The sender's cut and the receiver's differ; both have empty runs.
      Scattered out_v(total, {0, 1, 5, 0, 1000, 70000, 3}, 0);
      for (std::size_t i = 0; i < total; ++i) out_v.mem[out_v.where[i]] = value(r, i);
      std::vector<std::int32_t> out_plain(total);
      for (std::size_t i = 0; i < total; ++i) out_plain[i] = value(r, i);
      Scattered in_v(total, {7, 0, 2, 40000, 0}, -5);
      std::vector<std::int32_t> in_plain(total, -5);
      // Reduce: dst pieces in one buffer, the local operand's in another, another cut again.
      Scattered red_dst(total, {3, 65536, 0, 11}, -7), red_src(total, {3, 65536, 0, 11}, 0);
      for (std::size_t i = 0; i < total; ++i) red_src.mem[red_src.where[i]] = 1;
      std::vector<kolo::IoPiece> red(red_dst.pieces.size());
      for (std::size_t k = 0; k < red.size(); ++k) {
        red[k] = {red_dst.pieces[k].dst, red_src.pieces[k].src, red_dst.pieces[k].bytes};
      }
      // 1. pieces -> plain; 2. plain -> pieces; 3. pieces -> pieces, folded into a sum.
      const auto g1 = sig(bytes), g2 = sig(bytes), g3 = sig(bytes);
      auto s1 = t.isendv(next, out_v.pieces.data(), out_v.pieces.size(), bytes, g1);
      auto s2 = t.isend(next, out_plain.data(), bytes, g2);
      auto s3 = t.isendv(next, out_v.pieces.data(), out_v.pieces.size(), bytes, g3);
      auto q1 = t.irecv(prev, in_plain.data(), bytes, g1);
      auto q2 = t.irecvv(prev, in_v.pieces.data(), in_v.pieces.size(), bytes, g2);
      auto q3 = t.irecv_reducev(prev, red.data(), red.size(), bytes, rs, g3);
      for (auto q : {q1, q2, q3, s1, s2, s3}) t.wait(q, dl);
      std::size_t wrong1 = 0, wrong2 = 0, wrong3 = 0, gaps = 0;
      for (std::size_t i = 0; i < total; ++i) {
        wrong1 += in_plain[i] != value(prev, i);
        wrong2 += in_v.mem[in_v.where[i]] != value(prev, i);
        wrong3 += red_dst.mem[red_dst.where[i]] != value(prev, i) + 1;
      }
      std::vector<char> is_data(in_v.mem.size(), 0);
      for (std::size_t i : in_v.where) is_data[i] = 1;
      for (std::size_t i = 0; i < in_v.mem.size(); ++i) gaps += !is_data[i] && in_v.mem[i] != -5;
      CHECK_MESSAGE(wrong1 == 0, "pieces -> plain, " << total << " elements");
      CHECK_MESSAGE(wrong2 == 0, "plain -> pieces, " << total << " elements");
      CHECK_MESSAGE(wrong3 == 0, "pieces -> reducing pieces, " << total << " elements");
      CHECK_MESSAGE(gaps == 0, "a receive wrote outside its pieces");
    }
    std::vector<int> one(3, 1);
    c.allreduce(one);
    CHECK(one == std::vector<int>(3, n));
  }
}

TEST_CASE("vectored messages: pieces that do not add up to the message are an Error, everywhere") {
  if constexpr (kolo::VectoredP2P<CommTransport>) {
    if (comm().size() == 1) return;
    // A communicator of its own: the error aborts it (and only it). Rank 0 posts the bad send;
    // the others learn of it in their barrier (or, if it comes that early, in their setup).
    std::vector<std::int32_t> v(8);
    auto* p = reinterpret_cast<std::byte*>(v.data());
    const kolo::IoPiece pieces[] = {{p, p, 8}, {p + 8, p + 8, 4}};
    kolo::Signature g;
    g.collective = kolo::Collective::send_recv;
    g.seq = 1;
    std::string what;
    std::optional<kolo::Communicator<>> own;
    try {
      own.emplace(kolo::Topology::from_env());
      if (own->rank() == 0) {
        own->transport().isendv(1, pieces, 2, 32, g);
      } else {
        own->barrier();
      }
    } catch (const kolo::Error& e) {
      what = e.what();
    }
    CHECK_MESSAGE(
        what.find("isendv: the pieces hold 12 bytes for a message of 32") != std::string::npos,
        what);
  }
}

TEST_CASE("split: colors, keys in reverse, undefined color, nesting, independence") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  // two groups by parity, ranked in reverse order
  auto half = c.split(r % 2, -r);
  REQUIRE(half.has_value());
  std::vector<int> members;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) members.push_back(q);
  CHECK(half->size() == static_cast<int>(members.size()));
  CHECK(members[static_cast<std::size_t>(half->rank())] == r);
  std::vector<std::int64_t> v(3, r);
  half->allreduce(v, ReduceOp::sum);
  const std::int64_t want = std::accumulate(members.begin(), members.end(), std::int64_t{0});
  CHECK(v == std::vector<std::int64_t>(3, want));
  // the parent still works, and the two interleave in any order
  std::vector<double> w(2, 1.0);
  c.allreduce(w);
  CHECK(w[0] == n);
  // rank 0 joins nothing; the rest form one group
  auto rest = c.split(r == 0 ? kolo::kUndefinedColor : 5, r);
  CHECK(rest.has_value() == (r != 0));
  if (rest) {
    CHECK(rest->size() == n - 1);
    CHECK(rest->rank() == r - 1);
    std::vector<int> one(1, 1);
    rest->allreduce(one);
    CHECK(one[0] == n - 1);
    // nested: split the child again
    auto inner = rest->split(rest->rank() % 2, 0);
    REQUIRE(inner.has_value());
    std::vector<int> k(1, 1);
    inner->allreduce(k);
    CHECK(k[0] == (rest->size() + 1 - rest->rank() % 2) / 2);
  }
  // a bad color is refused on every rank, naming the rank
  auto s = scratch_comm();
  try {
    (void)s.split(r == n - 1 ? -7 : 0, 0);
    FAIL("a color of -7 was accepted");
  } catch (const kolo::ConfigError& e) {
    CHECK(std::string(e.what()).find("rank " + std::to_string(n - 1) + " passed color -7") !=
          std::string::npos);
  }
}

// Runs `op` on a fresh child communicator, then a barrier on it: every rank must see an error,
// from the operation itself or at the latest from the barrier (ranks that took no part in a
// failed exchange, e.g. in alltoallv, may finish the operation first). A slow rank may even
// get the error while its child communicator is still being built: the construction is a
// collective of the child too. Returns the message.
template <class Op>
std::string error_of(Op&& op) {
  try {
    auto s = scratch_comm();
    op(s);
    s.barrier();
  } catch (const kolo::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_CASE("errors reach every rank and fail only their group") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const auto un = static_cast<std::size_t>(n);
  // mismatched alltoallv counts: rank 0 sends one element more to rank 1 than rank 1 expects
  std::string e = error_of([&](kolo::Communicator<>& s) {
    std::vector<std::size_t> sc(un, 2), rc(un, 2);
    if (r == 0) sc[1] = 3;
    std::vector<float> in(2 * un + 1, 1.0f), out(2 * un, 0.0f);
    s.alltoallv(TensorView(in.data(), in.size(), DataType::float32), sc,
                TensorView(out.data(), out.size(), DataType::float32), rc);
  });
  CHECK_MESSAGE(e.find("alltoallv") != std::string::npos, e);
  // a recv with another tag than the send
  e = error_of([&](kolo::Communicator<>& s) {
    std::vector<float> buf(4, 1.0f);
    if (r == 0) s.send(TensorView(buf.data(), 4, DataType::float32), 1, 1);
    if (r == 1) s.recv(TensorView(buf.data(), 4, DataType::float32), 0, 2);
  });
  CHECK_MESSAGE(e.find("tag") != std::string::npos, e);
  // overlapping buffers: a ConfigError naming both ranges
  e = error_of([&](kolo::Communicator<>& s) {
    std::vector<float> buf(100, 1.0f);
    s.allreduce(TensorView(buf.data(), 60, DataType::float32),
                TensorView(buf.data() + 10, 60, DataType::float32), ReduceOp::sum);
  });
  CHECK_MESSAGE(e.find("overlap") != std::string::npos, e);
  // a bad root, a bad peer
  e = error_of([&](kolo::Communicator<>& s) {
    std::vector<float> buf(4, 1.0f);
    s.reduce(buf, ReduceOp::sum, n);
  });
  CHECK_MESSAGE(e.find("root " + std::to_string(n)) != std::string::npos, e);
  e = error_of([&](kolo::Communicator<>& s) {
    std::vector<float> buf(4, 1.0f);
    s.send(TensorView(buf.data(), 4, DataType::float32), r);
  });
  CHECK_MESSAGE(e.find("is this rank") != std::string::npos, e);
  // the communicator of the other tests is untouched
  std::vector<int> one(1, 1);
  c.allreduce(one);
  CHECK(one[0] == n);
}

TEST_CASE("interrupt: another thread fails the running operation, here and on the peers") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  // Ranks 0 and 1 wait for messages nobody sends; a second thread of rank 0 interrupts its
  // wait. Rank 0 must fail with the reason, and kolo's abort must end rank 1's wait (and the
  // others' barrier) with it: the thread-safe stop that kolo_torch's abort() uses.
  const std::string e = error_of([&](kolo::Communicator<>& s) {
    std::vector<float> buf(16, 0.0f);
    const TensorView v(buf.data(), buf.size(), DataType::float32);
    if (r == 0) {
      std::thread t([&s] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        s.transport().interrupt("interrupted from another thread");
      });
      struct Join {
        std::thread& t;
        ~Join() { t.join(); }
      } join{t};
      s.recv(v, 1);
    } else if (r == 1) {
      s.recv(v, 0);
    }
  });
  CHECK_MESSAGE(e.find("interrupted from another thread") != std::string::npos, e);
  std::vector<int> one(1, 1);
  c.allreduce(one);  // the parent communicator is untouched
  CHECK(one[0] == n);
}

TEST_CASE("collectives take any contiguous range of a kolo element type") {
  auto& c = comm();
  const int n = c.size();
  std::vector<float> v(10, 1.0f);
  c.allreduce(v);
  CHECK(v[9] == static_cast<float>(n));
  std::array<std::int32_t, 3> a{1, 2, 3};
  c.allreduce(a, ReduceOp::max);
  CHECK(a == std::array<std::int32_t, 3>{1, 2, 3});
  std::vector<double> b(4, static_cast<double>(c.rank()));
  c.broadcast(b, n - 1);
  CHECK(b[0] == n - 1);
  static_assert(kolo::ContiguousBuffer<std::vector<float>&>);
  static_assert(kolo::ContiguousBuffer<std::span<const kolo::bfloat16>>);
  static_assert(!kolo::ContiguousBuffer<std::vector<std::string>&>);
  static_assert(!kolo::ContiguousBuffer<std::vector<bool>&>);
}

namespace {

// A communicator over the named transport type, built through its factory (T::connect) from
// the environment, as README's Communicator<ShmTransport> is: a collective, exact, and the
// routes it reports.
template <class T>
void typed_transport(kolo::Route expect_route) {
  kolo::Communicator<T> t(kolo::Topology::from_env());
  const int n = t.size();
  CHECK(n == comm().size());
  std::vector<std::int64_t> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = (t.rank() + 1) * static_cast<std::int64_t>(i);
  t.allreduce(v);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<std::int64_t>(n * (n + 1) / 2) * static_cast<std::int64_t>(i)) {
      FAIL_CHECK("element " << i << " is " << v[i]);
      break;
    }
  }
  if (n > 1) CHECK(t.transport().route_between(0, 1) == expect_route);
  t.barrier();
}

}  // namespace

TEST_CASE("typed transports: Communicator<ShmTransport>, <TcpTransport>, <RoutedTransport>") {
  // Every rank is on this host: the routed transport takes shared memory too.
  typed_transport<kolo::ShmTransport>(kolo::Route::shm);
  typed_transport<kolo::TcpTransport>(kolo::Route::tcp);
  typed_transport<kolo::RoutedTransport>(kolo::Route::shm);
}
