// contract_cpp.cpp — the error contract on the C++ Communicator, under kolo-run: a call refused
// on one rank right after a collective completed there fails that same call on every rank with
// the same kind of error, naming that rank, and every call before it completes with the right
// values on every rank (docs/reliability.md, "The error contract").
//
//   contract_cpp TRIALS SEED
//
// Built with KOLO_CONTRACT_MPI (tests/mpi), the same trials run under mpirun on MpiTransport
// (kolo's algorithms over MPI point-to-point), one transport over MPI_COMM_WORLD per trial.
//
// Each trial builds a Communicator<> from the environment, runs 0-4 good collectives whose
// values it checks, and then one rank (drawn from the seed, the same draw on every rank) gets the
// next call wrong: overlapping buffers, a root out of range, an output of the wrong size, a count
// that differs from the others' (a mismatch the others detect), or a refusal by a layer above
// (Communicator::refuse, as the C ABI and kolo_torch use it). The last good call is often a
// large broadcast rooted at that rank, which returns there while the others still copy. Every
// rank prints "KOLO_CONTRACT_PASS rank=R" when all its trials held.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <kolo/kolo.hpp>
#if defined(KOLO_CONTRACT_MPI)
#include <kolo/transport/mpi.hpp>
#endif

namespace {

#if defined(KOLO_CONTRACT_MPI)
using Comm = kolo::Communicator<kolo::MpiTransport>;
Comm make_comm() {
  return Comm(std::make_unique<kolo::MpiTransport>(MPI_COMM_WORLD));
}
#else
using Comm = kolo::Communicator<>;
Comm make_comm() {
  return Comm::from_env();
}
#endif

enum class Kind { overlap, bad_root, bad_count, mismatch, refused, count };
const char* const kKindNames[] = {"overlap", "bad root", "bad count", "mismatch", "refuse()"};

int g_failures = 0;

void fail(int rank, int trial, const std::string& what) {
  std::fprintf(stderr, "contract_cpp: rank %d, trial %d: %s\n", rank, trial, what.c_str());
  ++g_failures;
}

// One good collective; false (after fail) when it did not hold.
bool good_call(Comm& comm, std::mt19937_64& rng, int trial, int refuser, bool last) {
  const int r = comm.rank(), n = comm.size();
  const int which = last ? 0 : static_cast<int>(rng() % 3);
  const std::size_t count = 1 + rng() % (last ? (1u << 18) : 4096u);
  try {
    if (which == 0) {  // from the rank that will get its next call wrong: it returns first
      std::vector<std::int32_t> v(count, -1);
      if (r == refuser) {
        for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<std::int32_t>(i * 3) + trial;
      }
      comm.broadcast(std::span<std::int32_t>(v), refuser);
      for (std::size_t i = 0; i < count; ++i) {
        if (v[i] != static_cast<std::int32_t>(i * 3) + trial) {
          fail(r, trial, "a good broadcast delivered a wrong value");
          return false;
        }
      }
    } else if (which == 1) {
      std::vector<std::int64_t> v(count);
      for (std::size_t i = 0; i < count; ++i) v[i] = r + static_cast<std::int64_t>(i % 50);
      comm.allreduce(std::span<std::int64_t>(v));
      for (std::size_t i = 0; i < count; ++i) {
        if (v[i] != n * (n - 1) / 2 + n * static_cast<std::int64_t>(i % 50)) {
          fail(r, trial, "a good allreduce returned a wrong sum");
          return false;
        }
      }
    } else {
      comm.barrier();
    }
  } catch (const kolo::Error& e) {
    fail(r, trial, std::string("a good call failed: ") + e.what());
    return false;
  }
  return true;
}

// The wrong call (on the refusing rank) or the matching good one (on the others).
void last_call(Comm& comm, Kind k, bool refusing) {
  const std::size_t n = 64;
  std::vector<float> a(n * static_cast<std::size_t>(comm.size()) + 8, 1.0f);
  std::vector<float> b(a.size(), 0.0f);
  switch (k) {
    case Kind::overlap:
      comm.allreduce(
          kolo::TensorView(a.data(), n, kolo::DataType::float32),
          kolo::TensorView(refusing ? a.data() + 1 : b.data(), n, kolo::DataType::float32));
      break;
    case Kind::bad_root:
      comm.broadcast(std::span<float>(a.data(), n), refusing ? comm.size() + 2 : 0);
      break;
    case Kind::bad_count: {
      const std::size_t out = n * static_cast<std::size_t>(comm.size()) - (refusing ? 1 : 0);
      comm.allgather(kolo::TensorView(a.data(), n, kolo::DataType::float32),
                     kolo::TensorView(b.data(), out, kolo::DataType::float32));
      break;
    }
    case Kind::mismatch:
      comm.allreduce(std::span<float>(a.data(), refusing ? n + 3 : n));
      break;
    case Kind::refused:
      if (refusing) {
        const kolo::ConfigError e("a layer above refused this call's arguments on rank " +
                                  std::to_string(comm.rank()));
        comm.refuse(e);
        throw e;
      }
      comm.allreduce(std::span<float>(a.data(), n));
      break;
    case Kind::count:
      break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: contract_cpp TRIALS SEED\n");
    return 2;
  }
  const int trials = std::atoi(argv[1]);
  const auto seed = std::strtoull(argv[2], nullptr, 10);
  int rank = -1;
  int per_kind[static_cast<int>(Kind::count)] = {};
  double slowest = 0;
  for (int t = 0; t < trials && g_failures == 0; ++t) {
    auto comm = make_comm();
    rank = comm.rank();
    const double deadline = comm.transport().timeout_seconds();
    std::mt19937_64 rng(seed * 1000003u + static_cast<unsigned>(t));
    const int refuser = static_cast<int>(rng() % static_cast<unsigned>(comm.size()));
    const auto k = static_cast<Kind>(rng() % static_cast<unsigned>(Kind::count));
    const int pre = static_cast<int>(rng() % 5);  // 0: right after the constructor
    bool ok = true;
    for (int i = 0; i < pre && ok; ++i) ok = good_call(comm, rng, t, refuser, i == pre - 1);
    if (!ok) break;
    ++per_kind[static_cast<int>(k)];
    const std::string name = kKindNames[static_cast<int>(k)];
    const auto began = std::chrono::steady_clock::now();
    const kolo::ErrorKind want =
        k == Kind::mismatch ? kolo::ErrorKind::mismatch : kolo::ErrorKind::config;
    try {
      last_call(comm, k, rank == refuser);
      fail(rank, t,
           "the wrong call (" + name + " on rank " + std::to_string(refuser) + ") succeeded here");
    } catch (const kolo::Error& e) {
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      slowest = std::max(slowest, took);
      const std::string tag = "[reported by rank " + std::to_string(refuser) + "]";
      const std::string what = e.what();
      if (e.kind() != want) {
        fail(rank, t, "the wrong call (" + name + ") failed with the wrong kind: " + what);
      } else if (k != Kind::mismatch && rank != refuser && what.find(tag) == std::string::npos) {
        fail(
            rank, t,
            "the error (" + name + ") does not name rank " + std::to_string(refuser) + ": " + what);
      } else if (took > deadline / 10) {
        fail(rank, t, "the wrong call (" + name + ") took " + std::to_string(took) + " s");
      }
    }
    // The communicator stays failed: the next call throws at once.
    try {
      comm.barrier();
      fail(rank, t, "a barrier after the failure succeeded");
    } catch (const kolo::Error&) {
    }
  }
  if (g_failures > 0) return 1;
  std::printf(
      "KOLO_CONTRACT_PASS rank=%d trials=%d (overlap %d, root %d, count %d, mismatch %d, "
      "refuse %d) slowest wrong call %.1f ms\n",
      rank, trials, per_kind[0], per_kind[1], per_kind[2], per_kind[3], per_kind[4], slowest * 1e3);
  return 0;
}
