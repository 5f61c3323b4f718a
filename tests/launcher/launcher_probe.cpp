// launcher_probe — the program kolo-run starts in the launcher tests.
//
// Its arguments are a little script, run left to right, so one binary can play every role a
// test needs (a rank that reports its environment, fails, hangs, dies of a signal, ...):
//   env                    one line "probe KOLO_RANK=.. KOLO_SIZE=.. ... NETNS=<inode>"
//   store                  rendezvous through KOLO_STORE with KOLO_SECRET: every rank sets its
//                          key and waits for all the others'; prints "store ok"
//   line TEXT / err TEXT   TEXT and '\n' on stdout / stderr
//   partial TEXT           TEXT on stdout without a newline
//   spam N LEN             N lines of LEN copies of one letter per rank ('a' + rank), each
//                          written in two pieces, so kolo-run must reassemble lines
//   sleep SECONDS          sleeps
//   exit CODE              exits with CODE
//   exit-if-rank R CODE    exits with CODE when KOLO_RANK == R
//   kill-if-rank R SIG     sends itself signal SIG when KOLO_RANK == R
//   ignore-term            ignores SIGTERM from now on (so only SIGKILL stops it)
//   spawn-sleeper SECONDS  forks a child (same process group) that sleeps; prints "sleeper PID"
//   hold-sleeper SECONDS   like spawn-sleeper, but the child keeps stdout/stderr open
//   getenv NAME            one line "getenv NAME=VALUE", or "getenv NAME unset"
//   allreduce N            a Communicator<>::from_env() allreduces N int64 (sum) and N float32
//                          (average); every element is checked exactly; prints "allreduce ok
//                          n=N int64[0]=.. int64[N-1]=.. float32[N-1]=.." or exits 4
// Output goes through write(2) directly: stdio would buffer it in a pipe and lose it on _exit
// or a signal, which is exactly what some tests do.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kolo/kolo.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/topology/store.hpp"

namespace {

void write_fd(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t k = ::write(fd, s.data() + done, s.size() - done);
    if (k <= 0) return;
    done += static_cast<std::size_t>(k);
  }
}

std::string env_or(const char* name, const char* fallback = "-") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int my_rank() {
  return std::atoi(env_or("KOLO_RANK", "-1").c_str());
}

[[noreturn]] void usage(const std::string& why) {
  write_fd(2, "launcher_probe: " + why + "\n");
  std::_Exit(100);
}

void print_env() {
  std::string line = "probe";
  for (const char* name :
       {"KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE", "KOLO_CROSS_RANK",
        "KOLO_CROSS_SIZE", "KOLO_STORE", "KOLO_SECRET", "KOLO_HOST_KEY", "KOLO_PEERS"}) {
    line += std::string(" ") + name + "=" + env_or(name);
  }
  struct stat st {};
  const bool ok = ::stat("/proc/self/ns/net", &st) == 0;
  line += " NETNS=" + (ok ? std::to_string(static_cast<unsigned long long>(st.st_ino)) : "-");
  line += " PID=" + std::to_string(::getpid()) + " PGID=" + std::to_string(::getpgrp());
  write_fd(1, line + "\n");
}

void store_rendezvous() {
  try {
    const auto addr = kolo::net::parse_host_port(env_or("KOLO_STORE", ""), "KOLO_STORE");
    const int size = std::atoi(env_or("KOLO_SIZE", "1").c_str());
    kolo::StoreClient client(addr, env_or("KOLO_SECRET", ""), my_rank(), 10.0);
    client.set("probe/" + std::to_string(my_rank()), "here");
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back("probe/" + std::to_string(r));
    client.wait(keys);
    write_fd(1, "store ok\n");
  } catch (const std::exception& e) {
    write_fd(1, std::string("store failed: ") + e.what() + "\n");
    std::_Exit(3);
  }
}

void spawn_sleeper(double seconds, bool hold_output) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!hold_output) {
      ::close(1);
      ::close(2);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::_Exit(0);
  }
  write_fd(1, "sleeper " + std::to_string(pid) + "\n");
}

// Rank r contributes (r + 1) * (i + 1) to int64 element i, so the sum is (i + 1) * N(N+1)/2,
// and 2r + i % 5 to float32 element i, so the average is (N - 1) + i % 5: exact in both types.
void allreduce_check(std::size_t n) {
  try {
    auto comm = kolo::Communicator<>::from_env();
    const auto size = static_cast<std::int64_t>(comm.size());
    const auto rank = static_cast<std::int64_t>(comm.rank());
    std::vector<std::int64_t> ints(n);
    std::vector<float> floats(n);
    for (std::size_t i = 0; i < n; ++i) {
      ints[i] = (rank + 1) * static_cast<std::int64_t>(i + 1);
      floats[i] = static_cast<float>(2 * rank + static_cast<std::int64_t>(i % 5));
    }
    comm.allreduce(ints, kolo::ReduceOp::sum);
    comm.allreduce(floats, kolo::ReduceOp::average);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += ints[i] != static_cast<std::int64_t>(i + 1) * size * (size + 1) / 2;
      wrong += floats[i] != static_cast<float>(size - 1 + static_cast<std::int64_t>(i % 5));
    }
    if (wrong != 0) {
      write_fd(1, "allreduce WRONG: " + std::to_string(wrong) + " elements\n");
      std::_Exit(4);
    }
    write_fd(1, "allreduce ok n=" + std::to_string(n) + " int64[0]=" + std::to_string(ints[0]) +
                    " int64[n-1]=" + std::to_string(ints[n - 1]) +
                    " float32[n-1]=" + std::to_string(static_cast<double>(floats[n - 1])) + "\n");
  } catch (const std::exception& e) {
    write_fd(1, std::string("allreduce failed: ") + e.what() + "\n");
    std::_Exit(4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i) -> std::string {
    if (i >= argc) usage(std::string("missing an argument for '") + argv[i - 1] + "'");
    return argv[i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string cmd = argv[i];
    if (cmd == "env") {
      print_env();
    } else if (cmd == "store") {
      store_rendezvous();
    } else if (cmd == "line") {
      write_fd(1, arg(++i) + "\n");
    } else if (cmd == "err") {
      write_fd(2, arg(++i) + "\n");
    } else if (cmd == "partial") {
      write_fd(1, arg(++i));
    } else if (cmd == "spam") {
      const int n = std::atoi(arg(++i).c_str());
      const std::size_t len = static_cast<std::size_t>(std::atol(arg(++i).c_str()));
      const std::string text(len, static_cast<char>('a' + (my_rank() % 26 + 26) % 26));
      for (int k = 0; k < n; ++k) {
        write_fd(1, text.substr(0, len / 2));
        write_fd(1, text.substr(len / 2) + "\n");
      }
    } else if (cmd == "sleep") {
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(arg(++i).c_str())));
    } else if (cmd == "exit") {
      std::_Exit(std::atoi(arg(++i).c_str()));
    } else if (cmd == "exit-if-rank") {
      const int r = std::atoi(arg(++i).c_str());
      const int code = std::atoi(arg(++i).c_str());
      if (r == my_rank()) std::_Exit(code);
    } else if (cmd == "kill-if-rank") {
      const int r = std::atoi(arg(++i).c_str());
      const int sig = std::atoi(arg(++i).c_str());
      if (r == my_rank()) {
        ::kill(::getpid(), sig);
        std::this_thread::sleep_for(std::chrono::seconds(5));  // a caught signal: not expected
        std::_Exit(101);
      }
    } else if (cmd == "ignore-term") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (cmd == "getenv") {
      const std::string name = arg(++i);
      const char* v = std::getenv(name.c_str());
      write_fd(1, "getenv " + name + (v ? "=" + std::string(v) : " unset") + "\n");
    } else if (cmd == "allreduce") {
      const long n = std::atol(arg(++i).c_str());
      if (n < 1) usage("allreduce needs a positive element count");
      allreduce_check(static_cast<std::size_t>(n));
    } else if (cmd == "spawn-sleeper" || cmd == "hold-sleeper") {
      spawn_sleeper(std::atof(arg(++i).c_str()), cmd == "hold-sleeper");
    } else {
      usage("unknown command '" + cmd + "'");
    }
  }
  return 0;
}
