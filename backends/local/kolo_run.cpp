// kolo-run — the launcher: `kolo-run -np N [-H host:slots,...] prog args...`.
//
// It does for kolo what mpirun/horovodrun do for MPI/Horovod:
//   * hosts the rendezvous store in-process, with a fresh secret per job;
//   * starts N ranks, each with the environment contract of docs/environment.md (KOLO_RANK, ...);
//   * ranks on "hosts" that are network namespaces (the multi-host tests) go through
//     `ip netns exec`, so one machine can stand in for several;
//   * ranks on other machines go through ssh: one ssh per rank, the job's description (the
//     secret included) written to ssh's stdin and read by a small POSIX sh prologue on the remote
//     side, so no argument list ever holds the secret. The rest of that stdin is a control
//     channel: a line "INT"/"TERM"/"HUP" forwards that signal to the remote rank's process
//     group, and end-of-file (kolo-run gone, ssh killed, connection dropped) SIGKILLs it;
//   * prefixes every output line with "[rank] " and never mixes two ranks inside one line;
//   * when one rank fails, gives the others a grace period to report their own errors (e.g. a
//     PeerLostError naming the dead rank), then SIGTERM, then SIGKILL: a job never hangs.
//
// Everything runs in one thread around one poll() loop (rank pipes + a signalfd); deadlines
// (--timeout, grace, kill) are poll timeouts, so kolo-run sleeps while the ranks work.

#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/net/auth.hpp"
#include "kolo/topology/store.hpp"
#include "rank_watchdog.hpp"

extern char** environ;

namespace {

// Exit codes, following the shells and timeout(1) so scripts can tell the cases apart.
constexpr int kExitInternal = 1;
constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 124;
constexpr int kExitNotExecutable = 126;
constexpr int kExitNotFound = 127;

// After SIGTERM, how long ranks get to exit before SIGKILL (fixed by the spec, like mpirun's).
constexpr double kKillAfterTermSeconds = 2.0;
// A "line" longer than this is emitted in pieces: one rank printing megabytes without a newline
// must not make kolo-run buffer without bound.
constexpr std::size_t kMaxLine = 64 * 1024;
// At the end of a job, how long kolo-run waits for a reader of its stdout/stderr that takes no
// byte, before it drops the rest: after a normal end, and after --timeout or a signal.
constexpr double kFlushStallSeconds = 1.0;
constexpr double kFlushStallTornDown = 0.25;

constexpr const char* kUsage =
    "usage: kolo-run -np N [options] [--] program [args...]\n"
    "\n"
    "Starts N ranks of `program`, hosts kolo's rendezvous store, and gives each rank the\n"
    "environment contract (KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE,\n"
    "KOLO_CROSS_RANK, KOLO_CROSS_SIZE, KOLO_STORE, KOLO_SECRET, KOLO_HOST_KEY).\n"
    "\n"
    "options:\n"
    "  -np, -n, --np N           number of ranks (required, at least 1)\n"
    "  -H, --hosts H:S[,H:S...]  hosts and their slot counts; ranks fill the hosts in order.\n"
    "                            A host is this machine (localhost, 127.0.0.1, its hostname or\n"
    "                            one of its addresses), a network namespace listed in\n"
    "                            /var/run/netns, or else a machine reached with ssh "
    "([user@]host).\n"
    "                            Default: all ranks on this machine.\n"
    "  --store-host ADDR         address the ranks use to reach the store (required when a rank\n"
    "                            runs in a network namespace, or when ranks run both on this\n"
    "                            machine and over ssh; ssh ranks otherwise use the address their\n"
    "                            ssh connection came from)\n"
    "  --ssh COMMAND             the ssh command for remote hosts, split into words like a shell\n"
    "                            would (e.g. \"ssh -p 2222 -i ~/.ssh/id_cluster\"); default: the\n"
    "                            KOLO_RUN_SSH environment variable, else \"ssh\". kolo-run adds\n"
    "                            -T -o BatchMode=yes -o ConnectTimeout=30 to it (yours win)\n"
    "  -x NAME[=VALUE]           NAME=VALUE: set NAME for every rank; NAME: also pass this\n"
    "                            environment's NAME to ssh ranks (repeatable). ssh ranks get\n"
    "                            every KOLO_* variable of this environment by themselves\n"
    "  --timeout SECONDS         kill all ranks and exit 124 if the job runs longer\n"
    "  --grace SECONDS           after a rank fails, how long the others may take to exit\n"
    "                            before SIGTERM (default 3); SIGKILL follows 2 s later\n"
    "  --no-prefix               do not prefix output lines with \"[rank] \"\n"
    "  -h, --help                print this help\n"
    "\n"
    "exit status: 0 when every rank succeeded; otherwise the first failing rank's exit code\n"
    "(128+S if it died of signal S); 124 after --timeout; 127 if the program is not found,\n"
    "126 if it cannot be executed (on an ssh host: that rank's code); 255 when ssh itself\n"
    "failed for a rank; 2 for bad arguments.\n";

// ---------------------------------------------------------------------------------------------
// Writing to kolo-run's own stdout/stderr.

// All output, the ranks' and kolo-run's own messages, goes through an OutStream from the one
// thread, and every call carries whole lines: that is what keeps lines from interleaving.
//
// Writing never blocks the poll loop (a stalled reader must not hold --timeout, the grace
// period or a signal): once prepare() has run, a pipe or terminal is written through a second
// open file description of it with O_NONBLOCK (reopened via /proc/self/fd, so the flags of the
// description kolo-run shares with its shell stay untouched), a socket with MSG_DONTWAIT, and
// what does not fit waits in a buffer. The buffer is bounded by back-pressure, not by dropping:
// while a stream holds kOutBuffer bytes or more, kolo-run stops reading the ranks' pipes that
// feed it, so the ranks block on their own writes, as they would writing to that reader
// directly. Only at exit, what a reader still has not taken is dropped, with a counted note.
// Regular files (and anything that cannot be reopened) are written as before, blocking.
constexpr std::size_t kOutBuffer = 256 * 1024;

class OutStream {
 public:
  explicit OutStream(int fd) : fd_(fd), wfd_(fd) {}
  OutStream(const OutStream&) = delete;
  OutStream& operator=(const OutStream&) = delete;

  void prepare() {
    struct stat st {};
    const int fl = ::fcntl(fd_, F_GETFL);
    if (fl < 0 || ::fstat(fd_, &st) != 0) return;
    if (S_ISSOCK(st.st_mode)) {
      mode_ = Mode::socket;
    } else if (fl & O_NONBLOCK) {
      mode_ = Mode::nonblocking;  // inherited that way: use it as it is
    } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
      const std::string path = "/proc/self/fd/" + std::to_string(fd_);
      const int n =
          ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (fl & O_APPEND));
      if (n >= 0) {
        wfd_ = n;
        mode_ = Mode::nonblocking;
      }
    }
  }

  void write(std::string_view data) {
    if (!ok_ || data.empty()) return;
    if (mode_ == Mode::blocking) {
      write_blocking(data);
      return;
    }
    if (pending() == 0) {
      buf_.clear();
      off_ = 0;
      data.remove_prefix(put(data));
      if (!ok_) return;
    }
    buf_.append(data);
  }

  // Writes what the reader takes now; never waits.
  void flush() {
    if (pending() == 0) return;
    off_ += put(std::string_view(buf_).substr(off_));
    if (off_ == buf_.size()) {
      buf_.clear();
      off_ = 0;
    } else if (off_ > kOutBuffer) {
      buf_.erase(0, off_);
      off_ = 0;
    }
  }

  std::size_t pending() const { return ok_ ? buf_.size() - off_ : 0; }
  bool full() const { return pending() >= kOutBuffer; }
  int poll_fd() const { return wfd_; }

  // At exit: forgets what the reader did not take; returns how many bytes that was.
  std::size_t drop() {
    const std::size_t n = pending();
    buf_.clear();
    off_ = 0;
    return n;
  }

 private:
  enum class Mode { blocking, nonblocking, socket };

  // One non-blocking attempt (as many writes as the reader takes); returns the bytes written.
  std::size_t put(std::string_view data) {
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t k =
          mode_ == Mode::socket
              ? ::send(wfd_, data.data() + done, data.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL)
              : ::write(wfd_, data.data() + done, data.size() - done);
      if (k > 0) {
        done += static_cast<std::size_t>(k);
      } else if (k < 0 && errno == EINTR) {
        continue;
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        // The reader went away (EPIPE) or the fd is bad: stop writing, but keep supervising
        // the ranks, which matters more than their output.
        ok_ = false;
        buf_.clear();
        off_ = 0;
        break;
      }
    }
    return done;
  }

  void write_blocking(std::string_view data) {
    while (ok_ && !data.empty()) {
      const ssize_t k = ::write(fd_, data.data(), data.size());
      if (k > 0) {
        data.remove_prefix(static_cast<std::size_t>(k));
      } else if (k < 0 && errno == EINTR) {
        continue;
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd_, POLLOUT, 0};  // before prepare(): a non-blocking fd we inherited
        ::poll(&p, 1, 1000);
      } else {
        ok_ = false;
      }
    }
  }

  int fd_;
  int wfd_;
  Mode mode_ = Mode::blocking;
  bool ok_ = true;
  std::string buf_;
  std::size_t off_ = 0;
};

OutStream g_stdout_stream(STDOUT_FILENO);
OutStream g_stderr_stream(STDERR_FILENO);
OutStream* g_stdout = &g_stdout_stream;
OutStream* g_stderr = &g_stderr_stream;

// Switches both streams to non-blocking writes; stdout and stderr that are one pipe or
// terminal (2>&1) become one stream, so their lines stay whole and in order.
void prepare_output() {
  struct stat a {
  }, b{};
  if (::fstat(STDOUT_FILENO, &a) == 0 && ::fstat(STDERR_FILENO, &b) == 0 && a.st_dev == b.st_dev &&
      a.st_ino == b.st_ino && !S_ISREG(a.st_mode)) {
    g_stderr = g_stdout;
  }
  g_stdout->prepare();
  if (g_stderr != g_stdout) g_stderr->prepare();
}

// Waits (poll, never spinning) until both streams are written out, or until no byte could be
// written for `stall_s` seconds, or a signal arrives on `sigfd` (when >= 0). Returns whether
// everything was written.
bool flush_output(double stall_s, int sigfd) {
  auto stall = kolo::Deadline::after(stall_s);
  for (;;) {
    g_stdout->flush();
    g_stderr->flush();
    std::vector<pollfd> fds;
    for (OutStream* s : {g_stdout, g_stderr}) {
      if (s->pending() > 0 && (fds.empty() || fds.back().fd != s->poll_fd())) {
        fds.push_back({s->poll_fd(), POLLOUT, 0});
      }
    }
    if (fds.empty()) return true;
    if (stall.expired()) return false;
    if (sigfd >= 0) fds.push_back({sigfd, POLLIN, 0});
    const std::size_t before = g_stdout->pending() + g_stderr->pending();
    const int rc = ::poll(fds.data(), fds.size(), stall.remaining_ms() + 1);
    if (sigfd >= 0 && rc > 0 && fds.back().revents != 0) {
      // A signal ends the wait (the user is not waiting for the reader either); SIGCHLD, a
      // watchdog's exit, does not.
      signalfd_siginfo si;
      while (::read(sigfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
        if (si.ssi_signo != SIGCHLD) return false;
      }
    }
    g_stdout->flush();
    g_stderr->flush();
    if (g_stdout->pending() + g_stderr->pending() < before) stall = kolo::Deadline::after(stall_s);
  }
}

// After flush_output gave up: drops what is left, with a note on stderr saying how much.
void drop_output() {
  const std::size_t out = g_stdout->drop();
  const std::size_t err = g_stderr == g_stdout ? 0 : g_stderr->drop();
  if (out + err == 0) return;
  g_stderr->write("[kolo-run: " + std::to_string(out + err) +
                  " bytes of output dropped, reader too slow]\n");
  g_stderr->flush();
}

void say(const std::string& msg) {
  g_stderr->write("kolo-run: " + msg + "\n");
}

// Splits one rank stream into lines and re-emits them with the rank prefix.
class LineRelay {
 public:
  LineRelay(OutStream* out, std::string prefix) : out_(out), prefix_(std::move(prefix)) {}

  void feed(const char* data, std::size_t n) {
    pending_.append(data, n);
    std::string batch;
    std::size_t start = 0;
    for (;;) {
      const std::size_t nl = pending_.find('\n', start);
      if (nl == std::string::npos) break;
      batch += prefix_;
      batch.append(pending_, start, nl + 1 - start);
      start = nl + 1;
    }
    pending_.erase(0, start);
    if (pending_.size() >= kMaxLine) emit_pending(batch);
    if (!batch.empty()) out_->write(batch);
  }

  // The stream this relay feeds holds as much as kolo-run buffers: read no more for now.
  bool full() const { return out_->full(); }

  // At EOF: a last line without '\n' is still output. With a prefix it gets a '\n' so the next
  // rank's line starts on a line of its own; without one the bytes pass through unchanged.
  void finish() {
    std::string batch;
    emit_pending(batch);
    if (!batch.empty()) out_->write(batch);
  }

 private:
  void emit_pending(std::string& batch) {
    if (pending_.empty()) return;
    batch += prefix_;
    batch += pending_;
    if (!prefix_.empty()) batch += '\n';
    pending_.clear();
  }

  OutStream* out_;
  std::string prefix_;
  std::string pending_;
};

// ---------------------------------------------------------------------------------------------
// Command line.

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Any other failure before the ranks start; carries the exit code to use.
class LaunchError : public std::runtime_error {
 public:
  LaunchError(const std::string& what, int code) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

struct HostSpec {
  std::string name;
  int slots = 0;
};

struct Options {
  int np = 0;
  std::vector<HostSpec> hosts;  // empty: all ranks on this machine, host key "local"
  std::optional<std::string> store_host;
  std::optional<double> timeout;
  std::string timeout_text;  // as the user wrote it, for the timeout message
  double grace = 3.0;
  std::string grace_text = "3";
  bool prefix = true;
  bool help = false;
  std::optional<std::string> ssh;    // --ssh, as written
  std::vector<std::string> exports;  // -x NAME or NAME=VALUE, in order
  std::vector<std::string> command;
};

std::optional<long long> parse_int(std::string_view s) {
  long long v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_seconds(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The variables kolo-run sets per rank (they replace inherited ones), and those it drops
// because they describe the job kolo-run itself may be part of (a stale fd number, another
// job's peers, another job's KOLO_JOB_ID, which would bind the ranks' store handshake to a job
// kolo-run's store is not: its fresh per-job secret already keeps jobs apart) and would mislead
// the ranks.
const std::set<std::string>& contract_variables() {
  static const std::set<std::string> names = {
      "KOLO_RANK",       "KOLO_SIZE",       "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
      "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE", "KOLO_STORE",      "KOLO_SECRET",
      "KOLO_HOST_KEY",   "KOLO_PEERS",      "KOLO_LISTEN_FD",  "KOLO_JOB_ID"};
  return names;
}

bool is_contract_variable(const std::string& name) {
  return contract_variables().count(name) != 0;
}

// Splits an ssh command line into words as a POSIX shell would, without expansions: blanks
// separate words; '...' keeps everything literally; "..." keeps everything but \" and \\; a
// backslash outside quotes takes the next character literally.
std::vector<std::string> split_words(const std::string& line, const std::string& what) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const auto end = line.find('\'', i + 1);
      if (end == std::string::npos) throw UsageError(what + " has an unterminated ' quote");
      word.append(line, i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      for (++i;; ++i) {
        if (i >= line.size()) throw UsageError(what + " has an unterminated \" quote");
        if (line[i] == '"') break;
        if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == '"' || line[i + 1] == '\\')) {
          ++i;
        }
        word += line[i];
      }
    } else if (c == '\\' && i + 1 < line.size()) {
      word += line[++i];
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

std::vector<HostSpec> parse_hosts(const std::string& value) {
  std::vector<HostSpec> hosts;
  std::set<std::string> seen;
  std::string_view rest = value;
  if (rest.empty()) throw UsageError("-H needs at least one host:slots entry");
  for (;;) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto colon = item.rfind(':');
    if (item.empty() || colon == std::string_view::npos || colon == 0) {
      throw UsageError("-H entry '" + std::string(item) + "' is not host:slots");
    }
    const std::string_view slots_text = item.substr(colon + 1);
    const auto slots = parse_int(slots_text);
    if (!slots || *slots < 1 || *slots > (1 << 20)) {
      throw UsageError("-H entry '" + std::string(item) + "' has slots '" +
                       std::string(slots_text) + "', which is not a positive integer");
    }
    HostSpec h{std::string(item.substr(0, colon)), static_cast<int>(*slots)};
    // A repeated host would make its local ranks ambiguous (one host key, two slot groups).
    if (!seen.insert(h.name).second) {
      throw UsageError("-H lists host '" + h.name + "' twice; give its slots once");
    }
    hosts.push_back(std::move(h));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return hosts;
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool np_given = false;
  std::optional<std::string> hosts_text;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    // The first word that is not an option is the program (mpirun's convention), so the
    // program's own options need no "--".
    if (arg.size() < 2 || arg[0] != '-') break;
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      if (const auto eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError("option " + name + " needs a value");
      return argv[++i];
    };
    if (name == "-h" || name == "--help") {
      o.help = true;
      return o;
    } else if (name == "-np" || name == "-n" || name == "--np") {
      const std::string v = value();
      const auto n = parse_int(v);
      if (!n) throw UsageError(name + " '" + v + "' is not an integer");
      if (*n < 1) throw UsageError(name + " " + v + ": the number of ranks must be at least 1");
      if (*n > (1 << 20)) throw UsageError(name + " " + v + " is too many ranks");
      o.np = static_cast<int>(*n);
      np_given = true;
    } else if (name == "-H" || name == "--hosts" || name == "--host") {
      hosts_text = value();
    } else if (name == "--store-host") {
      o.store_host = value();
      if (o.store_host->empty()) throw UsageError("--store-host needs a non-empty address");
    } else if (name == "--timeout") {
      o.timeout_text = value();
      o.timeout = parse_seconds(o.timeout_text);
      if (!o.timeout || *o.timeout <= 0) {
        throw UsageError("--timeout '" + o.timeout_text + "' is not a positive number of seconds");
      }
    } else if (name == "--grace") {
      const std::string v = value();
      const auto g = parse_seconds(v);
      if (!g || *g < 0) throw UsageError("--grace '" + v + "' is not a number of seconds >= 0");
      o.grace = *g;
      o.grace_text = v;
    } else if (name == "--ssh") {
      o.ssh = value();
    } else if (name == "-x") {
      o.exports.push_back(value());
    } else if (name == "--no-prefix") {
      if (inline_value) throw UsageError("option --no-prefix takes no value");
      o.prefix = false;
    } else {
      throw UsageError("unknown option '" + arg + "'");
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);

  for (const auto& x : o.exports) {
    const std::string name = x.substr(0, x.find('='));
    const bool ok =
        !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
        std::all_of(name.begin(), name.end(),
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!ok) throw UsageError("-x '" + x + "': expected NAME or NAME=VALUE");
    if (is_contract_variable(name)) {
      throw UsageError("-x " + name + ": kolo-run sets " + name + " itself, per rank");
    }
  }
  if (!np_given) throw UsageError("missing -np N (the number of ranks)");
  if (o.command.empty()) throw UsageError("missing the program to run");
  if (hosts_text) {
    o.hosts = parse_hosts(*hosts_text);
    long long slots = 0;
    for (const auto& h : o.hosts) slots += h.slots;
    if (slots < o.np) {
      throw UsageError("-H gives " + std::to_string(slots) + " slot(s) in total but -np is " +
                       std::to_string(o.np));
    }
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// Where ranks run.

enum class HostKind { this_machine, netns, ssh };

// An address of one of this machine's interfaces (numeric, as getifaddrs gives them).
bool is_own_address(const std::string& h) {
  std::string addr = h;
  if (addr.size() > 2 && addr.front() == '[' && addr.back() == ']') {
    addr = addr.substr(1, addr.size() - 2);
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[NI_MAXHOST] = {};
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(a->ifa_addr, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    std::string t(text);
    t = t.substr(0, t.find('%'));  // fe80::1%eth0: the scope is not part of what users write
    found = t == addr;
  }
  ::freeifaddrs(list);
  return found;
}

bool is_this_machine(const std::string& h) {
  if (h == "localhost" || h == "127.0.0.1" || h == "::1") return true;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) {
    const std::string full(name);
    if (h == full || h == full.substr(0, full.find('.'))) return true;
  }
  return is_own_address(h);
}

bool is_netns(const std::string& h) {
  // A name with '/' would let "-H ../../x" point anywhere: netns names are single components.
  if (h.empty() || h == "." || h == ".." || h.find('/') != std::string::npos) return false;
  struct stat st {};
  return ::stat(("/var/run/netns/" + h).c_str(), &st) == 0;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

struct RankPlan {
  int local_rank = 0;
  int local_size = 0;
  int cross_rank = 0;
  int cross_size = 0;
  std::string host_key;
  HostKind kind = HostKind::this_machine;
};

std::vector<RankPlan> plan_ranks(const Options& o) {
  std::vector<HostSpec> hosts = o.hosts;
  const bool default_host = hosts.empty();
  if (default_host) hosts.push_back({"local", o.np});
  std::vector<HostKind> kinds;
  for (const auto& h : hosts) {
    if (default_host || is_this_machine(h.name)) {
      kinds.push_back(HostKind::this_machine);
    } else if (is_netns(h.name)) {
      kinds.push_back(HostKind::netns);
    } else {
      // Anything else is another machine, reached with ssh ([user@]host, or an alias of the
      // user's ssh configuration).
      kinds.push_back(HostKind::ssh);
    }
  }
  // Fill hosts in -H order; hosts left without ranks do not count as hosts of the job.
  std::vector<RankPlan> plan;
  int cross = 0;
  for (std::size_t h = 0; h < hosts.size() && static_cast<int>(plan.size()) < o.np; ++h) {
    const int here = std::min(hosts[h].slots, o.np - static_cast<int>(plan.size()));
    for (int l = 0; l < here; ++l) {
      RankPlan p;
      p.local_rank = l;
      p.local_size = here;
      p.cross_rank = cross;
      p.host_key = hosts[h].name;
      p.kind = kinds[h];
      plan.push_back(std::move(p));
    }
    ++cross;
  }
  for (auto& p : plan) p.cross_size = cross;
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Finding the program (before anything starts, so a typo costs no half-started job).

std::string getenv_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(fallback);
}

// Resolves `prog` like execvp would. Throws LaunchError 127 (not found) or 126 (found, but
// not an executable file), naming the path.
std::string resolve_program(const std::string& prog) {
  auto check = [](const std::string& path) -> int {  // 0 ok, else errno
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EISDIR;
    if (::access(path.c_str(), X_OK) != 0) return errno;
    return 0;
  };
  if (prog.find('/') != std::string::npos) {
    const int err = check(prog);
    if (err == 0) return prog;
    throw LaunchError("cannot execute '" + prog + "': " + std::strerror(err),
                      err == ENOENT || err == ENOTDIR ? kExitNotFound : kExitNotExecutable);
  }
  const std::string path = getenv_or("PATH", "/usr/local/bin:/usr/bin:/bin");
  std::optional<std::pair<std::string, int>> unusable;
  std::string_view rest = path;
  for (;;) {
    const auto colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = ".";  // POSIX: an empty PATH entry is the current directory
    const std::string candidate = dir + "/" + prog;
    const int err = check(candidate);
    if (err == 0) return candidate;
    if (err != ENOENT && err != ENOTDIR && !unusable) unusable.emplace(candidate, err);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  if (unusable) {
    throw LaunchError(
        "cannot execute '" + unusable->first + "': " + std::strerror(unusable->second),
        kExitNotExecutable);
  }
  throw LaunchError("cannot execute '" + prog + "': not found in PATH=" + path, kExitNotFound);
}

std::string find_ip_command() {
  // `ip` lives in sbin, which a user's PATH often lacks.
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  try {
    return resolve_program("ip");
  } catch (const LaunchError&) {
    throw LaunchError(
        "the ip command (iproute2) is needed to start ranks in a network namespace, but it was "
        "not found in /usr/sbin, /sbin or PATH",
        kExitNotFound);
  }
}

// ---------------------------------------------------------------------------------------------
// Signals.

const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return nullptr;
  }
}

std::string describe_signal(int sig) {
  const char* n = signal_name(sig);
  return std::to_string(sig) + (n ? std::string(" (") + n + ")" : std::string());
}

// ---------------------------------------------------------------------------------------------
// Ranks on ssh hosts.

// The remote side of an ssh rank: run by `/bin/sh -c` on the remote host, with the program and
// its arguments as $1... It is one line without backslashes, so any POSIX login shell passes it
// on unchanged. What it does:
//   * reads one line from stdin, the job: `export 'KOLO_RANK=..' ... 'KOLO_SECRET=..'` plus a
//     few kolo_* settings, and evaluates it: the secret is never in an argument list;
//   * without --store-host, the store's address is the one this ssh connection came from
//     (SSH_CONNECTION), i.e. an address of kolo-run's machine that this host reaches;
//   * checks that it leads its process group (sshd starts every session with setsid(), and the
//     login shell execs this sh): the group is the rank with all it starts, and nothing else;
//   * a watcher (in the background, outside the program's way: its output goes to /dev/null)
//     reads the rest of stdin: "INT", "TERM", "HUP" are sent to the whole group; end-of-file
//     SIGKILLs the group. EOF comes when kolo-run closes the pipe, when ssh dies (kolo-run
//     SIGKILLed, the connection dropped: sshd closes the session) and when the rank has exited
//     (sshd closes the child's stdin then): nothing of the rank outlives it or kolo-run;
//   * runs the program in the foreground (so it keeps the default SIGINT disposition, which
//     sh would take from a background command) and exits with its status (128+S for signal S).
//     Its own `trap : INT TERM HUP` keeps it alive through a forwarded signal to report that;
//     its own stderr goes to /dev/null by then (the program gets the real one, fd 4, inside a
//     subshell, so that dash's "Killed" / "Terminated" notes, written to the stderr in effect
//     around the command, do not mix with the rank's output).
// Its first line on stdout, kStartedMarker, tells kolo-run that the ssh session is up (kolo-run
// removes it from the output). The watcher ignores TERM and HUP (sh ignores INT in background
// commands), so a forwarded signal does not end the channel.
constexpr const char* kRemotePrologue =
    "echo kolo-run-remote-prologue-started; "
    "IFS= read -r kolo_job || { echo \"kolo-run: no job description on stdin\" >&2; exit 1; }; "
    "eval \"$kolo_job\"; "
    "if [ -z \"${KOLO_STORE:-}\" ]; then kolo_c=${SSH_CONNECTION%% *}; "
    "if [ -z \"$kolo_c\" ]; then echo \"kolo-run: SSH_CONNECTION is not set on $kolo_host, so "
    "the store address is unknown there: pass --store-host\" >&2; exit 1; fi; "
    "case $kolo_c in *:*) kolo_c=\"[$kolo_c]\";; esac; "
    "export KOLO_STORE=\"$kolo_c:$kolo_port\"; fi; "
    "cd \"$kolo_wdir\" 2>/dev/null || cd; "
    "case $1 in */*) if [ ! -e \"$1\" ]; then echo \"kolo-run: cannot execute $1 on $kolo_host "
    "(in $PWD): No such file or directory\" >&2; exit 127; "
    "elif [ -d \"$1\" ] || [ ! -x \"$1\" ]; then echo \"kolo-run: cannot execute $1 on "
    "$kolo_host: Permission denied\" >&2; exit 126; fi;; "
    "*) command -v \"$1\" >/dev/null 2>&1 || { echo \"kolo-run: cannot execute $1 on $kolo_host: "
    "not found in PATH=$PATH\" >&2; exit 127; };; esac; "
    "kill -s 0 -- \"-$$\" 2>/dev/null || { echo \"kolo-run: the remote shell on $kolo_host does "
    "not lead a process group of its own, so its rank could not be stopped\" >&2; exit 1; }; "
    "trap : INT TERM HUP; "
    "exec 3<&0 </dev/null 4>&2 2>/dev/null; "
    "{ trap \"\" TERM HUP; while IFS= read -r kolo_sig <&3; do case $kolo_sig in INT|TERM|HUP) "
    "kill -s \"$kolo_sig\" -- \"-$$\";; esac; done; kill -s KILL -- \"-$$\"; } "
    ">/dev/null 2>&1 4>&- & "
    "exec 3<&-; "
    "(exec \"$@\" 2>&4 4>&-); kolo_rc=$?; exit \"$kolo_rc\"";

constexpr std::string_view kStartedMarker = "kolo-run-remote-prologue-started";

// sshd refuses some of the connections that arrive while 10 others are still authenticating
// (its default MaxStartups 10:30:100), so kolo-run keeps at most this many ssh ranks per host
// between "ssh started" and "the remote prologue runs"; the others wait their turn.
constexpr int kMaxStartingPerHost = 8;

// `s` as one word for a POSIX shell: single quotes, a ' inside as '\''.
std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

// The name ssh connects to: the -H name, without the brackets of an IPv6 address.
std::string ssh_destination(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// ---------------------------------------------------------------------------------------------
// The job.

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

struct Rank {
  int index = 0;
  pid_t pid = -1;        // also its process group id (for an ssh rank: of its local ssh client)
  pid_t watchdog = -1;   // ranks here: their watchdog (kolo-run's child; rank_watchdog.hpp)
  int chan_fd = -1;      // ranks here: kolo-run's end of the socket to the watchdog
  std::string chan_buf;  // ... and what came on it, not yet a whole message
  bool alive = false;
  bool signalled = false;  // kolo-run itself sent it a signal: its death is not "a failure"
  HostKind kind = HostKind::this_machine;
  std::string host;  // the -H name
  int out_fd = -1;
  int err_fd = -1;
  int ctl_fd = -1;        // ssh ranks: the write end of ssh's stdin (job line, then control lines)
  bool starting = false;  // ssh ranks: started, the remote prologue not heard from yet
  std::string before_start;  // ssh ranks: stdout before kStartedMarker (login-script output)
  std::unique_ptr<LineRelay> out;
  std::unique_ptr<LineRelay> err;
};

class Job {
 public:
  Job(Options opts, std::vector<RankPlan> plan) : o_(std::move(opts)), plan_(std::move(plan)) {}

  ~Job() {
    // Reached early only on an error path: nothing may outlive kolo-run.
    for (auto& r : ranks_) {
      if (r.alive) kill_group(r, SIGKILL);
      close_fd(r.out_fd);
      close_fd(r.err_fd);
      close_fd(r.ctl_fd);
      close_fd(r.chan_fd);  // the watchdog ends what is left of the rank
    }
    wait_watchdogs();
    if (sigfd_ >= 0) ::close(sigfd_);
    if (devnull_ >= 0) ::close(devnull_);
  }

  int run() {
    setup_signals();
    prepare_output();
    resolve_paths();
    start_store();
    prepare_env();
    ranks_.reserve(static_cast<std::size_t>(o_.np));  // the poll loop holds Rank pointers
    for (int r = 0; r < o_.np; ++r) unspawned_.push_back(r);
    spawn_ready();
    if (o_.timeout) timeout_deadline_ = kolo::Deadline::after(*o_.timeout);
    loop();
    store_->stop();
    if (timed_out_) return kExitTimeout;
    if (first_failure_) return *first_failure_;
    if (interrupt_signal_) return 128 + interrupt_signal_;
    return 0;
  }

 private:
  enum class Phase { running, grace, terminating, killing };

  // Signals are taken through a signalfd in the poll loop, so they are blocked first: before
  // the store's threads exist (they inherit the mask, and a SIGINT delivered to one of them
  // would otherwise kill kolo-run without cleaning up).
  void setup_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
    if (::sigprocmask(SIG_BLOCK, &set, &orig_mask_) != 0) {
      throw LaunchError(std::string("sigprocmask failed: ") + std::strerror(errno), kExitInternal);
    }
    sigfd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd_ < 0) {
      throw LaunchError(std::string("signalfd failed: ") + std::strerror(errno), kExitInternal);
    }
    // A reader closing our stdout must not kill the launcher of a running job.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &orig_sigpipe_);
  }

  void resolve_paths() {
    auto first_of = [&](HostKind k) -> const RankPlan* {
      for (const auto& p : plan_) {
        if (p.kind == k) return &p;
      }
      return nullptr;
    };
    const RankPlan* ssh_rank = first_of(HostKind::ssh);
    const bool any_here = std::any_of(plan_.begin(), plan_.end(),
                                      [](const RankPlan& p) { return p.kind != HostKind::ssh; });
    // The program must exist here only when ranks run here; ssh hosts look for it themselves.
    program_ = any_here ? resolve_program(o_.command[0]) : o_.command[0];
    if (ssh_rank) prepare_ssh(*ssh_rank, any_here);
    const bool any_netns = std::any_of(plan_.begin(), plan_.end(),
                                       [](const RankPlan& p) { return p.kind == HostKind::netns; });
    if (any_netns) {
      if (!o_.store_host) {
        std::string ns;
        for (const auto& p : plan_) {
          if (p.kind == HostKind::netns) {
            ns = p.host_key;
            break;
          }
        }
        throw LaunchError(
            "host " + ns +
                " is a network namespace, which cannot reach a store on 127.0.0.1: pass "
                "--store-host ADDR with an address of this machine reachable from it",
            kExitUsage);
      }
      ip_ = find_ip_command();
    }
  }

  void prepare_ssh(const RankPlan& ssh_rank, bool any_here) {
    const std::string& host = ssh_rank.host_key;
    if (any_here && !o_.store_host) {
      // A rank here would reach the store on 127.0.0.1 and then advertise 127.0.0.1 to peers
      // on other machines.
      throw LaunchError("ranks run on this machine and on ssh host " + host +
                            ": pass --store-host ADDR, an address of this machine that " + host +
                            " reaches (the ranks here advertise the address they reach the "
                            "store by)",
                        kExitUsage);
    }
    const std::string what = o_.ssh ? "--ssh" : "KOLO_RUN_SSH";
    const std::string line = o_.ssh ? *o_.ssh : getenv_or("KOLO_RUN_SSH", "ssh");
    try {
      ssh_words_ = split_words(line, what + " '" + line + "'");
    } catch (const UsageError& e) {
      throw LaunchError(e.what(), kExitUsage);
    }
    if (ssh_words_.empty()) {
      throw LaunchError(what + " is empty: it must name the ssh command", kExitUsage);
    }
    try {
      ssh_words_[0] = resolve_program(ssh_words_[0]);
    } catch (const LaunchError& e) {
      throw LaunchError("host " + host + " is not this machine nor a network namespace, so its " +
                            "ranks start with ssh, but " + e.what(),
                        e.code());
    }
    // ssh's own defaults for a launcher: no terminal, never a prompt (a rank's ssh cannot
    // answer one), a bounded connect. Given after the user's words: ssh keeps the first value
    // of an option, so the user's win. Other remote shells (--ssh "rsh") get nothing added.
    const std::string base = ssh_words_[0].substr(ssh_words_[0].rfind('/') + 1);
    if (base == "ssh") {
      for (const char* w : {"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30"}) {
        ssh_words_.emplace_back(w);
      }
    }
    // (Another remote shell may well run on this machine: then loopback is its business.)
    if (base == "ssh" && o_.store_host && is_loopback(*o_.store_host)) {
      throw LaunchError("--store-host " + *o_.store_host +
                            " is a loopback address, which ranks on ssh host " + host +
                            " cannot reach: give an address of this machine that " + host +
                            " reaches, or leave --store-host out",
                        kExitUsage);
    }
    char cwd[4096];
    wdir_ = ::getcwd(cwd, sizeof(cwd)) ? cwd : "";
  }

  void start_store() {
    const bool all_local = std::all_of(plan_.begin(), plan_.end(), [](const RankPlan& p) {
      return p.kind == HostKind::this_machine;
    });
    // Loopback keeps a single-machine job's store invisible to the network; ranks in other
    // namespaces need it on every interface.
    std::string bind = "127.0.0.1";
    if (!all_local || (o_.store_host && !is_loopback(*o_.store_host))) {
      bind = o_.store_host && o_.store_host->find(':') != std::string::npos ? "::" : "0.0.0.0";
    }
    secret_ = kolo::net::generate_secret();
    try {
      store_ = kolo::StoreServer::listen(bind, 0, secret_);
    } catch (const std::exception& e) {
      throw LaunchError(
          std::string("cannot start the rendezvous store on ") + bind + ": " + e.what(),
          kExitInternal);
    }
    const std::string host = o_.store_host.value_or("127.0.0.1");
    const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    store_addr_ = shown + ":" + std::to_string(store_->port());
  }

  void prepare_env() {
    // Variables kolo-run sets per rank replace inherited ones. KOLO_PEERS and KOLO_LISTEN_FD
    // describe the job kolo-run itself may be part of (a stale fd number, another job's
    // peers) and would mislead the ranks, so they are dropped.
    // -x NAME=VALUE replaces an inherited NAME.
    std::set<std::string> set_by_x;
    for (const auto& x : o_.exports) {
      if (x.find('=') != std::string::npos) set_by_x.insert(x.substr(0, x.find('=')));
    }
    for (char** e = environ; *e; ++e) {
      const std::string_view kv(*e);
      const std::string name(kv.substr(0, kv.find('=')));
      if (is_contract_variable(name) || set_by_x.count(name)) continue;
      base_env_.emplace_back(kv);
      // ssh ranks start from the remote login's environment: kolo's own knobs follow them
      // (KOLO_TIMEOUT_SECONDS, KOLO_TRANSPORT, ...), except this machine's address and the
      // launcher's own setting.
      if (name.rfind("KOLO_", 0) == 0 && name != "KOLO_ADDR" && name != "KOLO_RUN_SSH") {
        ssh_env_.emplace_back(kv);
      }
    }
    for (const auto& x : o_.exports) {
      if (x.find('=') != std::string::npos) {
        base_env_.push_back(x);
        ssh_env_.push_back(x);
        continue;
      }
      const char* v = std::getenv(x.c_str());
      if (!v)
        throw LaunchError("-x " + x + ": " + x + " is not set in this environment", kExitUsage);
      ssh_env_.push_back(x + "=" + v);
    }
    if (!ssh_words_.empty()) {
      for (const auto& kv : ssh_env_) {
        if (kv.find('\n') != std::string::npos) {
          throw LaunchError("the value of " + kv.substr(0, kv.find('=')) +
                                " has a newline, which cannot be passed to ssh hosts",
                            kExitUsage);
        }
      }
    }
    devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    // Ranks run in their own process groups, so a rank reading a terminal would be stopped by
    // SIGTTIN; rank 0 therefore gets stdin only when it is not a terminal (a file or pipe).
    rank0_stdin_ = ::isatty(STDIN_FILENO) ? devnull_ : STDIN_FILENO;
  }

  std::vector<std::string> env_for(int r) const {
    const RankPlan& p = plan_[static_cast<std::size_t>(r)];
    std::vector<std::string> env = base_env_;
    auto add = [&](const char* k, const std::string& v) {
      env.push_back(std::string(k) + "=" + v);
    };
    add("KOLO_RANK", std::to_string(r));
    add("KOLO_SIZE", std::to_string(o_.np));
    add("KOLO_LOCAL_RANK", std::to_string(p.local_rank));
    add("KOLO_LOCAL_SIZE", std::to_string(p.local_size));
    add("KOLO_CROSS_RANK", std::to_string(p.cross_rank));
    add("KOLO_CROSS_SIZE", std::to_string(p.cross_size));
    add("KOLO_STORE", store_addr_);
    add("KOLO_SECRET", secret_);
    add("KOLO_HOST_KEY", p.host_key);
    return env;
  }

  // The one line an ssh rank's prologue evaluates: its variables (the secret among them) and
  // kolo_* settings for the prologue itself.
  std::string job_line(int r) const {
    const RankPlan& p = plan_[static_cast<std::size_t>(r)];
    std::string line = "export";
    auto add = [&](const std::string& kv) { line += " " + sh_quote(kv); };
    for (const auto& kv : ssh_env_) add(kv);
    add("KOLO_RANK=" + std::to_string(r));
    add("KOLO_SIZE=" + std::to_string(o_.np));
    add("KOLO_LOCAL_RANK=" + std::to_string(p.local_rank));
    add("KOLO_LOCAL_SIZE=" + std::to_string(p.local_size));
    add("KOLO_CROSS_RANK=" + std::to_string(p.cross_rank));
    add("KOLO_CROSS_SIZE=" + std::to_string(p.cross_size));
    if (o_.store_host) add("KOLO_STORE=" + store_addr_);
    add("KOLO_SECRET=" + secret_);
    add("KOLO_HOST_KEY=" + p.host_key);
    // Without --store-host, the prologue exports no KOLO_STORE of its own making unless unset:
    // an inherited one from the remote login must not win.
    if (!o_.store_host) line = "unset KOLO_STORE; " + line;
    line += "; kolo_port=" + std::to_string(store_->port()) +
            "; kolo_host=" + sh_quote(p.host_key) + "; kolo_wdir=" + sh_quote(wdir_) + "\n";
    return line;
  }

  static void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  void spawn(int r) {
    const RankPlan& p = plan_[static_cast<std::size_t>(r)];
    // Everything the child needs is built here: between fork and exec only async-signal-safe
    // calls are allowed (the store's threads may hold the allocator's locks).
    const bool ssh = p.kind == HostKind::ssh;
    std::vector<std::string> args;
    std::vector<std::string> env;
    std::string job;
    if (ssh) {
      // ssh [user's words] [defaults] host "exec /bin/sh -c '<prologue>' kolo-rank 'prog' 'arg'..."
      // The ssh client gets this environment without the contract: the secret goes down the pipe.
      args = ssh_words_;
      args.push_back(ssh_destination(p.host_key));
      std::string remote = "exec /bin/sh -c " + sh_quote(kRemotePrologue) + " kolo-rank";
      for (const auto& a : o_.command) remote += " " + sh_quote(a);
      args.push_back(remote);
      env = base_env_;
      job = job_line(r);
      if (job.size() > 60000) {
        throw LaunchError("the environment passed to ssh hosts is " + std::to_string(job.size()) +
                              " bytes, more than the 60000 kolo-run sends: forward less (-x)",
                          kExitUsage);
      }
    } else {
      if (p.kind == HostKind::netns) args = {ip_, "netns", "exec", p.host_key};
      args.push_back(program_);
      args.insert(args.end(), o_.command.begin() + 1, o_.command.end());
      env = env_for(r);
    }
    const std::string exe = args[0];
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    // Ranks here start through a watchdog (rank_watchdog.hpp) that reports on a socket; ssh
    // ranks are kolo-run's own children (their remote prologue is their watchdog).
    int out[2] = {-1, -1}, err[2] = {-1, -1}, status_pipe[2] = {-1, -1}, ctl[2] = {-1, -1};
    int chan[2] = {-1, -1};
    auto close_all = [&] {
      for (int* p : {out, err, status_pipe, ctl, chan}) {
        close_fd(p[0]);
        close_fd(p[1]);
      }
    };
    const bool made = ::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0 &&
                      (ssh ? ::pipe2(status_pipe, O_CLOEXEC) == 0 && ::pipe2(ctl, O_CLOEXEC) == 0
                           : ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) == 0);
    if (!made) {
      const int e = errno;
      close_all();
      throw LaunchError("cannot create pipes for rank " + std::to_string(r) + ": " +
                            std::strerror(e) + " (errno " + std::to_string(e) + ")",
                        kExitInternal);
    }
    const int in_fd = ssh ? ctl[0] : r == 0 ? rank0_stdin_ : devnull_;
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int e = errno;
      close_all();
      throw LaunchError("cannot start rank " + std::to_string(r) + ": fork failed: " +
                            std::strerror(e) + " (errno " + std::to_string(e) + ")",
                        kExitInternal);
    }
    if (pid == 0 && !ssh) {
      const kolo_run::WatchdogSpec spec{
          in_fd,          out[1],
          err[1],         chan[1],
          exe.c_str(),    argv.data(),
          envp.data(),    &orig_mask_,
          &orig_sigpipe_, static_cast<int>(kKillAfterTermSeconds * 1000)};
      kolo_run::run_watchdog(spec);
    }
    if (pid == 0) {
      // Own process group: kolo-run signals the rank together with whatever it starts.
      ::setpgid(0, 0);
      // Die with kolo-run, whatever kills it. (The signal follows the death of the forking
      // *thread*; this is the main thread, which lives as long as kolo-run.) The remote side
      // sees its ssh session end and SIGKILLs the rank's group there.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(kExitInternal);  // kolo-run died before prctl
      auto to = [](int fd, int target) {
        if (fd == target) {
          ::fcntl(fd, F_SETFD, 0);  // dup2 onto itself would keep O_CLOEXEC
        } else {
          ::dup2(fd, target);
        }
      };
      to(in_fd, STDIN_FILENO);
      to(out[1], STDOUT_FILENO);
      to(err[1], STDERR_FILENO);
      ::sigprocmask(SIG_SETMASK, &orig_mask_, nullptr);
      ::sigaction(SIGPIPE, &orig_sigpipe_, nullptr);
      ::execve(exe.c_str(), argv.data(), envp.data());
      const int e = errno;
      [[maybe_unused]] ssize_t k = ::write(status_pipe[1], &e, sizeof(e));
      ::_exit(e == ENOENT ? kExitNotFound : kExitNotExecutable);
    }
    if (ssh) ::setpgid(pid, pid);  // also from here, so kill(-pid) works whichever runs first
    close_fd(out[1]);
    close_fd(err[1]);
    close_fd(status_pipe[1]);
    close_fd(chan[1]);
    if (ssh) {
      close_fd(ctl[0]);
      // The job line fits in the pipe (at most 60000 bytes of its 64 KiB), so this returns at
      // once whatever ssh does; later control lines are written without blocking.
      std::string_view rest = job;
      while (!rest.empty()) {
        const ssize_t k = ::write(ctl[1], rest.data(), rest.size());
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;  // ssh already gone: its exit status tells the rest
        rest.remove_prefix(static_cast<std::size_t>(k));
      }
      ::fcntl(ctl[1], F_SETFL, O_NONBLOCK);
    }

    Rank rank;
    rank.index = r;
    rank.pid = ssh ? pid : -1;
    rank.watchdog = ssh ? -1 : pid;
    rank.alive = ssh;
    rank.kind = p.kind;
    rank.host = p.host_key;
    rank.out_fd = out[0];
    rank.err_fd = err[0];
    rank.ctl_fd = ctl[1];
    rank.chan_fd = chan[0];
    rank.starting = ssh;
    const std::string prefix = o_.prefix ? "[" + std::to_string(r) + "] " : std::string();
    rank.out = std::make_unique<LineRelay>(g_stdout, prefix);
    rank.err = std::make_unique<LineRelay>(g_stderr, prefix);
    ::fcntl(rank.out_fd, F_SETFL, O_NONBLOCK);
    ::fcntl(rank.err_fd, F_SETFL, O_NONBLOCK);
    ranks_.push_back(std::move(rank));
    Rank& added = ranks_.back();

    // ssh: the status pipe closes on a successful exec (O_CLOEXEC) or carries exec's errno.
    // Here: the watchdog's first message carries the rank's pid and exec's errno.
    int exec_errno = 0;
    if (ssh) {
      ssize_t k;
      do {
        k = ::read(status_pipe[0], &exec_errno, sizeof(exec_errno));
      } while (k < 0 && errno == EINTR);
      close_fd(status_pipe[0]);
      if (k != static_cast<ssize_t>(sizeof(exec_errno))) exec_errno = 0;
    } else {
      kolo_run::WatchdogMsg m{};
      std::size_t got = 0;
      while (got < sizeof(m)) {
        const ssize_t k = ::read(added.chan_fd, reinterpret_cast<char*>(&m) + got, sizeof(m) - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += static_cast<std::size_t>(k);
      }
      if (got < sizeof(m) || m.kind != kolo_run::kMsgStarted) {
        throw LaunchError("cannot start rank " + std::to_string(r) +
                              ": its watchdog process ended before starting it",
                          kExitInternal);
      }
      if (m.a <= 0) {
        throw LaunchError("cannot start rank " + std::to_string(r) + ": fork failed: " +
                              std::strerror(m.b) + " (errno " + std::to_string(m.b) + ")",
                          kExitInternal);
      }
      added.pid = m.a;
      added.alive = true;
      exec_errno = m.b;
      ::fcntl(added.chan_fd, F_SETFL, O_NONBLOCK);
    }
    if (exec_errno != 0) {
      throw LaunchError("cannot execute '" + exe + "' for rank " + std::to_string(r) + ": " +
                            std::strerror(exec_errno),
                        exec_errno == ENOENT ? kExitNotFound : kExitNotExecutable);
    }
  }

  void kill_group(const Rank& r, int sig) {
    if (r.pid > 0) ::kill(-r.pid, sig);  // ESRCH is fine: the group is already empty
  }

  // Waits for the watchdogs: each exits once its rank's tree is gone (at most
  // kKillAfterTermSeconds after its socket closed, plus SIGKILL's moment).
  void wait_watchdogs() {
    for (auto& r : ranks_) {
      close_fd(r.chan_fd);
      if (r.watchdog > 0) {
        while (::waitpid(r.watchdog, nullptr, 0) < 0 && errno == EINTR) {
        }
        r.watchdog = -1;
      }
    }
  }

  // --- the poll loop --------------------------------------------------------------------------

  void loop() {
    // What each pollfd after the signalfd is: a rank's stdout/stderr pipe, a watchdog's socket,
    // or one of kolo-run's own output streams waiting to take more.
    enum class Src { out, err, chan, stream };
    struct Owner {
      Rank* rank;
      Src src;
      OutStream* stream;
    };
    std::vector<pollfd> fds;
    std::vector<Owner> owners;
    while (!unspawned_.empty() ||
           std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.alive; })) {
      fds.clear();
      owners.clear();
      fds.push_back({sigfd_, POLLIN, 0});
      for (auto& r : ranks_) {
        // A stream that holds kOutBuffer bytes is not fed more: its ranks wait (back-pressure),
        // kolo-run does not.
        if (r.out_fd >= 0 && !r.out->full()) {
          fds.push_back({r.out_fd, POLLIN, 0});
          owners.push_back({&r, Src::out, nullptr});
        }
        if (r.err_fd >= 0 && !r.err->full()) {
          fds.push_back({r.err_fd, POLLIN, 0});
          owners.push_back({&r, Src::err, nullptr});
        }
        if (r.chan_fd >= 0) {
          fds.push_back({r.chan_fd, POLLIN, 0});
          owners.push_back({&r, Src::chan, nullptr});
        }
      }
      for (OutStream* s : {g_stdout, g_stderr}) {
        if (s->pending() > 0 && !(s == g_stderr && g_stderr == g_stdout)) {
          fds.push_back({s->poll_fd(), POLLOUT, 0});
          owners.push_back({nullptr, Src::stream, s});
        }
      }
      const int rc = ::poll(fds.data(), fds.size(), next_timeout_ms());
      if (rc < 0 && errno != EINTR) {
        throw LaunchError(std::string("poll failed: ") + std::strerror(errno), kExitInternal);
      }
      if (rc > 0) {
        for (std::size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents == 0) continue;
          const Owner& o = owners[i - 1];
          if (o.src == Src::stream) {
            o.stream->flush();
          } else if (o.src != Src::chan) {  // the sockets are read by reap()
            read_some(*o.rank, o.src == Src::err, 1);
          }
        }
        if (fds[0].revents != 0) handle_signals();
      }
      reap();  // also without SIGCHLD: signalfd merges signals, reaping is idempotent
      check_deadlines();
      spawn_ready();
    }
    // Every rank is gone: what they wrote is already in the pipes. Anything a leftover
    // grandchild writes later is not waited for (it could hold the pipe open for ever), nor a
    // reader that takes nothing for kFlushStallSeconds (then the rest is dropped, counted).
    const double stall = timed_out_ || interrupt_signal_ ? kFlushStallTornDown : kFlushStallSeconds;
    bool gave_up = false;
    for (int round = 0; round < 256 && !gave_up; ++round) {
      bool read_any = false;
      bool blocked = false;
      for (auto& r : ranks_) {
        for (const bool is_err : {false, true}) {
          if ((is_err ? r.err_fd : r.out_fd) < 0) continue;
          if ((is_err ? r.err : r.out)->full()) {
            blocked = true;
          } else {
            read_any = read_some(r, is_err, 1) > 0 || read_any;
          }
        }
      }
      if (!read_any && !blocked) break;
      if (blocked) gave_up = !flush_output(stall, sigfd_);
    }
    for (auto& r : ranks_) {
      r.out->finish();
      r.err->finish();
      close_fd(r.out_fd);
      close_fd(r.err_fd);
      close_fd(r.ctl_fd);
    }
    if (!flush_output(gave_up ? 0.0 : stall, sigfd_)) drop_output();
    if (phase_ != Phase::running) {
      // A torn-down job leaves nothing behind: the groups may still hold helpers the ranks
      // started.
      for (auto& r : ranks_) kill_group(r, SIGKILL);
    }
    // The watchdogs release what the ranks left (SIGTERM, then SIGKILL) and exit.
    wait_watchdogs();
  }

  // Reads up to `max_reads` chunks from one of a rank's pipes, fewer once the stream it feeds
  // is full; returns how many it read.
  int read_some(Rank& r, bool is_err, int max_reads) {
    int& fd = is_err ? r.err_fd : r.out_fd;
    LineRelay& relay = is_err ? *r.err : *r.out;
    char buf[65536];
    int got = 0;
    for (int n = 0; fd >= 0 && n < max_reads && !relay.full(); ++n) {
      const ssize_t k = ::read(fd, buf, sizeof(buf));
      if (k > 0) {
        ++got;
        if (!is_err && r.starting) {
          feed_before_start(r, buf, static_cast<std::size_t>(k));
        } else {
          relay.feed(buf, static_cast<std::size_t>(k));
        }
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return got;
      if (!is_err && r.starting) {  // the session ended before the prologue spoke
        r.starting = false;
        relay.feed(r.before_start.data(), r.before_start.size());
        r.before_start.clear();
      }
      relay.finish();  // EOF (or a broken pipe): flush a partial last line
      close_fd(fd);
      return got;
    }
    return got;
  }

  // An ssh rank's stdout until the prologue's marker line: lines before it (a login script's)
  // pass on; the marker is dropped and ends the rank's "starting" state.
  void feed_before_start(Rank& r, const char* data, std::size_t n) {
    std::string& b = r.before_start;
    b.append(data, n);
    std::size_t start = 0;
    for (;;) {
      const std::size_t nl = b.find('\n', start);
      if (nl == std::string::npos) break;
      const std::string_view line(b.data() + start, nl - start);
      start = nl + 1;
      if (line.size() >= kStartedMarker.size() &&
          line.substr(line.size() - kStartedMarker.size()) == kStartedMarker) {
        // A login script's last words without a newline share the marker's line.
        std::string before(line.substr(0, line.size() - kStartedMarker.size()));
        if (!before.empty()) r.out->feed((before + "\n").data(), before.size() + 1);
        r.starting = false;
        const std::string rest = b.substr(start);
        b.clear();
        if (!rest.empty()) r.out->feed(rest.data(), rest.size());
        return;
      }
      r.out->feed(b.data() + (start - line.size() - 1), line.size() + 1);
    }
    b.erase(0, start);
    if (b.size() > kMaxLine) {  // no line end for this long: not the marker's line
      r.out->feed(b.data(), b.size());
      b.clear();
    }
  }

  // Starts the ranks not started yet, in rank order, as far as kMaxStartingPerHost allows; once
  // the job is being torn down, the rest never start.
  void spawn_ready() {
    if (unspawned_.empty()) return;
    if (phase_ != Phase::running) {
      unspawned_.clear();
      return;
    }
    std::map<std::string, int> starting;
    for (const auto& r : ranks_) {
      if (r.alive && r.starting) ++starting[r.host];
    }
    std::vector<int> later;
    for (const int idx : unspawned_) {
      const RankPlan& p = plan_[static_cast<std::size_t>(idx)];
      if (p.kind == HostKind::ssh) {
        if (starting[p.host_key] >= kMaxStartingPerHost) {
          later.push_back(idx);
          continue;
        }
        ++starting[p.host_key];
      }
      spawn(idx);
    }
    unspawned_ = std::move(later);
  }

  // Takes what a rank left in its pipes, bounded so a chatty grandchild cannot stall us.
  void drain(Rank& r) {
    read_some(r, false, 256);
    read_some(r, true, 256);
  }

  int next_timeout_ms() const {
    std::optional<kolo::Deadline> next;
    auto consider = [&](const std::optional<kolo::Deadline>& d) {
      if (d) next = next ? next->earlier(*d) : *d;
    };
    if (!timed_out_ && phase_ < Phase::terminating) consider(timeout_deadline_);
    if (phase_ == Phase::grace) consider(grace_deadline_);
    if (phase_ == Phase::terminating) consider(kill_deadline_);
    if (!next) return -1;
    // +1 ms: poll rounds down, and waking just before a deadline would spin once more.
    return next->expired() ? 0 : next->remaining_ms() + 1;
  }

  void handle_signals() {
    signalfd_siginfo si;
    while (::read(sigfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      const int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) continue;  // reap() runs after every wake-up
      if (interrupt_signal_ == 0) {
        interrupt_signal_ = sig;
        say(std::string("received ") + signal_name(sig) + "; forwarding it to all ranks");
        signal_ranks(sig, false);
        begin_grace();
      } else {
        // A second Ctrl-C means "now": the user is not waiting for the grace period.
        say(std::string("received ") + signal_name(sig) + " again; killing all ranks");
        signal_ranks(SIGKILL, false);
        phase_ = Phase::killing;
      }
    }
  }

  void reap() {
    // Ranks reaped in one pass died at about the same time, and waitpid's order says nothing
    // about which came first. A rank killed by a signal is the likely cause (the others usually
    // exit reporting its loss), so within a pass it is the one whose code kolo-run returns.
    struct Failure {
      int code;
      int rank;
      bool by_signal;
    };
    std::vector<Failure> failures;
    reap_pass(failures);
    if (failures.empty() || first_failure_) return;
    auto pick = std::find_if(failures.begin(), failures.end(),
                             [](const Failure& f) { return f.by_signal; });
    if (pick == failures.end()) pick = failures.begin();
    first_failure_ = pick->code;
    failed_rank_ = pick->rank;
    begin_grace();
  }

  template <class Failures>
  void reap_pass(Failures& failures) {
    for (auto& r : ranks_) read_chan(r, failures);
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (auto& r : ranks_) {
        if (r.watchdog == pid) {
          r.watchdog = -1;
          read_chan(r, failures);  // its last message may still wait in the socket
          close_fd(r.chan_fd);
          if (r.alive) {
            // The watchdog itself was killed: its rank dies with it (PR_SET_PDEATHSIG), and
            // the watchdog's own death is the closest account of the rank's.
            kill_group(r, SIGKILL);
            rank_exited(r, status, failures);
          }
        } else if (r.kind == HostKind::ssh && r.pid == pid && r.alive) {
          rank_exited(r, status, failures);
        }
      }
    }
  }

  // The watchdog's messages: the rank's exit status (its start was read by spawn()).
  template <class Failures>
  void read_chan(Rank& r, Failures& failures) {
    char buf[256];
    while (r.chan_fd >= 0) {
      const ssize_t k = ::recv(r.chan_fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (k > 0) {
        r.chan_buf.append(buf, static_cast<std::size_t>(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) close_fd(r.chan_fd);
      break;
    }
    while (r.chan_buf.size() >= sizeof(kolo_run::WatchdogMsg)) {
      kolo_run::WatchdogMsg m{};
      std::memcpy(&m, r.chan_buf.data(), sizeof(m));
      r.chan_buf.erase(0, sizeof(m));
      if (m.kind == kolo_run::kMsgExited && r.alive) rank_exited(r, m.a, failures);
    }
  }

  template <class Failures>
  void rank_exited(Rank& r, int status, Failures& failures) {
    {
      r.alive = false;
      close_fd(r.ctl_fd);
      // The rank's last words (e.g. its exception) come before kolo-run's verdict on it.
      drain(r);
      int code = 0;
      std::string how;
      bool by_signal = false;
      const bool ssh = r.kind == HostKind::ssh;
      if (WIFEXITED(status)) {
        code = WEXITSTATUS(status);
        how = "exited with code " + std::to_string(code);
        if (ssh && code == 255) {
          how +=
              " (ssh's code for its own failures: unreachable host, refused authentication or "
              "a dropped connection; ssh's message, if any, is above)";
        } else if (ssh && code > 128 && code <= 128 + 64) {
          // The remote shell's status: 128+S is how it reports a death by signal S.
          how = "killed by signal " + describe_signal(code - 128);
          by_signal = true;
        }
      } else if (WIFSIGNALED(status)) {
        code = 128 + WTERMSIG(status);
        how = "killed by signal " + describe_signal(WTERMSIG(status));
        if (WCOREDUMP(status)) how += " (core dumped)";
        if (ssh) how = "lost: its ssh client was " + how;
        by_signal = true;
      }
      if (code == 0 || r.signalled) return;  // success, or the death kolo-run asked for
      say("rank " + std::to_string(r.index) + (ssh ? " on " + r.host : std::string()) + " " + how);
      failures.push_back({code, r.index, by_signal});
    }
  }

  void begin_grace() {
    if (phase_ != Phase::running) return;
    phase_ = Phase::grace;
    grace_deadline_ = kolo::Deadline::after(o_.grace);
  }

  // Signals the process group of every rank still running (and, with `all_groups`, also of
  // ranks already gone, whose helpers may still run in their groups).
  std::vector<int> signal_ranks(int sig, bool all_groups) {
    std::vector<int> hit;
    for (auto& r : ranks_) {
      if (!r.alive && !all_groups) continue;
      if (r.kind == HostKind::ssh) {
        signal_remote(r, sig);
      } else {
        kill_group(r, sig);
      }
      if (r.alive) {
        r.signalled = true;
        hit.push_back(r.index);
      }
    }
    return hit;
  }

  // A signal for an ssh rank: INT, TERM and HUP travel as a control line to the remote
  // prologue, which signals the rank's process group there (the rank reports back through ssh
  // as usual). SIGKILL cannot wait for a connection that may be stuck: kolo-run closes the
  // control pipe and kills its ssh client; the remote side sees EOF and SIGKILLs the group.
  void signal_remote(Rank& r, int sig) {
    const char* name = sig == SIGINT    ? "INT\n"
                       : sig == SIGTERM ? "TERM\n"
                       : sig == SIGHUP  ? "HUP\n"
                                        : nullptr;
    if (name && r.ctl_fd >= 0) {
      // Non-blocking and tiny: a pipe that is full already holds a signal the remote has not
      // read yet, and SIGKILL follows anyway.
      [[maybe_unused]] const ssize_t k = ::write(r.ctl_fd, name, std::strlen(name));
      return;
    }
    if (sig == SIGKILL) {
      close_fd(r.ctl_fd);
      ::kill(-r.pid, SIGKILL);
    }
  }

  void check_deadlines() {
    if (!timed_out_ && phase_ < Phase::terminating && timeout_deadline_ &&
        timeout_deadline_->expired()) {
      timed_out_ = true;
      say("job exceeded --timeout " + o_.timeout_text + " seconds; killing all ranks");
      terminate();
      return;
    }
    if (phase_ == Phase::grace && grace_deadline_->expired()) {
      terminate();
    } else if (phase_ == Phase::terminating && kill_deadline_->expired()) {
      phase_ = Phase::killing;
      const auto hit = signal_ranks(SIGKILL, true);
      if (!hit.empty()) {
        say("sending SIGKILL to rank(s) " + rank_list(hit) + " (still running " +
            std::to_string(static_cast<int>(kKillAfterTermSeconds)) + " s after SIGTERM)");
      }
    }
  }

  void terminate() {
    phase_ = Phase::terminating;
    kill_deadline_ = kolo::Deadline::after(kKillAfterTermSeconds);
    const auto hit = signal_ranks(SIGTERM, true);
    if (!hit.empty() && !timed_out_) {
      const std::string after =
          failed_rank_ >= 0 ? "rank " + std::to_string(failed_rank_) + " failed"
                            : "the forwarded " + std::string(signal_name(interrupt_signal_));
      say("sending SIGTERM to rank(s) " + rank_list(hit) + " (still running " + o_.grace_text +
          " s after " + after + ")");
    }
  }

  Options o_;
  std::vector<RankPlan> plan_;
  std::string program_;
  std::string ip_;
  std::string secret_;
  std::string store_addr_;
  std::unique_ptr<kolo::StoreServer> store_;
  std::vector<std::string> base_env_;
  std::vector<std::string> ssh_env_;    // NAME=VALUE passed to ssh ranks besides the contract
  std::vector<std::string> ssh_words_;  // the ssh command and its options (with kolo-run's)
  std::string wdir_;                    // ssh ranks start in this directory when it exists there
  std::vector<Rank> ranks_;             // in start order; reserved for np (pointers stay valid)
  std::vector<int> unspawned_;          // ranks waiting for their turn to start (ssh hosts)
  int devnull_ = -1;
  int rank0_stdin_ = STDIN_FILENO;
  int sigfd_ = -1;
  sigset_t orig_mask_{};
  struct sigaction orig_sigpipe_ {};

  Phase phase_ = Phase::running;
  std::optional<kolo::Deadline> timeout_deadline_;
  std::optional<kolo::Deadline> grace_deadline_;
  std::optional<kolo::Deadline> kill_deadline_;
  bool timed_out_ = false;
  int interrupt_signal_ = 0;
  std::optional<int> first_failure_;
  int failed_rank_ = -1;
};

// Pipes and /dev/null must not land on fds 0-2 if kolo-run was started with one closed: a
// rank's dup2 onto stdout would then be confused with the pipe itself.
void ensure_std_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int n = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (n >= 0 && n != fd) ::close(n);  // open takes the lowest free fd, i.e. `fd`
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ensure_std_fds();
  Options opts;
  try {
    opts = parse_args(argc, argv);
  } catch (const UsageError& e) {
    g_stderr->write(std::string("kolo-run: ") + e.what() + "\n\n" + kUsage);
    return kExitUsage;
  }
  if (opts.help) {
    g_stdout->write(kUsage);
    return 0;
  }
  try {
    auto plan = plan_ranks(opts);
    int code = 0;
    {
      Job job(std::move(opts), std::move(plan));
      code = job.run();
    }
    return code;
  } catch (const LaunchError& e) {
    say(e.what());
    if (!flush_output(kFlushStallSeconds, -1)) drop_output();
    return e.code();
  } catch (const std::exception& e) {
    say(std::string("internal error: ") + e.what());
    if (!flush_output(kFlushStallSeconds, -1)) drop_output();
    return kExitInternal;
  }
}
