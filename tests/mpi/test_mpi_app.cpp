// kolo inside an application that owns MPI (run by every rank under mpirun -np 3 and 4): the
// application calls MPI_Init_thread and MPI_Finalize itself, builds kolo communicators on
// MPI_COMM_WORLD and on its own sub-communicators, and keeps using MPI around them.
//
// Checked here: the topology MPI gives; that kolo neither initialises nor finalizes an MPI it did
// not start, and that the application's MPI_Finalize closes a transport still alive; that the
// application's own messages (any tag, MPI_COMM_WORLD) and kolo's never meet; sub-communicators
// (two halves working at once, exact results); and the error paths: a mismatch named on both
// sides on every rank, a local argument error reaching every rank, a rank that never comes
// (TimeoutError in bounded time, and the error reaching it later), a rank that leaves
// (PeerLostError at once), and a fresh communicator working after an aborted one.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>
#include "../doctest_ran_nothing.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <kolo/communicator.hpp>
#include <kolo/transport/mpi.hpp>

using kolo::DataType;
using kolo::MpiNativeTransport;
using kolo::MpiTransport;
using kolo::TensorView;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

template <class T>
std::unique_ptr<kolo::Communicator<T>> make(MPI_Comm comm, double timeout_seconds = 30) {
  kolo::MpiOptions o = kolo::MpiOptions::from_env();
  o.timeout_seconds = timeout_seconds;
  return std::make_unique<kolo::Communicator<T>>(std::make_unique<T>(comm, o));
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Alive until after the application's MPI_Finalize (see main).
std::unique_ptr<kolo::Communicator<MpiNativeTransport>> g_outlives_finalize;

}  // namespace

TEST_CASE("topology comes from MPI; kolo leaves MPI's lifetime to the application") {
  const int wr = world_rank(), ws = world_size();
  auto c = make<MpiTransport>(MPI_COMM_WORLD);
  CHECK(c->rank() == wr);
  CHECK(c->size() == ws);

  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(static_cast<std::size_t>(ws) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  bool one_host = true;
  for (int q = 0; q < ws; ++q) {
    one_host = one_host && std::strcmp(names.data() + q * MPI_MAX_PROCESSOR_NAME, name) == 0;
  }
  CHECK(c->topology().host_key == std::string(name, static_cast<std::size_t>(len)));
  if (one_host) {  // the tests run on one machine: one host, every rank local
    CHECK(c->local_size() == ws);
    CHECK(c->local_rank() == wr);
    CHECK(c->cross_size() == 1);
    CHECK(c->cross_rank() == 0);
  }
  CHECK(c->topology().timeout_seconds == 30);

  CHECK_FALSE(MpiTransport::kolo_initialized_mpi());
  int level = 0;
  MPI_Query_thread(&level);
  CHECK(c->transport().thread_level() == level);
  // kolo talks on a duplicate: same group, different context.
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(c->transport().comm(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT);
}

TEST_CASE_TEMPLATE("the application's own MPI traffic and kolo's never meet", T, MpiTransport,
                   MpiNativeTransport) {
  const int r = world_rank(), n = world_size();
  auto c = make<T>(MPI_COMM_WORLD);
  // The application has a wildcard receive posted on MPI_COMM_WORLD during kolo's collectives:
  // it must receive the application's message, and kolo nothing of the application's.
  std::vector<int> app_in(4, -1), app_out = {r, r * 10, r * 100, r * 1000};
  MPI_Request reqs[2];
  MPI_Irecv(app_in.data(), 4, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &reqs[0]);
  // Errors are caught here, not thrown out of the case: the wildcard receive must be completed
  // below whatever happens, or it would match a later case's message into a freed vector.
  for (std::size_t count : {std::size_t{10}, std::size_t{5000}, std::size_t{300000}}) {
    std::vector<double> v(count, r + 1.0);
    try {
      c->allreduce(std::span<double>(v));
    } catch (const kolo::Error& e) {
      FAIL_CHECK("count " << count << ": " << e.what());
    }
    std::size_t wrong = 0;
    for (double x : v) wrong += x != n * (n + 1) / 2.0;
    CHECK_MESSAGE(wrong == 0, "count " << count);
  }
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  MPI_Isend(app_out.data(), 4, MPI_INT, right, 7, MPI_COMM_WORLD, &reqs[1]);
  MPI_Status st[2];
  MPI_Waitall(2, reqs, st);
  CHECK(st[0].MPI_SOURCE == left);
  CHECK(st[0].MPI_TAG == 7);
  CHECK(app_in == std::vector<int>{left, left * 10, left * 100, left * 1000});
}

TEST_CASE("sub-communicators: two halves at work at once, both policies, exact results") {
  const int wr = world_rank(), ws = world_size();
  const int color = wr < ws / 2 ? 0 : 1;  // np 3: halves of 1 and 2 ranks; np 4: 2 and 2
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, wr, &half);
  const int first = color == 0 ? 0 : ws / 2;  // world rank of the half's rank 0
  const int hs = color == 0 ? ws / 2 : ws - ws / 2;
  {
    auto p2p = make<MpiTransport>(half);
    auto nat = make<MpiNativeTransport>(half);
    CHECK(p2p->size() == hs);
    CHECK(p2p->rank() == wr - first);
    CHECK(nat->size() == hs);
    CHECK(p2p->local_size() == hs);
    // Different work, different numbers of collectives, in each half at the same time.
    const int rounds = color == 0 ? 5 : 3;
    for (int k = 0; k < rounds; ++k) {
      if (color == 0) {
        const std::size_t count = 1000 + static_cast<std::size_t>(k) * 40000;
        std::vector<std::int64_t> a(count), b(count);
        for (std::size_t i = 0; i < count; ++i) {
          a[i] = wr * 1000 + static_cast<std::int64_t>(i);
          b[i] = a[i];
        }
        p2p->allreduce(std::span<std::int64_t>(a));
        nat->allreduce(std::span<std::int64_t>(b));
        std::int64_t ranks = 0;
        for (int q = first; q < first + hs; ++q) ranks += q * 1000;
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const std::int64_t want = ranks + hs * static_cast<std::int64_t>(i);
          wrong += (a[i] != want) + (b[i] != want);
        }
        CHECK_MESSAGE(wrong == 0, "half 0 round " << k);
      } else {
        std::vector<float> mine(7, static_cast<float>(wr)), all(7 * static_cast<std::size_t>(hs));
        p2p->allgather(TensorView(mine.data(), 7, DataType::float32),
                       TensorView(all.data(), all.size(), DataType::float32));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < all.size(); ++i) {
          wrong += all[i] != static_cast<float>(first + static_cast<int>(i / 7));
        }
        std::vector<std::int32_t> b(100000, wr == first + hs - 1 ? 42 + k : -1);
        nat->broadcast(std::span<std::int32_t>(b), hs - 1);
        for (auto x : b) wrong += x != 42 + k;
        CHECK_MESSAGE(wrong == 0, "half 1 round " << k);
      }
    }
  }
  MPI_Comm_free(&half);
  // The world still works after the halves are gone.
  auto w = make<MpiNativeTransport>(MPI_COMM_WORLD);
  std::vector<std::int32_t> v(3, 1);
  w->allreduce(std::span<std::int32_t>(v));
  CHECK(v[2] == ws);
}

TEST_CASE_TEMPLATE("a mismatch is a MismatchError on every rank naming both sides", T, MpiTransport,
                   MpiNativeTransport) {
  const int r = world_rank(), n = world_size();
  auto c = make<T>(MPI_COMM_WORLD);
  for (std::size_t base : {std::size_t{1000}, std::size_t{100000}}) {  // inline and large
    // Nobody starts the failing call while another rank still finishes the previous one: the
    // abort would reach that rank there (rightly: the communicator is dead for everyone).
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<float> v(r == 1 ? base - 1 : base, 1.0f);
    std::string what;
    try {
      c->allreduce(std::span<float>(v));
    } catch (const kolo::MismatchError& e) {
      what = e.what();
    }
    CHECK_MESSAGE(contains(what, std::to_string(base - 1) + " x float32"),
                  "rank " << r << ": " << what);
    CHECK_MESSAGE(contains(what, std::to_string(base) + " x float32"),
                  "rank " << r << ": " << what);
    // After an error the communicator refuses work with the same error, on every rank.
    std::vector<float> w(4, 1.0f);
    CHECK_THROWS_AS(c->allreduce(std::span<float>(w)), kolo::MismatchError);
    // A fresh communicator works: nothing stale of the aborted one reaches it.
    c = make<T>(MPI_COMM_WORLD);
    std::vector<float> x(base, 1.0f);
    try {
      c->allreduce(std::span<float>(x));
    } catch (const kolo::Error& e) {
      FAIL_CHECK("fresh communicator: " << e.what());
    }
    std::size_t wrong = 0;
    for (float f : x) wrong += f != static_cast<float>(n);
    CHECK(wrong == 0);
  }
}

TEST_CASE_TEMPLATE("an argument error on one rank reaches every rank", T, MpiTransport,
                   MpiNativeTransport) {
  const int r = world_rank();
  MPI_Barrier(MPI_COMM_WORLD);
  auto c = make<T>(MPI_COMM_WORLD);
  std::vector<float> in(100, 1.0f), out(r == 1 ? 50 : 100);
  std::string what;
  try {
    c->allreduce(TensorView(in.data(), in.size(), DataType::float32),
                 TensorView(out.data(), out.size(), DataType::float32));
  } catch (const kolo::ConfigError& e) {
    what = e.what();
  }
  CHECK_MESSAGE(contains(what, "input has 100 elements but output has 50"), "rank " << r);
  if (r != 1) CHECK_MESSAGE(contains(what, "[reported by rank 1]"), what);
}

TEST_CASE_TEMPLATE("a rank that never comes: TimeoutError in bounded time, and later on it too", T,
                   MpiTransport, MpiNativeTransport) {
  const int r = world_rank();
  // Everyone arrives together: the 1 s deadline also bounds building the communicator.
  MPI_Barrier(MPI_COMM_WORLD);
  auto c = make<T>(MPI_COMM_WORLD, 1.0);
  std::vector<float> v(20000, 1.0f);
  std::string what;
  if (r == 1) {
    ::usleep(2500000);  // misses the allreduce; the others give up after 1 s
    try {
      c->barrier();
    } catch (const kolo::TimeoutError& e) {
      what = e.what();
    }
    CHECK_MESSAGE(contains(what, "[reported by rank"), what);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c->allreduce(std::span<float>(v));
    } catch (const kolo::TimeoutError& e) {
      what = e.what();
    }
    const double s = since(t0);
    CHECK_MESSAGE(contains(what, "timed out in allreduce #1"), what);
    CHECK(s >= 0.9);
    CHECK(s < 8.0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE_TEMPLATE("a rank that leaves while the others wait: PeerLostError at once", T,
                   MpiTransport, MpiNativeTransport) {
  const int r = world_rank();
  auto c = make<T>(MPI_COMM_WORLD, 60);
  std::vector<float> v(20000, 1.0f);
  c->allreduce(std::span<float>(v));
  MPI_Barrier(MPI_COMM_WORLD);  // everyone is done with the first allreduce
  if (r == 1) {
    c.reset();  // leaves: its peers are told how far it got
  } else {
    std::string what;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c->allreduce(std::span<float>(v));
    } catch (const kolo::PeerLostError& e) {
      what = e.what();
    }
    CHECK_MESSAGE(contains(what, "rank 1 left during allreduce #2"), what);
    CHECK(since(t0) < 10.0);  // not the 60 s deadline
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a rank that leaves after the last collective troubles nobody") {
  const int r = world_rank(), n = world_size();
  auto c = make<MpiTransport>(MPI_COMM_WORLD, 60);
  // Ranks finish the ring at different moments; the first to leave must not fail the others.
  for (int k = 0; k < 20; ++k) {
    std::vector<std::int32_t> v(70000 + k, 1);
    c->allreduce(std::span<std::int32_t>(v));
    std::size_t wrong = 0;
    for (auto x : v) wrong += x != n;
    CHECK(wrong == 0);
    if (k == 19 && r == 0) c.reset();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  c.reset();
}

TEST_CASE("a communicator still alive at the application's MPI_Finalize") {
  g_outlives_finalize = make<MpiNativeTransport>(MPI_COMM_WORLD);
  std::vector<float> v(8, 2.0f);
  g_outlives_finalize->allreduce(std::span<float>(v), kolo::ReduceOp::average);
  CHECK(v[7] == 2.0f);
}

int main(int argc, char** argv) {
  // The application owns MPI; it asks for less than kolo would.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  doctest::Context ctx;
  ctx.setOption("order-by", "file");
  ctx.applyCommandLine(argc, argv);
  int rc = kolo_test::ran_nothing_exit_code(ctx.run(), argv[0]);
  // MPI_Finalize closes g_outlives_finalize's transport (kolo's MPI_COMM_SELF hook); its
  // destructor at exit then has nothing left to do and must not touch MPI.
  MPI_Finalize();
  if (MpiTransport::kolo_initialized_mpi()) rc = 5;
  return rc;
}
