// Protocol abuse at every listening port of a job, during its setup, and bad environment values
// through real processes. The job must be unaffected (it connects, computes, verifies and exits
// 0), every hostile connection must be closed without an answer, nothing may crash, and the
// process serving the store must not grow (RSS +64 MiB at most) however large a length a frame
// header claims.
//
//   replayed handshakes   a relay records a real rank's authentication response (to the store,
//                         and to rank 0's data port); replayed on a new connection it must be
//                         refused — the server's nonce differs — with no proof sent back, while
//                         a fresh handshake with the secret does get the proof (the probe can
//                         tell the two apart).
//   hostile bytes         random bytes, a frame header claiming 4 GiB, truncated and silent
//                         handshakes, a wrong secret — at the store (rank 0's, and kolo-run's)
//                         and at every rank's data listener.
//   authenticated abuse   a client that knows the secret but breaks the store protocol: a 4 GiB
//                         length, a maximal frame left unfinished, truncated frames, a string
//                         overrunning its frame, an unknown op.
//   floods (h4)           1,000 idle/garbage strangers at a store: at most the handshake cap of
//                         descriptors held, a real client served at once; a real job whose ranks
//                         have 512 descriptors sets up under 600 strangers per data port and
//                         1,000 at its store; a client of another job id refused by the store.
//   sizes, files (h4)     counts whose bytes overflow: ConfigError on every rank; the tuning
//                         file's temporary and the timeline never follow a planted symlink.
#include <sys/stat.h>

#include <map>
#include <optional>

#include "harness.hpp"
#include "kolo/algorithm/tuning_probe.hpp"
#include "kolo/engine/timeline.hpp"
#include "kolo/topology/store.hpp"
#include "kolo/topology/topology.hpp"

using namespace kolo_faults;

namespace {

using kolo::net::Socket;

constexpr const char* kLoopback = "127.0.0.1";

Socket dial_to(const std::string& host, std::uint16_t port) {
  return kolo::net::connect_tcp(host, port, kolo::Deadline::after(10), "target");
}

// Sends what the peer takes; a peer that closes early is fine (it refused us).
void send_best_effort(int fd, const std::string& bytes) {
  try {
    kolo::net::send_all(fd, bytes.data(), bytes.size(), kolo::Deadline::after(5), "target");
  } catch (const kolo::Error&) {
  }
}

// Reads until the peer closes (EOF or reset) or `seconds` pass; returns the bytes received, or
// nullopt if the connection is still open.
std::optional<std::string> read_to_close(int fd, double seconds) {
  const auto dl = kolo::Deadline::after(seconds);
  std::string got;
  for (;;) {
    char buf[4096];
    const ssize_t k = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (k > 0) {
      got.append(buf, static_cast<std::size_t>(k));
      continue;
    }
    if (k == 0) return got;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return got;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, dl.remaining_ms()) == 0) return std::nullopt;
  }
}

struct Probe {
  std::string who;
  bool ok = false;
  std::string detail;
};

// Sends `bytes` right after connecting; ok if the server closes within `seconds`.
Probe probe_bytes(std::string who, const std::string& host, std::uint16_t port,
                  const std::string& bytes, double seconds = 12) {
  Probe p{std::move(who), false, ""};
  try {
    Socket s = dial_to(host, port);
    send_best_effort(s.fd(), bytes);
    const auto got = read_to_close(s.fd(), seconds);
    p.ok = got.has_value();
    p.detail = p.ok ? "closed after " + std::to_string(got->size()) + " bytes" : "kept open";
  } catch (const kolo::Error& e) {
    p.ok = true;  // could not even connect: refused
    p.detail = e.what();
  }
  return p;
}

// A frame header claiming 4 GiB (0xffffffff: the store's and the mesh's length fields are
// 32-bit), then 1 MiB of random bytes, as the first thing on a connection.
std::string huge_header() {
  return std::string(4, '\xff') + std::string(1, '\x01') + random_bytes(1 << 20);
}

// Replays `recorded` (a client's bytes captured by a relay) on a new connection: ok when the
// server closes without sending anything after its 40-byte challenge (no proof, no reply).
Probe probe_replay(std::string who, const std::string& host, std::uint16_t port,
                   const std::string& recorded) {
  Probe p{std::move(who), false, ""};
  try {
    Socket s = dial_to(host, port);
    char challenge[kolo::net::kChallengeSize];
    kolo::net::recv_all(s.fd(), challenge, sizeof(challenge), kolo::Deadline::after(10), "target");
    send_best_effort(s.fd(), recorded);
    const auto got = read_to_close(s.fd(), 12);
    p.ok = got.has_value() && got->empty();
    p.detail = !got           ? "kept open"
               : got->empty() ? "closed, nothing sent back"
                              : "answered " + std::to_string(got->size()) + " bytes";
  } catch (const kolo::Error& e) {
    p.detail = std::string("could not probe: ") + e.what();
  }
  return p;
}

// The control for probe_replay: a fresh handshake with the right secret gets the server's proof
// (authenticate_client verifies it), so "nothing sent back" above really means "refused".
Probe probe_fresh(std::string who, const std::string& host, std::uint16_t port,
                  const std::string& secret, kolo::net::Hello hello) {
  Probe p{std::move(who), false, ""};
  try {
    Socket s = dial_to(host, port);
    kolo::net::authenticate_client(s.fd(), secret, hello, kolo::Deadline::after(10), p.who);
    p.ok = true;
    p.detail = "proof received";
  } catch (const kolo::Error& e) {
    p.detail = e.what();
  }
  return p;
}

// An authenticated store client that then breaks the protocol with `frame`: ok if the store
// closes the connection.
Probe probe_store_frame(std::string who, std::uint16_t port, const std::string& secret,
                        const std::string& frame, bool close_after = false) {
  Probe p{std::move(who), false, ""};
  try {
    Socket s = dial_to(kLoopback, port);
    kolo::net::authenticate_client(s.fd(), secret, {kolo::net::kPurposeStore, -1, 0},
                                   kolo::Deadline::after(10), "store");
    send_best_effort(s.fd(), frame);
    if (close_after) {
      p.ok = true;  // a truncated frame and a hang-up: the store must just drop it
      p.detail = "sent and hung up";
      return p;
    }
    const auto got = read_to_close(s.fd(), 10);
    p.ok = got.has_value() && got->empty();
    p.detail = got ? "closed after " + std::to_string(got->size()) + " reply bytes" : "kept open";
  } catch (const kolo::Error& e) {
    p.detail = std::string("could not probe: ") + e.what();
  }
  return p;
}

std::string le32(std::uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// Runs probes on threads (each may wait for a server's timeout) and checks them at the end.
class Probes {
 public:
  void add(std::function<Probe()> f) {
    threads_.emplace_back([this, f = std::move(f)] {
      Probe p = f();
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back(std::move(p));
    });
  }
  void check() {
    for (auto& t : threads_) t.join();
    threads_.clear();
    const bool verbose = std::getenv("KOLO_FAULTS_VERBOSE") != nullptr;
    for (const auto& p : done_) {
      if (verbose) std::fprintf(stderr, "%s: %s\n", p.who.c_str(), p.detail.c_str());
      CHECK_MESSAGE(p.ok, p.who, ": ", p.detail);
    }
    done_.clear();
  }
  ~Probes() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::vector<Probe> done_;
};

// Sends "go" to ranks waiting in `clean` mode and checks that all of them verified their
// allreduces and exited 0.
void finish_clean_job(const std::vector<Proc*>& all, double limit) {
  for (Proc* p : all) p->write_stdin("go\n");
  const bool finished = finish_all(all, limit);
  std::string outputs;
  for (std::size_t i = 0; i < all.size(); ++i) {
    outputs += "--- process " + std::to_string(i) + ":\n" + all[i]->output();
  }
  INFO(outputs);
  REQUIRE(finished);
  for (Proc* p : all) CHECK(p->code() == 0);
  CHECK(count_of(outputs, "KOLO_OK rank=") == static_cast<int>(all.size()));
}

}  // namespace

// The store of rank 0 (torchrun's convention) and rank 0's data port, each behind a recording
// relay; the recorded authentication responses of real ranks are replayed on new connections.
TEST_CASE("replayed handshakes are refused at the store and at a data port") {
  const int np = 3;
  const std::string secret = kolo::net::generate_secret();
  const std::uint16_t master_port = unused_port();
  auto ranks =
      torchrun_env(np, master_port, secret, {"KOLO_TRANSPORT=tcp", "KOLO_TIMEOUT_SECONDS=20"});
  std::vector<std::uint16_t> ports;
  for (auto& r : ranks) {
    Socket l = kolo::net::listen_tcp(kLoopback, 0);
    ports.push_back(kolo::net::local_port(l.fd()));
    r.listen_fd = l.release();
    r.vars.push_back("KOLO_LISTEN_FD=" + std::to_string(r.listen_fd));
  }
  // Ranks 1 and 2 reach the store through a recording relay (no delay).
  Relay store_relay({{kLoopback, 0, kLoopback, master_port}}, 0.0, 4096);
  for (int r = 1; r < np; ++r) {
    for (auto& v : ranks[static_cast<std::size_t>(r)].vars) {
      if (v.rfind("MASTER_PORT=", 0) == 0) v = "MASTER_PORT=" + std::to_string(store_relay.port(0));
    }
  }
  // Rank 0 advertises 127.0.0.2, where a relay with the same port forwards to its listener; the
  // relay delays the handshakes (the first 256 bytes each way) by 1 s, which keeps rank 0's
  // acceptor waiting while the replay is served; the data behind them passes at once.
  Relay data_relay({{"127.0.0.2", ports[0], kLoopback, ports[0]}}, 1.0, 4096, 256);
  ranks[0].vars.push_back("KOLO_ADDR=127.0.0.2");

  auto procs = start_ranks(ranks, {"clean", "2"}, /*with_stdin=*/true);
  const auto all = raw(procs);
  auto recorded_response = [&](const Relay& relay) {
    for (const auto& r : relay.recorded()) {
      if (r.size() >= kolo::net::kResponseSize) return r;
    }
    return std::string();
  };
  const bool got = pump(all, 20, [&] { return !recorded_response(data_relay).empty(); });
  REQUIRE_MESSAGE(got, "no rank's handshake with rank 0 was recorded");
  const std::string data_response =
      recorded_response(data_relay).substr(0, kolo::net::kResponseSize);

  // Data connections prove the secret bound to the communicator's job token (in the store).
  const std::string data_key = kolo::net::job_key(
      secret, kolo::StoreClient({kLoopback, master_port}, secret, -1, 10).get("kolo/0/token"));
  Probes probes;
  probes.add(
      [&] { return probe_replay("replayed data handshake", kLoopback, ports[0], data_response); });
  probes.add([&] {
    return probe_fresh("fresh data handshake (control)", kLoopback, ports[0], data_key,
                       {kolo::net::kPurposeData, 99, 0});
  });
  probes.check();

  const bool connected = pump(all, 25, [&] {
    for (Proc* p : all) {
      if (!contains(p->output(), "KOLO_READY")) return false;
    }
    return true;
  });
  REQUIRE(connected);
  // The store lives as long as rank 0: replay a rank's whole recorded conversation with it (the
  // response and the requests behind it), and the response alone.
  const std::string store_stream = recorded_response(store_relay);
  REQUIRE(store_stream.size() > kolo::net::kResponseSize);
  probes.add([&] {
    return probe_replay("replayed store handshake", kLoopback, master_port,
                        store_stream.substr(0, kolo::net::kResponseSize));
  });
  probes.add([&] {
    return probe_replay("replayed store conversation", kLoopback, master_port, store_stream);
  });
  probes.add([&] {
    return probe_fresh("fresh store handshake (control)", kLoopback, master_port, secret,
                       {kolo::net::kPurposeStore, -1, 0});
  });
  probes.check();
  CHECK(data_relay.connections() >= 1);
  finish_clean_job(all, 30);
}

// Hostile bytes at rank 0's store and at every data listener while the job is setting up
// (rank 2 arrives 2 s late, so the others are waiting in the rendezvous), and a client that
// knows the secret abusing the store protocol; rank 0 (serving the store) must not grow.
TEST_CASE("hostile bytes and oversized frames during setup leave the job unaffected") {
  const int np = 3;
  const std::string secret = kolo::net::generate_secret();
  const std::string wrong = kolo::net::generate_secret();
  const std::uint16_t master_port = unused_port();
  auto ranks = torchrun_env(
      np, master_port, secret,
      {"KOLO_TRANSPORT=tcp", "KOLO_TIMEOUT_SECONDS=30", "KOLO_TEST_DELAY_MS=-,-,2000"});
  std::vector<std::uint16_t> ports;
  for (auto& r : ranks) {
    Socket l = kolo::net::listen_tcp(kLoopback, 0);
    ports.push_back(kolo::net::local_port(l.fd()));
    r.listen_fd = l.release();
    r.vars.push_back("KOLO_LISTEN_FD=" + std::to_string(r.listen_fd));
  }
  auto procs = start_ranks(ranks, {"clean", "2"}, /*with_stdin=*/true);
  const auto all = raw(procs);
  // The store is up once rank 0 has connected to itself: a fresh handshake succeeds.
  const bool store_up = pump(all, 10, [&] {
    return probe_fresh("store up?", kLoopback, master_port, secret,
                       {kolo::net::kPurposeStore, -1, 0})
        .ok;
  });
  REQUIRE(store_up);
  const long rss_before = rss_kib(procs[0]->pid());

  Probes probes;
  auto at_every_port = [&](const std::string& what, const std::function<std::string()>& bytes) {
    probes.add([&, what, bytes] {
      return probe_bytes(what + " at the store", kLoopback, master_port, bytes());
    });
    for (int r = 0; r < np; ++r) {
      const auto port = ports[static_cast<std::size_t>(r)];
      probes.add([&, what, bytes, r, port] {
        return probe_bytes(what + " at rank " + std::to_string(r), kLoopback, port, bytes());
      });
    }
  };
  at_every_port("random bytes", [] { return random_bytes(4096); });
  at_every_port("4 GiB frame header", [] { return huge_header(); });
  at_every_port("truncated handshake", [] {
    std::string r(kolo::net::kAuthMagic, 8);
    return r + random_bytes(42);  // 50 of the 88 bytes of a response, then silence
  });
  at_every_port("nothing at all", [] { return std::string(); });
  probes.add([&] {
    Probe p = probe_fresh("wrong secret at the store", kLoopback, master_port, wrong,
                          {kolo::net::kPurposeStore, -1, 0});
    p.ok = !p.ok;  // must fail
    return p;
  });
  // A client with the secret, breaking the store protocol.
  const auto max_frame = static_cast<std::uint32_t>(kolo::store_detail::kMaxFrameBytes);
  probes.add([&] {
    return probe_store_frame("store frame claiming 4 GiB", master_port, secret,
                             le32(0xffffffffu) + random_bytes(1 << 20));
  });
  probes.add([&] {
    return probe_store_frame("store frame over the limit", master_port, secret,
                             le32(max_frame + 1) + std::string(1, '\x01'));
  });
  probes.add(
      [&] { return probe_store_frame("zero-length store frame", master_port, secret, le32(0)); });
  probes.add([&] {
    return probe_store_frame("unknown store op", master_port, secret,
                             le32(1) + std::string(1, '\x63'));
  });
  probes.add([&] {
    // SET whose key length runs past the end of its frame.
    return probe_store_frame("store string overrun", master_port, secret,
                             le32(9) + std::string(1, '\x01') + le32(0xfffffff0u) + "abcd");
  });
  probes.add([&] {
    return probe_store_frame("truncated store frame", master_port, secret,
                             le32(100) + std::string(1, '\x01') + "0123456789", true);
  });
  // A maximal frame left unfinished: the store buffers what arrives (it must, to serve a large
  // SET), but only that; the measurement below is taken while this connection is still open.
  std::atomic<bool> big_sent{false}, big_release{false};
  std::thread big([&] {
    try {
      Socket s = dial_to(kLoopback, master_port);
      kolo::net::authenticate_client(s.fd(), secret, {kolo::net::kPurposeStore, -1, 0},
                                     kolo::Deadline::after(10), "store");
      send_best_effort(s.fd(), le32(max_frame) + std::string(1, '\x01') + le32(4) + "key!" +
                                   std::string(std::size_t{8} << 20, 'v'));
    } catch (const kolo::Error&) {
    }
    big_sent = true;
    while (!big_release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  while (!big_sent.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const long rss_during = rss_kib(procs[0]->pid());
  big_release = true;
  big.join();
  probes.check();
  const long rss_after = rss_kib(procs[0]->pid());
  MESSAGE("rank 0 (serving the store) RSS: " << rss_before << " KiB before, " << rss_during
                                             << " KiB with an unfinished 64 MiB frame, "
                                             << rss_after << " KiB after the attacks");
  CHECK(rss_before > 0);
  CHECK(rss_during - rss_before < 64 * 1024);
  CHECK(rss_after - rss_before < 64 * 1024);

  const bool connected = pump(all, 30, [&] {
    for (Proc* p : all) {
      if (!contains(p->output(), "KOLO_READY")) return false;
    }
    return true;
  });
  INFO("rank 0:\n" << all[0]->output());
  REQUIRE(connected);
  for (int r = 0; r < np; ++r) CHECK(connect_refused(ports[static_cast<std::size_t>(r)]));
  finish_clean_job(all, 30);
}

// The same at the store kolo-run hosts, whose port the driver learns from rank 0 (KOLO_PID line)
// while rank 1 is still 1.5 s away from arriving; kolo-run must not grow either.
TEST_CASE("hostile bytes at the kolo-run store leave the job unaffected") {
  auto job = start_kolo_run(
      3, {}, {"clean", "2"},
      {"KOLO_TRANSPORT=shm", "KOLO_TIMEOUT_SECONDS=20", "KOLO_TEST_DELAY_MS=-,1500,-"}, 40, 5, {},
      /*with_stdin=*/true);
  const bool announced =
      pump({job.get()}, 10, [&] { return rank_processes(job->output()).count(0) != 0; });
  REQUIRE_MESSAGE(announced, "kolo-run output:\n", job->output());
  const std::string store = rank_processes(job->output()).at(0).store;
  const auto hp = kolo::net::parse_host_port(store, "KOLO_STORE");
  const long rss_before = rss_kib(job->pid());
  Probes probes;
  const std::string wrong = kolo::net::generate_secret();
  probes.add([&] { return probe_bytes("random bytes", hp.host, hp.port, random_bytes(4096)); });
  probes.add([&] { return probe_bytes("4 GiB frame header", hp.host, hp.port, huge_header()); });
  probes.add([&] {
    return probe_bytes("truncated handshake", hp.host, hp.port,
                       std::string(kolo::net::kAuthMagic, 8) + random_bytes(42));
  });
  probes.add([&] { return probe_bytes("nothing at all", hp.host, hp.port, std::string()); });
  probes.add([&] {
    Probe p =
        probe_fresh("wrong secret", hp.host, hp.port, wrong, {kolo::net::kPurposeStore, 0, 0});
    p.ok = !p.ok;
    return p;
  });
  probes.check();
  const long rss_after = rss_kib(job->pid());
  MESSAGE("kolo-run (serving the store) RSS: " << rss_before << " KiB before, " << rss_after
                                               << " KiB after the attacks");
  CHECK(rss_after - rss_before < 64 * 1024);
  const bool ready =
      pump({job.get()}, 25, [&] { return count_of(job->output(), "KOLO_READY rank=") == 3; });
  REQUIRE_MESSAGE(ready, "kolo-run output:\n", job->output());
  // kolo-run gives stdin to rank 0 only; the others read /dev/null and go on at once.
  job->write_stdin("go\n");
  const bool finished = finish_all({job.get()}, 30);
  INFO("kolo-run output at the end:\n" << job->output());
  REQUIRE(finished);
  CHECK(job->code() == 0);
  CHECK(count_of(job->output(), "KOLO_OK rank=") == 3);
}

// Bad values through real processes: every rank reports the same ConfigError, naming the
// variable, before any rendezvous (so quickly, without waiting for a timeout).
TEST_CASE("bad environment values through real processes") {
  const std::vector<std::string> cases = {
      "KOLO_SHM_SLOTS=-1",
      "KOLO_SPIN_US=abc",
      "KOLO_SEGMENT_BYTES=99999999999999999999999",
      "KOLO_ALLREDUCE=ring:0-abc",
      "KOLO_TUNING=42",
      "KOLO_LOCAL_RANK=4294967296",
      "KOLO_ADDR=not a host",
      "KOLO_LOG_LEVEL=verbose",
      "KOLO_DEVICES=4294967297",
      "KOLO_TIMEOUT_SECONDS=nan",
      "KOLO_SECRET=",
      "KOLO_TRANSPORT=",  // empty means unset: routed (this one must work)
  };
  const std::string secret = kolo::net::generate_secret();
  for (const auto& c : cases) {
    CAPTURE(c);
    auto ranks = torchrun_env(2, unused_port(), secret, {"KOLO_TIMEOUT_SECONDS=5"});
    const std::string name = c.substr(0, c.find('='));
    for (auto& r : ranks) {
      std::erase_if(r.vars, [&](const std::string& v) { return v.rfind(name + "=", 0) == 0; });
      r.vars.push_back(c);
    }
    auto procs = start_ranks(ranks, {"setup"});
    const bool finished = finish_all(raw(procs), 15);
    if (c == "KOLO_TRANSPORT=") {
      for (const auto& p : procs) {
        INFO(p->output());
        CHECK(p->code() == 0);
      }
      continue;
    }
    expect_each(procs, finished, "ConfigError", {name}, 4);
  }
}

// The engine's variables, under kolo-run: read when the engine starts, on every rank alike.
TEST_CASE("bad engine variables through kolo-run") {
  for (const char* var : {"KOLO_FUSION_THRESHOLD=-1", "KOLO_CYCLE_TIME_MS=abc",
                          "KOLO_CACHE_CAPACITY=99999999999999999999999", "KOLO_COMPRESSION=fp8",
                          "KOLO_STALL_WARNING_SECONDS=inf"}) {
    CAPTURE(var);
    const JobResult r = kolo_run(2, {"engine"}, {var, "KOLO_TIMEOUT_SECONDS=10"}, 20, 5);
    const std::string v(var);
    expect_all_ranks(r, 2, "ConfigError", {v.substr(0, v.find('='))});
    CHECK(r.seconds < 8);
  }
  const JobResult ok = kolo_run(2, {"engine"}, {"KOLO_COMPRESSION=", "KOLO_TIMEOUT_SECONDS=10"});
  INFO(ok.out);
  CHECK(ok.code == 0);
  CHECK(count_of(ok.out, "KOLO_OK rank=") == 2);
}

// ---- Handshake caps, the job bound into the key, sizes that overflow, temporary files (h4) ----

namespace {

// `n` connections left as they are (non-blocking connects: the kernel completes them into the
// listener's backlog, the rest wait in SYN retries), each holding a descriptor at the server
// once accepted; every `garbage_every`-th also sends 256 random bytes.
std::vector<Socket> open_idle(std::uint16_t port, int n, int garbage_every = 0) {
  std::vector<Socket> v;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::string g = random_bytes(256);
  for (int i = 0; i < n; ++i) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) break;
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 &&
        errno != EINPROGRESS) {
      continue;
    }
    if (garbage_every > 0 && i % garbage_every == 0) {
      pollfd p{s.fd(), POLLOUT, 0};
      if (::poll(&p, 1, 100) == 1) {
        [[maybe_unused]] const ssize_t k = ::send(s.fd(), g.data(), g.size(), MSG_NOSIGNAL);
      }
    }
    v.push_back(std::move(s));
  }
  return v;
}

int open_descriptors() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n - 2;  // . and ..
}

}  // namespace

// A StoreServer in this process; 1,000 idle and garbage strangers connect first. The store must
// hold at most its cap of unauthenticated descriptors (not one per stranger until their 10 s
// budget ends), count the excess, and still serve a real client at once.
TEST_CASE("a flood of strangers is capped at the store's handshakes") {
  const std::string secret = kolo::net::generate_secret();
  const int before = open_descriptors();
  kolo::StoreServer store(kolo::net::listen_tcp(kLoopback, 0, 4096), secret);
  const int idle = 1000;
  auto strangers = open_idle(store.port(), idle, 10);
  REQUIRE(static_cast<int>(strangers.size()) == idle);
  // Let the store take in what it will (its loop accepts 64 per turn).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int held = open_descriptors() - before - idle - 3;  // listener + wake pipe
  CAPTURE(held);
  CHECK(held <= 2 * static_cast<int>(kolo::net::kMaxPendingHandshakes));
  const auto t0 = std::chrono::steady_clock::now();
  kolo::StoreClient client({kLoopback, store.port()}, secret, 0, 10);
  client.set("k", "v");
  CHECK(client.get("k") == "v");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(s);
  CHECK(s < 2.5);  // a quarter of the 10 s handshake budget the strangers could have held
  CHECK(store.refused_handshakes() + store.evicted_handshakes() >=
        static_cast<std::uint64_t>(idle) - 2 * kolo::net::kMaxPendingHandshakes);
}

// A real 2-rank TCP job whose ranks may hold only 512 descriptors; 600 idle and garbage
// strangers wait at each rank's data port before the ranks start, and 1,000 hit rank 0's store
// as soon as it listens. The job must set up and verify its allreduce well within the 10 s a
// stranger may hold a handshake.
TEST_CASE("a stranger flood during setup: the job completes on time") {
  const int np = 2;
  const std::string secret = kolo::net::generate_secret();
  const std::uint16_t master_port = unused_port();
  auto ranks =
      torchrun_env(np, master_port, secret, {"KOLO_TRANSPORT=tcp", "KOLO_TIMEOUT_SECONDS=20"});
  std::vector<std::uint16_t> ports;
  for (auto& r : ranks) {
    Socket l = kolo::net::listen_tcp(kLoopback, 0, 4096);
    ports.push_back(kolo::net::local_port(l.fd()));
    r.listen_fd = l.release();
    r.vars.push_back("KOLO_LISTEN_FD=" + std::to_string(r.listen_fd));
  }
  std::vector<Socket> flood;
  for (std::uint16_t p : ports) {
    auto v = open_idle(p, 600, 10);
    for (auto& s : v) flood.push_back(std::move(s));
  }
  std::atomic<bool> store_flooded{false};
  std::vector<Socket> store_flood;
  std::thread flooder([&] {
    const auto dl = kolo::Deadline::after(10);
    while (!dl.expired() && connect_refused(master_port)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    store_flood = open_idle(master_port, 1000, 10);
    store_flooded.store(true);
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Proc>> procs;
  for (auto& r : ranks) {
    std::vector<std::string> env = clean_env();
    env.insert(env.end(), r.vars.begin(), r.vars.end());
    procs.push_back(std::make_unique<Proc>(
        std::vector<std::string>{"/bin/sh", "-c", "ulimit -n 512 && exec \"$0\" \"$@\"",
                                 KOLO_FAULT_WORKER_EXE, "setup"},
        env, r.listen_fd, false));
    ::close(r.listen_fd);
    r.listen_fd = -1;
  }
  const bool finished = finish_all(raw(procs), 30);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  flooder.join();
  CAPTURE(s);
  CHECK(store_flooded.load());
  for (const auto& p : procs) {
    INFO(p->output());
    REQUIRE(finished);
    CHECK(p->code() == 0);
    CHECK(contains(p->output(), "KOLO_OK rank="));
  }
  CHECK(s < 5.0);  // half the 10 s handshake budget a stranger could hold a slot for
}

// Two jobs sharing KOLO_SECRET but not the job id: job B's client is refused by job A's store
// (its proof is for another key), job A's own is served; the job id comes from KOLO_JOB_ID, or
// torchrun's TORCHELASTIC_RUN_ID ("none" is not an id).
TEST_CASE("the job id is bound into the store's handshake") {
  const std::string secret = kolo::net::generate_secret();
  const std::string key_a = kolo::net::job_key(secret, "job-A");
  CHECK(key_a != secret);
  CHECK(key_a != kolo::net::job_key(secret, "job-B"));
  CHECK(kolo::net::job_key(secret, "") == secret);
  kolo::StoreServer store(kolo::net::listen_tcp(kLoopback, 0), key_a);
  {
    kolo::StoreClient a({kLoopback, store.port()}, kolo::net::job_key(secret, "job-A"), 0, 5);
    a.set("k", "v");
    CHECK(a.get("k") == "v");
  }
  for (const std::string& other : {std::string("job-B"), std::string()}) {
    CAPTURE(other);
    std::string error;
    try {
      kolo::StoreClient b({kLoopback, store.port()}, kolo::net::job_key(secret, other), 1, 5);
      b.set("k", "spliced");
    } catch (const kolo::Error& e) {
      error = e.what();
    }
    CHECK(contains(error, "refused our authentication"));
  }
  kolo::StoreClient a({kLoopback, store.port()}, key_a, 0, 5);
  CHECK(a.get("k") == "v");  // job B wrote nothing

  auto env = [](std::map<std::string, std::string> m) {
    m["KOLO_RANK"] = "0";
    m["KOLO_SIZE"] = "2";
    m["KOLO_STORE"] = "127.0.0.1:1";
    m["KOLO_SECRET"] = "0123456789abcdef";
    return [m](const std::string& k) -> std::optional<std::string> {
      const auto it = m.find(k);
      return it == m.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  CHECK(kolo::Topology::from_env(env({{"KOLO_JOB_ID", "j1"}})).job == "j1");
  CHECK(kolo::Topology::from_env(env({{"TORCHELASTIC_RUN_ID", "r7"}})).job == "r7");
  CHECK(kolo::Topology::from_env(env({{"TORCHELASTIC_RUN_ID", "none"}})).job.empty());
  CHECK(kolo::Topology::from_env(env({{"KOLO_JOB_ID", "j1"}, {"TORCHELASTIC_RUN_ID", "r7"}})).job ==
        "j1");
}

// count * element size (and size x count) that wraps: a ConfigError on every rank naming the
// count and the element size, never a small buffer, a crash or an allocation.
TEST_CASE("counts whose byte size overflows are refused on every rank") {
  struct Case {
    const char* mode;
    const char* needle;
  };
  const std::string secret = kolo::net::generate_secret();
  for (const Case c : {Case{"overflow-allreduce", "4611686018427387904 elements of 4 bytes"},
                       Case{"overflow-allgather", "9223372036854775808 elements of 1 bytes"},
                       Case{"overflow-allocate", "4611686018427387904 elements of 4 bytes"}}) {
    CAPTURE(c.mode);
    auto ranks = torchrun_env(2, unused_port(), secret, {"KOLO_TIMEOUT_SECONDS=10"});
    auto procs = start_ranks(ranks, {c.mode});
    const bool finished = finish_all(raw(procs), 20);
    expect_each(procs, finished, "ConfigError", {c.needle}, 8);
    for (const auto& p : procs) CHECK(!contains(p->output(), "KOLO_ALLOCATED"));
  }
}

// The tuning file's temporary and the timeline: created 0600, never through a symlink planted at
// the name (the old temporary name was predictable: path.tmp<pid>).
TEST_CASE("temporary and timeline files are created privately, never through a symlink") {
  char dir_template[] = "/tmp/kolo-h4-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  struct Cleanup {
    std::string d;
    ~Cleanup() { [[maybe_unused]] const int rc = std::system(("rm -rf '" + d + "'").c_str()); }
  } cleanup{dir};
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  const std::string victim = dir + "/victim";
  {
    const int fd = ::open(victim.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, "keep", 4) == 4);
    ::close(fd);
  }
  auto victim_text = [&] {
    char buf[64] = {};
    const int fd = ::open(victim.c_str(), O_RDONLY);
    const ssize_t k = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    return std::string(buf, k > 0 ? static_cast<std::size_t>(k) : 0);
  };
  // The tuning file: a symlink at the old temporary name must not be followed.
  const std::string tuning = dir + "/tuning.txt";
  const std::string old_tmp = tuning + ".tmp" + std::to_string(::getpid());
  REQUIRE(::symlink(victim.c_str(), old_tmp.c_str()) == 0);
  kolo::detail::write_tuning_file(tuning, kolo::Tuning{});
  CHECK(victim_text() == "keep");
  REQUIRE(::stat(tuning.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(kolo::detail::read_tuning_file(tuning).source == kolo::Tuning::Source::file);
  // The timeline: a symlink at the path is refused; a fresh path is created 0600.
  const std::string link = dir + "/timeline.json";
  REQUIRE(::symlink(victim.c_str(), link.c_str()) == 0);
  {
    kolo::Timeline t;
    CHECK_THROWS_AS(t.open(link, 0), kolo::ConfigError);
  }
  CHECK(victim_text() == "keep");
  const std::string fresh = dir + "/fresh.json";
  {
    kolo::Timeline t;
    t.open(fresh, 0);
  }
  REQUIRE(::lstat(fresh.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
}
