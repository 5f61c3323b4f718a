// kolo-run tested from the outside: each case starts the real kolo-run as a subprocess, with
// launcher_probe as the ranks' program, and checks what a user would see: the environment each
// rank got, its output, kolo-run's messages, its exit code and how long it took.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef KOLO_RUN_EXE
#error "KOLO_RUN_EXE (path of kolo-run) must be defined by the build"
#endif
#ifndef KOLO_PROBE_EXE
#error "KOLO_PROBE_EXE (path of launcher_probe) must be defined by the build"
#endif

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Result {
  int code = -1;  // exit status, or 128+signal if kolo-run itself died of a signal
  std::string out;
  std::string err;
  double seconds = 0;
};

// How a KoloRun starts besides its arguments.
struct StartOptions {
  bool stall_stdout = false;  // kolo-run's stdout is a pipe this test never reads
  int max_fds = 0;            // > 0: kolo-run's RLIMIT_NOFILE
};

// One kolo-run process with its stdout and stderr captured.
class KoloRun {
 public:
  explicit KoloRun(const std::vector<std::string>& args,
                   const std::vector<std::string>& extra_env = {}, StartOptions start = {})
      : stall_stdout_(start.stall_stdout) {
    std::vector<std::string> all = {KOLO_RUN_EXE};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out[2], err[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    start_ = Clock::now();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      if (start.max_fds > 0) {
        const rlimit lim{static_cast<rlim_t>(start.max_fds), static_cast<rlim_t>(start.max_fds)};
        ::setrlimit(RLIMIT_NOFILE, &lim);
      }
      ::dup2(devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(all[0].c_str(), argv.data(), envp.data());
      ::_exit(99);
    }
    ::close(devnull);
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~KoloRun() {
    if (pid_ > 0) {  // the test failed half-way: do not leave kolo-run (and its ranks) behind
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

  // Reads output until `done()` holds, both pipes close, or `limit` seconds pass.
  bool read_until(const std::function<bool()>& done, double limit) {
    const auto until = Clock::now() + std::chrono::duration<double>(limit);
    while (!done()) {
      std::vector<pollfd> fds;
      if (out_fd_ >= 0 && !stall_stdout_) fds.push_back({out_fd_, POLLIN, 0});
      if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
      if (fds.empty()) return done();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return false;
      if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
      for (const auto& p : fds) {
        if (p.revents == 0) continue;
        const bool is_out = p.fd == out_fd_;
        char buf[65536];
        const ssize_t k = ::read(p.fd, buf, sizeof(buf));
        if (k > 0) {
          (is_out ? out_ : err_).append(buf, static_cast<std::size_t>(k));
        } else {
          ::close(p.fd);
          (is_out ? out_fd_ : err_fd_) = -1;
        }
      }
    }
    return true;
  }

  // Waits for kolo-run to finish (at most `limit` seconds: then it is killed and the test fails).
  Result finish(double limit = 20) {
    const bool closed =
        read_until([] { return false; }, limit) || ((out_fd_ < 0 || stall_stdout_) && err_fd_ < 0);
    CHECK_MESSAGE(closed, "kolo-run did not finish within ", limit, " s");
    if (!closed) ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    Result r;
    r.seconds = seconds_since(start_);
    pid_ = -1;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = out_;
    r.err = err_;
    return r;
  }

 private:
  bool stall_stdout_ = false;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
  Clock::time_point start_;
};

Result run(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  KoloRun k(args, extra_env);
  return k.finish();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The "probe KEY=VALUE ..." line of each rank, keyed by the rank of its "[R] " prefix.
std::map<int, std::map<std::string, std::string>> probe_lines(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> by_rank;
  for (const auto& line : lines_of(out)) {
    const auto close = line.find("] probe ");
    if (line.empty() || line[0] != '[' || close == std::string::npos) continue;
    const int rank = std::stoi(line.substr(1, close - 1));
    CHECK_MESSAGE(by_rank.count(rank) == 0, "rank ", rank, " reported twice");
    std::istringstream fields(line.substr(close + 8));
    for (std::string kv; fields >> kv;) {
      const auto eq = kv.find('=');
      by_rank[rank][kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return by_rank;
}

// A process is gone when it no longer exists or is a zombie waiting for its reaper.
bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string all;
  std::getline(stat, all);
  const auto paren = all.rfind(')');
  return paren == std::string::npos || all.substr(paren + 2, 1) == "Z";
}

std::vector<pid_t> sleeper_pids(const std::string& out) {
  std::vector<pid_t> pids;
  for (const auto& line : lines_of(out)) {
    const auto at = line.find("] sleeper ");
    if (at != std::string::npos) pids.push_back(std::stoi(line.substr(at + 10)));
  }
  return pids;
}

std::string this_hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

const std::string kProbe = KOLO_PROBE_EXE;

}  // namespace

TEST_CASE("every rank gets the environment contract and a working store") {
  // Stale variables from an enclosing job must not leak into the ranks. An inherited
  // KOLO_JOB_ID would bind the ranks' store handshake to another job than kolo-run's store.
  const Result r = run({"-np", "4", kProbe, "env", "getenv", "KOLO_JOB_ID", "store"},
                       {"KOLO_RANK=9", "KOLO_SECRET=stale-secret", "KOLO_PEERS=1.2.3.4:5",
                        "KOLO_JOB_ID=an-enclosing-job"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  REQUIRE(r.code == 0);
  const auto ranks = probe_lines(r.out);
  REQUIRE(ranks.size() == 4);
  const std::string store = ranks.at(0).at("KOLO_STORE");
  const std::string secret = ranks.at(0).at("KOLO_SECRET");
  CHECK(store.rfind("127.0.0.1:", 0) == 0);  // all ranks local: the store stays on loopback
  CHECK(secret.size() == 64);
  CHECK(secret.find_first_not_of("0123456789abcdef") == std::string::npos);
  std::set<std::string> pgids;
  for (int rank = 0; rank < 4; ++rank) {
    const auto& v = ranks.at(rank);
    CHECK(v.at("KOLO_RANK") == std::to_string(rank));
    CHECK(v.at("KOLO_SIZE") == "4");
    CHECK(v.at("KOLO_LOCAL_RANK") == std::to_string(rank));
    CHECK(v.at("KOLO_LOCAL_SIZE") == "4");
    CHECK(v.at("KOLO_CROSS_RANK") == "0");
    CHECK(v.at("KOLO_CROSS_SIZE") == "1");
    CHECK(v.at("KOLO_HOST_KEY") == "local");
    CHECK(v.at("KOLO_STORE") == store);
    CHECK(v.at("KOLO_SECRET") == secret);
    CHECK(v.at("KOLO_PEERS") == "-");
    CHECK(contains(r.out, "[" + std::to_string(rank) + "] getenv KOLO_JOB_ID unset\n"));
    CHECK(v.at("PGID") == v.at("PID"));  // each rank leads its own process group
    pgids.insert(v.at("PGID"));
    // The rendezvous through the hosted store completed on every rank.
    CHECK(contains(r.out, "[" + std::to_string(rank) + "] store ok\n"));
  }
  CHECK(pgids.size() == 4);

  const Result again = run({"-np", "1", kProbe, "env"});
  REQUIRE(again.code == 0);
  CHECK(probe_lines(again.out).at(0).at("KOLO_SECRET") != secret);  // a fresh secret per job
}

TEST_CASE("-H fills hosts in order and sets local and cross ranks") {
  const std::string me = this_hostname();
  const Result r = run({"-np", "4", "-H", "localhost:2," + me + ":1,127.0.0.1:3", kProbe, "env"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  REQUIRE(r.code == 0);
  const auto ranks = probe_lines(r.out);
  REQUIRE(ranks.size() == 4);
  struct Expect {
    std::string host;
    int local_rank, local_size, cross_rank;
  };
  // The last host has 3 slots but receives a single rank.
  const Expect expect[] = {
      {"localhost", 0, 2, 0}, {"localhost", 1, 2, 0}, {me, 0, 1, 1}, {"127.0.0.1", 0, 1, 2}};
  for (int rank = 0; rank < 4; ++rank) {
    const auto& v = ranks.at(rank);
    CHECK(v.at("KOLO_RANK") == std::to_string(rank));
    CHECK(v.at("KOLO_SIZE") == "4");
    CHECK(v.at("KOLO_HOST_KEY") == expect[rank].host);
    CHECK(v.at("KOLO_LOCAL_RANK") == std::to_string(expect[rank].local_rank));
    CHECK(v.at("KOLO_LOCAL_SIZE") == std::to_string(expect[rank].local_size));
    CHECK(v.at("KOLO_CROSS_RANK") == std::to_string(expect[rank].cross_rank));
    CHECK(v.at("KOLO_CROSS_SIZE") == "3");
  }

  // Hosts beyond what -np needs are not hosts of the job.
  const Result fewer = run({"-np", "2", "-H", "localhost:2,127.0.0.1:2", kProbe, "env"});
  REQUIRE(fewer.code == 0);
  const auto two = probe_lines(fewer.out);
  REQUIRE(two.size() == 2);
  CHECK(two.at(1).at("KOLO_CROSS_SIZE") == "1");
  CHECK(two.at(1).at("KOLO_HOST_KEY") == "localhost");
}

TEST_CASE("output is relayed line by line with the rank prefix") {
  const Result r = run({"-np", "3", kProbe, "line", "hello world", "err", "oops", "partial",
                        "no newline at the end"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  REQUIRE(r.code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    const std::string p = "[" + std::to_string(rank) + "] ";
    CHECK(contains(r.out, p + "hello world\n"));
    CHECK(contains(r.out, p + "no newline at the end\n"));  // the partial line, flushed at EOF
    CHECK(contains(r.err, p + "oops\n"));
    CHECK_FALSE(contains(r.out, p + "oops"));  // stderr stays on stderr
  }
  CHECK(lines_of(r.out).size() == 6);

  SUBCASE("--no-prefix passes the bytes through") {
    const Result np = run({"-np", "1", "--no-prefix", kProbe, "line", "plain", "partial", "end"});
    REQUIRE(np.code == 0);
    CHECK(np.out == "plain\nend");
  }
}

TEST_CASE("lines of concurrent ranks never interleave") {
  // Each rank writes every line in two pieces, fast, at the same time as the others.
  const int lines = 300;
  const int len = 3000;
  const Result r = run({"-np", "4", kProbe, "spam", std::to_string(lines), std::to_string(len)});
  REQUIRE(r.code == 0);
  std::map<int, int> count;
  int bad = 0;
  for (const auto& line : lines_of(r.out)) {
    const int rank = line.size() > 4 ? line[1] - '0' : -1;
    const std::string expect =
        "[" + std::to_string(rank) + "] " + std::string(len, static_cast<char>('a' + rank));
    if (rank < 0 || rank > 3 || line != expect) {
      ++bad;
    } else {
      ++count[rank];
    }
  }
  CHECK(bad == 0);
  for (int rank = 0; rank < 4; ++rank) CHECK(count[rank] == lines);
}

TEST_CASE("a failing rank's exit code is kolo-run's and the others stop after the grace") {
  // Rank 2 fails at once; the others would sleep for 30 s, each with a helper process in its
  // group that must go down with it.
  const Result r = run({"-np", "4", "--grace", "1", kProbe, "spawn-sleeper", "30", "line", "up",
                        "exit-if-rank", "2", "7", "sleep", "30"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 7);
  CHECK(contains(r.err, "kolo-run: rank 2 exited with code 7\n"));
  CHECK(contains(r.err, "kolo-run: sending SIGTERM to rank(s) 0, 1, 3"));
  // Killed on kolo-run's orders: not reported as failures of their own.
  CHECK_FALSE(contains(r.err, "rank 0 killed"));
  // The survivors had their grace period (1 s) and were gone before the 30 s they would sleep:
  // within half of it (grace + 2 s of SIGTERM + slack for a loaded machine).
  CHECK(r.seconds >= 0.9);
  CHECK(r.seconds < 30.0 / 2);
  const auto sleepers = sleeper_pids(r.out);
  CHECK(sleepers.size() == 4);
  for (const pid_t pid : sleepers) {
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {  // the sleepers' reaper may need a moment
      gone = process_gone(pid);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK_MESSAGE(gone, "helper process ", pid, " survived the job");
    if (!gone) ::kill(pid, SIGKILL);
  }
}

TEST_CASE("a rank that ignores SIGTERM is killed 2 s later") {
  const Result r = run({"-np", "2", "--grace", "0.2", kProbe, "ignore-term", "exit-if-rank", "0",
                        "5", "sleep", "30"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 5);
  CHECK(contains(r.err, "kolo-run: sending SIGKILL to rank(s) 1"));
  CHECK(r.seconds >= 2.1);      // grace, then the 2 s before SIGKILL ...
  CHECK(r.seconds < 30.0 / 2);  // ... not the 30 s the rank would sleep: within half of it
}

TEST_CASE("a rank killed by a signal makes kolo-run exit with 128+signal") {
  const Result r = run({"-np", "3", "--grace", "10", kProbe, "kill-if-rank", "1", "9"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 128 + 9);
  CHECK(contains(r.err, "kolo-run: rank 1 killed by signal 9 (SIGKILL)\n"));
  // The other ranks had already succeeded: no grace (10 s) to wait out; a quarter of it.
  CHECK(r.seconds < 10.0 / 4);
}

TEST_CASE("--timeout kills the job and exits 124") {
  const Result r = run({"-np", "2", "--timeout", "0.5", kProbe, "sleep", "30"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 124);
  CHECK(contains(r.err, "kolo-run: job exceeded --timeout 0.5 seconds; killing all ranks\n"));
  CHECK(r.seconds >= 0.45);
  CHECK(r.seconds < 30.0 / 4);  // at --timeout, not after the ranks' 30 s sleep
}

TEST_CASE("SIGINT to kolo-run is forwarded to the ranks") {
  KoloRun k({"-np", "2", "--grace", "10", kProbe, "line", "ready", "sleep", "30"});
  const bool ready = k.read_until(
      [&] { return contains(k.out(), "[0] ready\n") && contains(k.out(), "[1] ready\n"); }, 10);
  REQUIRE(ready);
  const auto sent = Clock::now();
  ::kill(k.pid(), SIGINT);
  const Result r = k.finish();
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 128 + SIGINT);
  CHECK(contains(r.err, "kolo-run: received SIGINT; forwarding it to all ranks"));
  // The ranks died of the SIGINT itself, not of the escalation after the 10 s grace: within a
  // quarter of it.
  CHECK(seconds_since(sent) < 10.0 / 4);
}

TEST_CASE("a helper that keeps the output pipe open does not hold kolo-run") {
  const Result r = run({"-np", "1", kProbe, "hold-sleeper", "5"});
  CHECK(r.code == 0);
  CHECK(r.seconds < 3);
  for (const pid_t pid : sleeper_pids(r.out)) ::kill(pid, SIGKILL);
}

TEST_CASE("a program that cannot be executed gives 127 when missing and 126 when not executable") {
  const Result missing = run({"-np", "2", "/nonexistent/kolo-probe"});
  CHECK(missing.code == 127);
  CHECK(contains(missing.err, "cannot execute '/nonexistent/kolo-probe': No such file"));

  const Result not_in_path = run({"-np", "2", "kolo-no-such-program-4711"});
  CHECK(not_in_path.code == 127);
  CHECK(contains(not_in_path.err, "cannot execute 'kolo-no-such-program-4711': not found in PATH"));

  char path[] = "/tmp/kolo-launcher-noexec-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  ::chmod(path, 0644);
  const Result noexec = run({"-np", "1", path});
  ::unlink(path);
  CHECK(noexec.code == 126);
  CHECK(contains(noexec.err, std::string("cannot execute '") + path + "': Permission denied"));
}

TEST_CASE("bad arguments exit 2 with a message naming the problem and the usage") {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, "missing -np N"},
      {{kProbe}, "missing -np N"},
      {{"-np"}, "option -np needs a value"},
      {{"-np", "0", kProbe}, "-np 0: the number of ranks must be at least 1"},
      {{"-np", "-3", kProbe}, "-np -3: the number of ranks must be at least 1"},
      {{"-np", "two", kProbe}, "-np 'two' is not an integer"},
      {{"-np", "2"}, "missing the program to run"},
      {{"-np", "2", "--"}, "missing the program to run"},
      {{"-np", "2", "--bogus", kProbe}, "unknown option '--bogus'"},
      {{"-np", "2", "-H", "localhost", kProbe}, "-H entry 'localhost' is not host:slots"},
      {{"-np", "2", "-H", "localhost:0", kProbe},
       "-H entry 'localhost:0' has slots '0', which is not a positive integer"},
      {{"-np", "2", "-H", "localhost:1,,127.0.0.1:1", kProbe}, "-H entry '' is not host:slots"},
      {{"-np", "2", "-H", "localhost:1,localhost:1", kProbe}, "-H lists host 'localhost' twice"},
      {{"-np", "4", "-H", "localhost:2,127.0.0.1:1", kProbe},
       "-H gives 3 slot(s) in total but -np is 4"},
      {{"-np", "2", "--timeout", "soon", kProbe}, "--timeout 'soon' is not a positive number"},
      {{"-np", "2", "--timeout", "0", kProbe}, "--timeout '0' is not a positive number"},
      {{"-np", "2", "--grace", "-1", kProbe}, "--grace '-1' is not a number of seconds"},
      {{"-np", "2", "-x", "1BAD", kProbe}, "-x '1BAD': expected NAME or NAME=VALUE"},
      {{"-np", "2", "-x", "KOLO_RANK=3", kProbe}, "-x KOLO_RANK: kolo-run sets KOLO_RANK itself"},
  };
  for (const auto& c : cases) {
    const Result r = run(c.args);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    INFO("kolo-run " << joined << "\nstderr:\n" << r.err);
    CHECK(r.code == 2);
    CHECK(contains(r.err, "kolo-run: " + c.message));
    CHECK(contains(r.err, "usage: kolo-run -np N"));
    CHECK(r.out.empty());
  }

  const Result help = run({"--help"});
  CHECK(help.code == 0);
  CHECK(contains(help.out, "usage: kolo-run -np N"));
}

TEST_CASE("-H with a host that is neither this machine nor a network namespace uses ssh") {
  // A real ssh whose connection fails at once without touching the network (its proxy command
  // is `false`): the rank's exit code is ssh's 255, ssh's own message is relayed, and kolo-run
  // says what 255 means.
  const Result r = run({"-np", "2", "-H", "kolo-nowhere-host:2", "--ssh",
                        "ssh -o ProxyCommand=false", kProbe, "env"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 255);
  CHECK(contains(r.err,
                 "kolo-run: rank 0 on kolo-nowhere-host exited with code 255 (ssh's code "
                 "for its own failures"));
  CHECK(contains(r.err, "[0] "));  // ssh's message, prefixed like any output of the rank
  CHECK(r.out.empty());
}

namespace {

// A "remote shell" that runs the remote command on this machine, as rsh would on another one:
// `AGENT host command` -> `sh -c command`. It lets these tests run kolo-run's whole ssh path
// (the job on stdin, the remote prologue, control lines, EOF) without root or an sshd;
// tests/netns/ssh_hosts.sh does the same against real sshds on namespace hosts.
const std::string kLocalAgent = "sh -c 'shift; exec sh -c \"$1\"' local-rsh";

// Every process whose command line holds `needle`.
std::vector<std::string> cmdlines_with(const std::string& needle) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (contains(cmd, needle)) found.push_back(name + ": " + cmd);
  }
  return found;
}

}  // namespace

TEST_CASE("ranks on a remote-shell host get the contract through stdin, never in argv") {
  const std::string marker = "kolo-rsh-marker-" + std::to_string(::getpid());
  KoloRun k({"-np",          "3",
             "--grace",      "10",
             "-H",           "far-a:2,far-b:1",
             "--ssh",        kLocalAgent,
             "--store-host", "127.0.0.1",
             "-x",           "KOLO_RSH_SET=a 'quoted' value",
             kProbe,         "env",
             "store",        "getenv",
             "KOLO_RSH_SET", "line",
             "ready",        "sleep",
             "30",           "line",
             marker});
  const bool ready = k.read_until(
      [&] {
        return contains(k.out(), "[0] ready\n") && contains(k.out(), "[1] ready\n") &&
               contains(k.out(), "[2] ready\n");
      },
      20);
  INFO("stdout:\n" << k.out());
  REQUIRE(ready);
  const auto ranks = probe_lines(k.out());
  REQUIRE(ranks.size() == 3);
  const std::string secret = ranks.at(0).at("KOLO_SECRET");
  CHECK(secret.size() == 64);
  // While every rank runs: kolo-run, the agents, the remote shells and the ranks are all there
  // (they carry the marker), and none has the secret in its argument list.
  CHECK(cmdlines_with(marker).size() >= 1 + 3 + 3);
  CHECK(cmdlines_with(secret).empty());
  CHECK_FALSE(contains(k.out(), "kolo-run-remote-prologue-started"));
  for (int rank = 0; rank < 3; ++rank) {
    const auto& v = ranks.at(rank);
    CHECK(v.at("KOLO_RANK") == std::to_string(rank));
    CHECK(v.at("KOLO_SIZE") == "3");
    CHECK(v.at("KOLO_HOST_KEY") == (rank < 2 ? "far-a" : "far-b"));
    CHECK(v.at("KOLO_LOCAL_RANK") == (rank < 2 ? std::to_string(rank) : "0"));
    CHECK(v.at("KOLO_CROSS_RANK") == (rank < 2 ? "0" : "1"));
    CHECK(v.at("KOLO_CROSS_SIZE") == "2");
    CHECK(v.at("KOLO_STORE").rfind("127.0.0.1:", 0) == 0);
    CHECK(v.at("KOLO_SECRET") == secret);
    CHECK(contains(k.out(), "[" + std::to_string(rank) + "] store ok\n"));
    CHECK(
        contains(k.out(), "[" + std::to_string(rank) + "] getenv KOLO_RSH_SET=a 'quoted' value\n"));
  }
  // Ctrl-C travels as a control line; the ranks die of the SIGINT itself (no escalation).
  const auto sent = Clock::now();
  ::kill(k.pid(), SIGINT);
  const Result r = k.finish();
  INFO("stderr:\n" << r.err);
  CHECK(r.code == 128 + SIGINT);
  CHECK_FALSE(contains(r.err, "sending SIGTERM"));
  CHECK(seconds_since(sent) < 10.0 / 4);  // no escalation after the 10 s grace: a quarter of it
  std::vector<std::string> left;
  for (int i = 0; i < 100; ++i) {
    left = cmdlines_with(marker);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK_MESSAGE(left.empty(), "left: ", left.size(),
                " process(es), first: ", left.empty() ? "" : left[0]);
}

TEST_CASE("remote-shell ranks: login output passes, the start marker does not, 12 on one host") {
  // A login script that prints before the command runs; 12 ranks on one host start 8 at a
  // time (sshd's MaxStartups), the later ones when earlier ones' prologues have spoken.
  const std::string chatty = "sh -c 'shift; echo login-banner; exec sh -c \"$1\"' chatty-rsh";
  const Result r = run({"-np", "12", "-H", "far-a:12", "--ssh", chatty, "--store-host", "127.0.0.1",
                        kProbe, "store", "line", "done"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 0);
  for (int rank = 0; rank < 12; ++rank) {
    const std::string p = "[" + std::to_string(rank) + "] ";
    CHECK(contains(r.out, p + "login-banner\n"));
    CHECK(contains(r.out, p + "store ok\n"));
    CHECK(contains(r.out, p + "done\n"));
  }
  CHECK_FALSE(contains(r.out, "kolo-run-remote-prologue-started"));
  CHECK(lines_of(r.out).size() == 36);
}

TEST_CASE("a remote rank that fails ends every rank and the helpers they started") {
  const Result r = run({"-np", "3", "-H", "far-a:2,far-b:1", "--ssh", kLocalAgent, "--store-host",
                        "127.0.0.1", "--grace", "0.5", kProbe, "store", "spawn-sleeper", "30",
                        "kill-if-rank", "2", "9", "sleep", "30"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 128 + 9);
  CHECK(contains(r.err, "kolo-run: rank 2 on far-b killed by signal 9 (SIGKILL)\n"));
  CHECK(contains(r.err, "kolo-run: sending SIGTERM to rank(s) 0, 1"));
  const auto sleepers = sleeper_pids(r.out);
  CHECK(sleepers.size() == 3);
  for (const pid_t pid : sleepers) {
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {
      gone = process_gone(pid);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK_MESSAGE(gone, "helper process ", pid, " survived the job");
    if (!gone) ::kill(pid, SIGKILL);
  }
}

TEST_CASE("ssh hosts: what kolo-run refuses, and what the remote side reports") {
  // A rank here and ranks over ssh: the ones here would advertise 127.0.0.1.
  Result r = run({"-np", "2", "-H", "localhost:1,kolo-far:1", kProbe, "env"});
  CHECK(r.code == 2);
  CHECK(contains(r.err, "ranks run on this machine and on ssh host kolo-far: pass --store-host"));

  r = run({"-np", "1", "-H", "kolo-far:1", "--store-host", "127.0.0.1", kProbe, "env"});
  CHECK(r.code == 2);
  CHECK(contains(r.err,
                 "--store-host 127.0.0.1 is a loopback address, which ranks on ssh host "
                 "kolo-far cannot reach"));

  r = run({"-np", "1", "-H", "kolo-far:1", "--ssh", "ssh -i 'unterminated", kProbe, "env"});
  CHECK(r.code == 2);
  CHECK(contains(r.err, "--ssh 'ssh -i 'unterminated' has an unterminated ' quote"));

  r = run({"-np", "1", "-H", "kolo-far:1", kProbe, "env"}, {"KOLO_RUN_SSH=/nonexistent/ssh"});
  CHECK(r.code == 127);
  CHECK(contains(r.err,
                 "host kolo-far is not this machine nor a network namespace, so its ranks "
                 "start with ssh, but cannot execute '/nonexistent/ssh'"));

  r = run({"-np", "1", "-H", "kolo-far:1", "--ssh", kLocalAgent, "--store-host", "127.0.0.1", "-x",
           "KOLO_TEST_SURELY_UNSET_4711", kProbe, "env"});
  CHECK(r.code == 2);
  CHECK(contains(r.err, "-x KOLO_TEST_SURELY_UNSET_4711: KOLO_TEST_SURELY_UNSET_4711 is not set"));

  // Not ssh: no SSH_CONNECTION to derive the store's address from.
  r = run({"-np", "1", "-H", "kolo-far:1", "--ssh", kLocalAgent, kProbe, "env"});
  CHECK(r.code == 1);
  CHECK(contains(r.err, "[0] kolo-run: SSH_CONNECTION is not set on kolo-far"));

  // The program is looked for on the remote host, not here.
  r = run({"-np", "1", "-H", "kolo-far:1", "--ssh", kLocalAgent, "--store-host", "127.0.0.1",
           "/nonexistent/kolo-probe"});
  CHECK(r.code == 127);
  CHECK(contains(r.err, "[0] kolo-run: cannot execute /nonexistent/kolo-probe on kolo-far"));
}

TEST_CASE("ranks on a network-namespace host run inside it") {
  // Needs root (ip netns add). The name is unique per test process: other tests may run
  // namespaces of their own on the same machine.
  const std::string ns = "kolo-lt-" + std::to_string(::getpid());
  if (::geteuid() != 0 || std::system(("ip netns add " + ns + " >/dev/null 2>&1").c_str()) != 0) {
    MESSAGE("skipped: cannot create a network namespace here (needs root and iproute2)");
    return;
  }
  struct Cleanup {
    std::string ns;
    ~Cleanup() { [[maybe_unused]] int rc = std::system(("ip netns del " + ns).c_str()); }
  } cleanup{ns};

  const std::vector<std::string> hosts = {"-np", "3", "-H", "localhost:1," + ns + ":2"};
  std::vector<std::string> args = hosts;
  args.insert(args.end(), {"--store-host", "192.0.2.1", kProbe, "env"});
  const Result r = run(args);
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  REQUIRE(r.code == 0);
  const auto ranks = probe_lines(r.out);
  REQUIRE(ranks.size() == 3);
  CHECK(ranks.at(0).at("KOLO_HOST_KEY") == "localhost");
  CHECK(ranks.at(0).at("KOLO_STORE").rfind("192.0.2.1:", 0) == 0);
  for (int rank = 1; rank < 3; ++rank) {
    const auto& v = ranks.at(rank);
    CHECK(v.at("KOLO_HOST_KEY") == ns);
    CHECK(v.at("NETNS") != ranks.at(0).at("NETNS"));  // really inside the namespace
    CHECK(v.at("KOLO_LOCAL_RANK") == std::to_string(rank - 1));
    CHECK(v.at("KOLO_LOCAL_SIZE") == "2");
    CHECK(v.at("KOLO_CROSS_RANK") == "1");
    CHECK(v.at("KOLO_CROSS_SIZE") == "2");
    CHECK(v.at("KOLO_STORE") == ranks.at(0).at("KOLO_STORE"));
  }

  args = hosts;
  args.insert(args.end(), {kProbe, "env"});
  const Result no_store_host = run(args);
  CHECK(no_store_host.code == 2);
  CHECK(contains(no_store_host.err, "host " + ns + " is a network namespace"));
  CHECK(contains(no_store_host.err, "--store-host ADDR"));
}

// Issue 53, items 3 and 4: every process of a job is released on every path (kolo-run's ranks
// start through a watchdog, backends/local/rank_watchdog.hpp), and kolo-run's poll loop never
// waits for a reader of its output.
namespace {

// A word no other process has in its command line: kolo-run and its watchdogs (forks of it),
// the ranks and what they fork all carry it.
std::string job_marker(const char* what) {
  return std::string("kolo-job-") + what + "-" + std::to_string(::getpid());
}

// Seconds until no live process has `marker` in its command line (a zombie's is empty), or -1
// after `limit`; then the leftovers are SIGKILLed, so a failing test leaves nothing either.
double seconds_until_gone(const std::string& marker, double limit) {
  const auto start = Clock::now();
  while (seconds_since(start) < limit) {
    if (cmdlines_with(marker).empty()) return seconds_since(start);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& line : cmdlines_with(marker)) {
    MESSAGE("left behind: " << line);
    ::kill(std::stoi(line.substr(0, line.find(':'))), SIGKILL);
  }
  return -1;
}

// The pid in "[RANK] sleeper PID", or -1.
pid_t sleeper_of(const std::string& out, int rank) {
  const std::string key = "[" + std::to_string(rank) + "] sleeper ";
  const auto at = out.find(key);
  return at == std::string::npos ? -1 : std::stoi(out.substr(at + key.size()));
}

}  // namespace

TEST_CASE("a SIGKILLed kolo-run leaves no process of the job behind") {
  const std::string marker = job_marker("sigkill");
  KoloRun k({"-np", "2", kProbe, "spawn-sleeper", "30", "line", marker, "sleep", "30"});
  REQUIRE(k.read_until(
      [&] {
        return contains(k.out(), "[0] " + marker + "\n") &&
               contains(k.out(), "[1] " + marker + "\n");
      },
      10));
  // kolo-run, 2 watchdogs, 2 ranks, 2 sleepers.
  CHECK(cmdlines_with(marker).size() == 7);
  ::kill(k.pid(), SIGKILL);
  const auto killed = Clock::now();
  const Result r = k.finish(5);
  CHECK(r.code == 128 + SIGKILL);
  // The watchdogs see kolo-run's end and SIGTERM the ranks' trees: gone within a third of the
  // default 3 s grace.
  const double gone = seconds_until_gone(marker, 1.0);
  MESSAGE("the job was gone " << seconds_since(killed) << " s after kolo-run's SIGKILL");
  CHECK(gone >= 0);
}

TEST_CASE("a rank killed by SIGKILL takes what it started with it, at once") {
  const std::string marker = job_marker("rank-kill");
  KoloRun k({"-np", "2", "--grace", "10", kProbe, "line", marker, "spawn-sleeper", "30",
             "kill-if-rank", "0", "9", "sleep", "2"});
  const std::string verdict = "kolo-run: rank 0 killed by signal 9 (SIGKILL)\n";
  REQUIRE(
      k.read_until([&] { return contains(k.err(), verdict) && sleeper_of(k.out(), 0) > 0; }, 10));
  const pid_t orphan = sleeper_of(k.out(), 0);
  const auto seen = Clock::now();
  bool gone = false;
  while (!gone && seconds_since(seen) < 1.0) {  // a tenth of the 10 s grace
    gone = process_gone(orphan);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK_MESSAGE(gone, "rank 0's child ", orphan, " outlived rank 0 by more than 1 s");
  if (!gone) ::kill(orphan, SIGKILL);
  const Result r = k.finish();
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 128 + SIGKILL);
  CHECK(r.seconds < 10.0 / 2);  // rank 1 ended by itself after 2 s, long before the grace
  // Rank 1 succeeded; its child went with it, before kolo-run exited.
  const pid_t helper = sleeper_of(r.out, 1);
  CHECK(helper > 0);
  CHECK(process_gone(helper));
  CHECK(seconds_until_gone(marker, 0.5) >= 0);
}

TEST_CASE("--timeout acts on time while kolo-run's reader takes nothing") {
  const std::string marker = job_marker("timeout-stall");
  KoloRun k({"-np", "2", "--timeout", "2", kProbe, "line", marker, "spam", "1000000000", "100"}, {},
            StartOptions{true, 0});
  const Result r = k.finish(5);
  INFO("stderr:\n" << r.err);
  CHECK(r.code == 124);
  MESSAGE("kolo-run --timeout 2 with a stalled reader exited after " << r.seconds << " s");
  CHECK(r.seconds < 2 + 1.0);  // the timeout plus half of it
  CHECK(contains(r.err, "kolo-run: job exceeded --timeout 2 seconds; killing all ranks\n"));
  CHECK(contains(r.err, " bytes of output dropped, reader too slow]\n"));
  CHECK(seconds_until_gone(marker, 0.5) >= 0);
}

TEST_CASE("SIGTERM acts on time while kolo-run's reader takes nothing") {
  const std::string marker = job_marker("sigterm-stall");
  KoloRun k({"-np", "2", "--grace", "10", kProbe, "line", marker, "spam", "1000000000", "100"}, {},
            StartOptions{true, 0});
  // Until the ranks run and kolo-run's stdout pipe is full (the spam fills it in milliseconds).
  const auto start = Clock::now();
  while (cmdlines_with(marker).size() < 3 && seconds_since(start) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(cmdlines_with(marker).size() >= 3);  // kolo-run and its 2 ranks (at least)
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(k.pid(), SIGTERM);
  const auto sent = Clock::now();
  const Result r = k.finish(5);
  INFO("stderr:\n" << r.err);
  CHECK(r.code == 128 + SIGTERM);
  CHECK(contains(r.err, "kolo-run: received SIGTERM; forwarding it to all ranks\n"));
  MESSAGE("kolo-run exited " << seconds_since(sent) << " s after SIGTERM, reader stalled");
  CHECK(seconds_since(sent) < 10.0 / 4);  // the ranks died of the SIGTERM, not of the escalation
  CHECK(seconds_until_gone(marker, 0.5) >= 0);
}

TEST_CASE("no descriptors left for a rank's pipes: a clear error naming errno, nothing left") {
  const std::string marker = job_marker("emfile");
  KoloRun k({"-np", "32", kProbe, "line", marker, "sleep", "20"}, {}, StartOptions{false, 48});
  const Result r = k.finish(10);
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.code == 1);
  CHECK(contains(r.err, ": Too many open files (errno 24)\n"));
  CHECK(contains(r.err, "kolo-run: cannot create pipes for rank "));
  CHECK(r.seconds < 3);
  CHECK(seconds_until_gone(marker, 0.5) >= 0);
}
