// Faults between "hosts": two network namespaces on a private bridge (tests/netns/netns.sh),
// ranks in both, the routed transport (shared memory inside a namespace, TCP between them).
//
// Run only by netns_faults.sh, which makes the namespaces (or exits 77 where it cannot) and
// tells this driver their names through the environment:
//   KOLO_NETNS_PREFIX  namespaces PREFIX-h1, PREFIX-h2; root-side links PREFIX-v1, PREFIX-v2
//   KOLO_NETNS_SUBNET  the /24: bridge SUBNET.1, hosts SUBNET.11 and SUBNET.12
//   KOLO_NETNS_NFT     1 if nftables works in the namespaces (packet loss, drop-all partition);
//                      without it those parts are left out, a failure in CI (tests/common/skip.hpp)
//
// Cases:
//   SIGKILL     a random rank at a random point of random collectives (as test_kill.cpp).
//   loss        5% of the TCP packets each host receives are dropped (nftables `numgen random
//               mod 100 < 5 drop`, with a counter to prove drops happened): every result
//               stays exact, only slower.
//   delay       a relay in the root namespace with 2 ms one-way latency is the only path
//               between the hosts' ranks: ranks 0 and 1 bind their data listeners to known
//               ports (KOLO_TEST_LISTEN_PORTS) and advertise the bridge address (KOLO_TEST_ADDRS
//               -> KOLO_ADDR), where the relay listens on the same ports and forwards to them;
//               ranks 2 and 3 connect to what was advertised. Results exact; the relay counts
//               its connections and bytes, so the test knows the data really went through it.
//   partition   mid-collective, host 2's link goes down (or nftables drops everything): the
//               ranks on both sides raise TimeoutError or PeerLostError naming peers within
//               KOLO_TIMEOUT_SECONDS + 5 s; no process is left.
#include <arpa/inet.h>

#include "../common/skip.hpp"
#include "harness.hpp"

using namespace kolo_faults;

namespace {

struct Hosts {
  std::string prefix, subnet;
  bool nft = false;
  std::string ns(int i) const { return prefix + "-h" + std::to_string(i); }
  std::string veth(int i) const { return prefix + "-v" + std::to_string(i); }
  std::string ip(int i) const { return subnet + "." + std::to_string(10 + i); }
  std::string bridge_ip() const { return subnet + ".1"; }
  // kolo-run options for ranks in both namespaces (ranks fill h1 first).
  std::vector<std::string> launcher(int per_host1, int per_host2) const {
    return {"-H",
            ns(1) + ":" + std::to_string(per_host1) + "," + ns(2) + ":" + std::to_string(per_host2),
            "--store-host", bridge_ip()};
  }
};

Hosts hosts() {
  const char* p = std::getenv("KOLO_NETNS_PREFIX");
  const char* s = std::getenv("KOLO_NETNS_SUBNET");
  REQUIRE_MESSAGE((p && s), "run through tests/faults/netns_faults.sh (KOLO_NETNS_PREFIX unset)");
  Hosts h;
  h.prefix = p;
  h.subnet = s;
  const char* n = std::getenv("KOLO_NETNS_NFT");
  h.nft = n && std::string(n) == "1";
  return h;
}

// Runs a shell command; its exit status.
int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

std::string sh_output(const std::string& cmd) {
  std::string out;
  if (std::FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t k;
    while ((k = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, k);
    ::pclose(f);
  }
  return out;
}

// The sum of the packet counters of an nftables table in a namespace.
long nft_packets(const std::string& ns, const std::string& table) {
  const std::string out = sh_output("ip netns exec " + ns + " nft list table inet " + table);
  long total = 0;
  for (std::size_t p = out.find("packets "); p != std::string::npos;
       p = out.find("packets ", p + 1)) {
    total += std::atol(out.c_str() + p + 8);
  }
  return total;
}

// One `fault_worker verify` job across the hosts: every rank must report KOLO_OK; returns the
// slowest rank's seconds for the steps (setup excluded), or -1 after failing the test.
double verify_job(const Hosts& h, std::uint64_t seed, int steps, std::size_t max_elems,
                  const std::vector<std::string>& extra_env, const char* what) {
  std::vector<std::string> env = {"KOLO_TRANSPORT=routed", "KOLO_TIMEOUT_SECONDS=60"};
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  auto job = start_kolo_run(
      4, h.launcher(2, 2),
      {"verify", std::to_string(seed), std::to_string(steps), std::to_string(max_elems)}, env, 240,
      10);
  const bool finished = finish_all({job.get()}, 245);
  const std::string& out = job->output();
  INFO(what << ": kolo-run output:\n" << out);
  CHECK(finished);
  CHECK(job->code() == 0);
  CHECK(count_of(out, "KOLO_OK rank=") == 4);
  CHECK(!contains(out, "KOLO_WRONG"));
  double worst = -1;
  for (std::size_t p = out.find(" seconds="); p != std::string::npos;
       p = out.find(" seconds=", p + 1)) {
    worst = std::max(worst, std::atof(out.c_str() + p + 9));
  }
  return job->code() == 0 ? worst : -1;
}

// Ports free on the bridge address in the root namespace (bound, read and closed).
std::vector<std::uint16_t> free_ports(const std::string& addr, int n) {
  std::vector<kolo::net::Socket> held;
  std::vector<std::uint16_t> ports;
  for (int i = 0; i < n; ++i) {
    held.push_back(kolo::net::listen_tcp(addr, 0));
    ports.push_back(kolo::net::local_port(held.back().fd()));
  }
  return ports;
}

}  // namespace

TEST_CASE("routed across namespaces: random rank SIGKILLed in random collectives") {
  const Hosts h = hosts();
  const std::uint64_t seed = base_seed();
  const long trials = env_long("KOLO_FAULT_TRIALS_ROUTED", 12);
  const int parallel = static_cast<int>(env_long("KOLO_FAULT_PARALLEL", 2));
  MESSAGE("KOLO_FAULT_SEED=" << seed);
  std::vector<KillTrialSpec> specs;
  for (long t = 0; t < trials; ++t) {
    KillTrialSpec s;
    s.transport = "routed";
    s.seed = seed + static_cast<std::uint64_t>(t);
    s.np = 3 + static_cast<int>(s.seed % 2);  // 2 + 1 or 2 + 2 ranks
    s.launcher_opts = h.launcher(2, s.np - 2);
    // Every other trial pipelines the hierarchical allreduce from 8 KiB on (many chunks), so the
    // kill can land while a ring inside a host and one across hosts are both in flight.
    if (t % 2 == 1) s.env = {"KOLO_HIERARCHICAL_CHUNK_BYTES=4096"};
    specs.push_back(s);
  }
  check_kill_trials(run_kill_trials(specs, parallel), "SIGKILL routed (2 namespaces)");
}

TEST_CASE("routed across namespaces: 5% packet loss keeps results exact") {
  const Hosts h = hosts();
  if (!h.nft) {
    KOLO_TEST_SKIP_CASE("no-nftables",
                        "nftables unavailable in the namespaces: packet loss not tested");
  }
  const std::uint64_t seed = base_seed();
  const int steps = static_cast<int>(env_long("KOLO_FAULT_LOSS_STEPS", 150));
  const std::size_t max_elems = std::size_t{1} << 18;
  MESSAGE("KOLO_FAULT_SEED=" << seed);
  const double clean = verify_job(h, seed, steps, max_elems, {}, "without loss");
  for (int i = 1; i <= 2; ++i) {
    const std::string ns = h.ns(i);
    REQUIRE(sh("ip netns exec " + ns + " nft add table inet kolo_loss") == 0);
    REQUIRE(sh("ip netns exec " + ns +
               " nft add chain inet kolo_loss input "
               "'{ type filter hook input priority 0; policy accept; }'") == 0);
    REQUIRE(sh("ip netns exec " + ns +
               " nft add rule inet kolo_loss input iifname eth0 meta l4proto tcp "
               "numgen random mod 100 '<' 5 counter drop") == 0);
  }
  struct Cleanup {
    const Hosts& h;
    ~Cleanup() {
      for (int i = 1; i <= 2; ++i) {
        sh("ip netns exec " + h.ns(i) + " nft delete table inet kolo_loss 2>/dev/null");
      }
    }
  } cleanup{h};
  const double lossy = verify_job(h, seed, steps, max_elems, {}, "with 5% loss");
  const long dropped = nft_packets(h.ns(1), "kolo_loss") + nft_packets(h.ns(2), "kolo_loss");
  CHECK_MESSAGE(dropped > 0, "the loss rule dropped nothing: it was not in the path");
  char line[256];
  std::snprintf(line, sizeof(line),
                "5%% loss: %d random collectives exact; %.3f s without loss, %.3f s with "
                "(x%.1f); %ld packets dropped",
                steps, clean, lossy, clean > 0 ? lossy / clean : 0.0, dropped);
  MESSAGE(line);
  if (std::getenv("KOLO_FAULTS_VERBOSE")) std::fprintf(stderr, "%s\n", line);
}

TEST_CASE("routed across namespaces: a delaying relay in the data path keeps results exact") {
  const Hosts h = hosts();
  const std::uint64_t seed = base_seed();
  const int steps = static_cast<int>(env_long("KOLO_FAULT_DELAY_STEPS", 300));
  const std::size_t max_elems = std::size_t{1} << 18;
  const double delay = 0.002;
  MESSAGE("KOLO_FAULT_SEED=" << seed);
  const double direct = verify_job(h, seed, steps, max_elems, {}, "direct");

  // Ranks 0 and 1 live in host 1; the relay listens on the bridge address with the same ports.
  const auto ports = free_ports(h.bridge_ip(), 2);
  std::vector<Relay::Route> routes;
  for (std::uint16_t p : ports) routes.push_back({h.bridge_ip(), p, h.ip(1), p});
  Relay relay(routes, delay);
  const std::string listen = std::to_string(ports[0]) + "," + std::to_string(ports[1]) + ",-,-";
  const std::string addrs = h.bridge_ip() + "," + h.bridge_ip() + ",-,-";
  const double relayed = verify_job(
      h, seed, steps, max_elems, {"KOLO_TEST_LISTEN_PORTS=" + listen, "KOLO_TEST_ADDRS=" + addrs},
      "through the relay");
  // Every cross-host pair (2-0, 2-1, 3-0, 3-1) connected through the relay, and the data went
  // with it: far more than handshakes and the tuning probe.
  CHECK(relay.connections() == 4);
  CHECK(relay.bytes() > (std::uint64_t{16} << 20));
  char line[256];
  std::snprintf(line, sizeof(line),
                "relay, %.1f ms one way: %d random collectives exact; %.3f s direct, %.3f s "
                "relayed (x%.1f); %.1f MiB through %d relayed connections",
                delay * 1000, steps, direct, relayed, direct > 0 ? relayed / direct : 0.0,
                static_cast<double>(relay.bytes()) / (1 << 20), relay.connections());
  MESSAGE(line);
  if (std::getenv("KOLO_FAULTS_VERBOSE")) std::fprintf(stderr, "%s\n", line);
}

namespace {

// A partition `how` ("link" or "nft") of host 2 at a random moment of random collectives.
std::string partition_trial(const Hosts& h, const std::string& how, std::uint64_t seed) {
  CAPTURE(how);
  CAPTURE(seed);
  const double timeout = 4;
  auto job = start_kolo_run(4, h.launcher(2, 2), {"chaos", std::to_string(seed), "0", "262144"},
                            {"KOLO_TRANSPORT=routed", "KOLO_TIMEOUT_SECONDS=4"}, 60, timeout + 10);
  const bool looping =
      pump({job.get()}, 30, [&] { return count_of(job->output(), "KOLO_LOOP rank=") == 4; });
  const auto ranks = rank_processes(job->output());
  INFO("kolo-run output:\n" << job->output());
  REQUIRE(looping);
  REQUIRE(ranks.size() == 4);
  std::mt19937_64 rng(seed);
  pump({job.get()}, static_cast<double>(100 + rng() % 400) / 1000.0, [] { return false; });

  std::string undo;
  if (how == "link") {
    REQUIRE(sh("ip link set " + h.veth(2) + " down") == 0);
    undo = "ip link set " + h.veth(2) + " up";
  } else {
    const std::string ns = "ip netns exec " + h.ns(2) + " nft ";
    REQUIRE(sh(ns + "add table inet kolo_cut") == 0);
    for (const char* hook : {"input", "output"}) {
      REQUIRE(sh(ns + "add chain inet kolo_cut " + hook + " '{ type filter hook " + hook +
                 " priority -10; policy drop; }'") == 0);
    }
    // Loopback stays up: the ranks inside the host still reach each other (and themselves).
    REQUIRE(sh(ns + "add rule inet kolo_cut input iifname lo accept") == 0);
    REQUIRE(sh(ns + "add rule inet kolo_cut output oifname lo accept") == 0);
    undo = ns + "delete table inet kolo_cut";
  }
  const double t_cut = mono_now();
  const bool finished = finish_all({job.get()}, timeout + 20);
  sh(undo);
  const std::string out = job->output();
  INFO("kolo-run output after the partition:\n" << out);
  CHECK(finished);
  CHECK(!contains(out, "KOLO_WRONG"));
  const auto reports = fault_reports(out);
  CHECK(reports.size() == 4);
  double side_max[2] = {0, 0};
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const auto it = reports.find(std::to_string(r));
    REQUIRE_MESSAGE(it != reports.end(), "rank ", r, " did not raise");
    const Report& rep = it->second;
    CHECK((rep.kind == "TimeoutError" || rep.kind == "PeerLostError"));
    CHECK(contains(rep.what, "rank "));
    const double detect = rep.mono - t_cut;
    CHECK(detect <= timeout + 5);
    side_max[r < 2 ? 0 : 1] = std::max(side_max[r < 2 ? 0 : 1], detect);
  }
  CHECK(leftovers(ranks, 3).empty());
  char line[256];
  std::snprintf(line, sizeof(line),
                "partition (%s) with KOLO_TIMEOUT_SECONDS=%g: host 1 raised after %.3f s, host 2 "
                "after %.3f s; %s",
                how.c_str(), timeout, side_max[0], side_max[1],
                reports.count("0") ? reports.at("0").what.c_str() : "-");
  return line;
}

void report(const std::string& line) {
  MESSAGE(line);
  if (std::getenv("KOLO_FAULTS_VERBOSE")) std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

TEST_CASE("routed across namespaces: a network partition mid-collective fails both sides") {
  const Hosts h = hosts();
  const std::uint64_t seed = base_seed();
  report(partition_trial(h, "link", seed));
  if (h.nft) {
    report(partition_trial(h, "nft", seed + 1));
  } else {
    KOLO_TEST_SKIP_CASE("no-nftables",
                        "nftables unavailable in the namespaces: drop-all partition not tested");
  }
}
