// claims_worker — the rank program of tests/claims: checks documented promises that no other test
// checked, one mode per run under kolo-run (the Communicator is unusable after an error, so each
// fault needs its own job).
//
//   mismatch-op    rank 1 calls allreduce with max, the others with sum
//   mismatch-root  rank 1 calls broadcast with root 1, the others with root 0
//     every rank must get a MismatchError naming both sides (docs/api.md "Rules every call
//     follows"), and then a later call on the same Communicator must throw a kolo::Error (the
//     communicator is unusable after an error) well before the deadline, not hang or succeed.
//     Each rank prints "CLAIMS_OK rank=R" once everything held and exits 0.
//
//   clean | kill | abort | timeout | late-connect | unreachable   (tests/claims/shm_leaks.sh:
//     nothing may be left in /dev/shm afterwards) — one good allreduce, then rank 1 does the
//     fault: SIGKILL, std::abort(), arrives after the others' deadline, or (late-connect) starts
//     connecting after it; unreachable: rank 0 advertises an address that answers nothing, so
//     the set-up fails between creating the segments and removing their names. Every rank that
//     catches a kolo::Error prints "CLAIMS_FAULT rank=R kind=K what=...", and one that returns
//     normally "CLAIMS_OK rank=R".
//
// Exit codes: 0 everything held, 3 a fault mode's expected kolo::Error, 4 a check failed.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <kolo/kolo.hpp>

namespace {

using Comm = kolo::Communicator<>;

std::string rank_label = [] {
  const char* r = std::getenv("KOLO_RANK");
  return std::string(r ? r : "?");
}();

// One write() per line, so lines of different ranks never interleave.
void say(const std::string& line) {
  std::string s = line + "\n";
  for (std::size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] == '\n') s[i] = ' ';
  }
  [[maybe_unused]] const ssize_t k = ::write(STDOUT_FILENO, s.data(), s.size());
}

int fail(const std::string& what) {
  say("CLAIMS_FAILED rank=" + rank_label + " " + what);
  return 4;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

double timeout_seconds() {
  const char* t = std::getenv("KOLO_TIMEOUT_SECONDS");
  return t ? std::atof(t) : 60.0;
}

// One exact allreduce: every rank contributes rank+1.
bool good_allreduce(Comm& c) {
  std::vector<std::int32_t> v(1000, c.rank() + 1);
  c.allreduce(std::span<std::int32_t>(v));
  const std::int32_t want = c.size() * (c.size() + 1) / 2;
  for (std::int32_t x : v) {
    if (x != want) return false;
  }
  return true;
}

// A mismatch: every rank must get a MismatchError whose message holds both `mine` and `theirs`,
// and the next call must fail too, in a fraction of the deadline.
int mismatch(bool root) {
  auto c = std::make_unique<Comm>(kolo::Topology::from_env());
  rank_label = std::to_string(c->rank());
  if (c->size() < 2) return fail("needs two ranks or more");
  if (!good_allreduce(*c)) return fail("the good allreduce before the mismatch was wrong");
  const bool odd = c->rank() == 1;
  std::vector<std::int32_t> v(1000, 1);
  const std::string want_a = root ? "root 0" : "sum";
  const std::string want_b = root ? "root 1" : "max";
  try {
    if (root) {
      c->broadcast(std::span<std::int32_t>(v), odd ? 1 : 0);
    } else {
      c->allreduce(std::span<std::int32_t>(v), odd ? kolo::ReduceOp::max : kolo::ReduceOp::sum);
    }
    return fail(std::string(root ? "broadcast" : "allreduce") + " with a mismatched " +
                (root ? "root" : "op") + " returned normally");
  } catch (const kolo::MismatchError& e) {
    const std::string what = e.what();
    if (!has(what, want_a) || !has(what, want_b))
      return fail("the MismatchError names not both '" + want_a + "' and '" + want_b +
                  "': " + what);
    say("CLAIMS_MISMATCH rank=" + rank_label + " what=" + what);
  } catch (const kolo::Error& e) {
    return fail(std::string("expected MismatchError, got ") + kolo::error_kind_name(e.kind()) +
                ": " + e.what());
  }
  // Unusable after the error: a later collective throws, fast.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    good_allreduce(*c);
    return fail("a collective after the MismatchError returned normally");
  } catch (const kolo::Error& e) {
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (took > timeout_seconds() / 4)
      return fail("the call after the error took " + std::to_string(took) + " s to fail");
    say("CLAIMS_UNUSABLE rank=" + rank_label + " kind=" + kolo::error_kind_name(e.kind()) +
        " what=" + e.what());
  }
  say("CLAIMS_OK rank=" + rank_label);
  return 0;
}

int fault(const std::string& mode) {
  const bool culprit = std::getenv("KOLO_RANK") && std::string(std::getenv("KOLO_RANK")) == "1";
  const auto late = std::chrono::duration<double>(timeout_seconds() + 1.5);
  try {
    if (mode == "late-connect" && culprit) std::this_thread::sleep_for(late);
    if (mode == "unreachable") {
      // Two hosts by key (rank 0 alone on one), so ranks 1 and 2 map each other's segments and
      // then connect to rank 0 over TCP, at an address that answers nothing (TEST-NET-1): the
      // set-up fails after the segments were created and mapped, before their names go.
      const bool zero = std::string(std::getenv("KOLO_RANK")) == "0";
      for (const char* v :
           {"KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE", "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE"})
        ::unsetenv(v);
      ::setenv("KOLO_TRANSPORT", "routed", 1);
      ::setenv("KOLO_HOST_KEY", zero ? "claims-host-b" : "claims-host-a", 1);
      if (zero) ::setenv("KOLO_ADDR", "192.0.2.1", 1);
    }
    auto c = std::make_unique<Comm>(kolo::Topology::from_env());
    rank_label = std::to_string(c->rank());
    if (!good_allreduce(*c)) return fail("the first allreduce was wrong");
    if (culprit) {
      if (mode == "kill") ::raise(SIGKILL);
      if (mode == "abort") {
        const rlimit none{0, 0};
        ::setrlimit(RLIMIT_CORE, &none);  // no core file left behind
        std::abort();
      }
      if (mode == "timeout") std::this_thread::sleep_for(late);
    }
    if (!good_allreduce(*c)) return fail("the second allreduce was wrong");
  } catch (const kolo::Error& e) {
    say("CLAIMS_FAULT rank=" + rank_label + " kind=" + kolo::error_kind_name(e.kind()) +
        " what=" + e.what());
    return 3;
  }
  say("CLAIMS_OK rank=" + rank_label);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "mismatch-op") return mismatch(false);
    if (mode == "mismatch-root") return mismatch(true);
    if (mode == "clean" || mode == "kill" || mode == "abort" || mode == "timeout" ||
        mode == "late-connect" || mode == "unreachable")
      return fault(mode);
  } catch (const std::exception& e) {
    return fail(std::string("unexpected: ") + e.what());
  }
  std::fprintf(stderr,
               "usage: claims_worker mismatch-op|mismatch-root|clean|kill|abort|timeout|"
               "late-connect|unreachable\n");
  return 2;
}
