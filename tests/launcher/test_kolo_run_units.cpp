// kolo-run's units tested from the inside, in one process and without starting a rank: the
// command line (backends/local/kolo_run/args.hpp), the rank plan (hosts.hpp), shell quoting and
// the ssh destination (ssh.hpp), and the output path (output.hpp: line relay, back-pressure on a
// pipe nobody reads). test_kolo_run.cpp tests the same binary from the outside.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kolo_run/args.hpp"
#include "kolo_run/hosts.hpp"
#include "kolo_run/output.hpp"
#include "kolo_run/ssh.hpp"

namespace {

namespace kr = kolo_run;

// parse_args on the words of a command line (argv[0] is "kolo-run").
kr::Options parse(std::vector<std::string> words) {
  words.insert(words.begin(), "kolo-run");
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  return kr::parse_args(static_cast<int>(words.size()), argv.data());
}

// The UsageError text parse() throws, or "" when it parses.
std::string usage_error(std::vector<std::string> words) {
  try {
    parse(std::move(words));
  } catch (const kr::UsageError& e) {
    return e.what();
  }
  return "";
}

// A pipe whose both ends are closed at the end of the scope.
struct Pipe {
  int rd = -1, wr = -1;
  Pipe() {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    rd = p[0];
    wr = p[1];
  }
  ~Pipe() {
    ::close(rd);
    ::close(wr);
  }
  // Everything written so far (the write end stays open: reads what is there now).
  std::string read_now() const {
    const int fl = ::fcntl(rd, F_GETFL);
    ::fcntl(rd, F_SETFL, fl | O_NONBLOCK);
    std::string got;
    char buf[65536];
    for (;;) {
      const ssize_t k = ::read(rd, buf, sizeof(buf));
      if (k <= 0) break;
      got.append(buf, static_cast<std::size_t>(k));
    }
    ::fcntl(rd, F_SETFL, fl);
    return got;
  }
};

}  // namespace

TEST_CASE("kolo-run args: values of every option") {
  const kr::Options o = parse({"-np", "4", "-H", "a:2,b:2", "--store-host", "10.0.0.1", "--timeout",
                               "2.5", "--grace=0", "--ssh", "ssh -p 22", "-x", "FOO=1", "-x", "BAR",
                               "--no-prefix", "prog", "--prog-option", "arg"});
  CHECK(o.np == 4);
  REQUIRE(o.hosts.size() == 2);
  CHECK(o.hosts[0].name == "a");
  CHECK(o.hosts[1].slots == 2);
  CHECK(o.store_host == "10.0.0.1");
  CHECK(o.timeout == doctest::Approx(2.5));
  CHECK(o.timeout_text == "2.5");
  CHECK(o.grace == 0.0);
  CHECK(o.grace_text == "0");
  CHECK(o.ssh == "ssh -p 22");
  CHECK(o.exports == std::vector<std::string>{"FOO=1", "BAR"});
  CHECK_FALSE(o.prefix);
  // The first word that is not an option is the program; what follows is its own.
  CHECK(o.command == std::vector<std::string>{"prog", "--prog-option", "arg"});

  const kr::Options d = parse({"-n", "1", "--", "-dash-prog"});
  CHECK(d.np == 1);
  CHECK(d.hosts.empty());
  CHECK(d.prefix);
  CHECK(d.grace == 3.0);
  CHECK_FALSE(d.timeout);
  CHECK(d.command == std::vector<std::string>{"-dash-prog"});
  CHECK(parse({"--np=2", "p"}).np == 2);
  CHECK(parse({"-h"}).help);
}

TEST_CASE("kolo-run args: each mistake is a UsageError naming it") {
  CHECK(usage_error({"prog"}) == "missing -np N (the number of ranks)");
  CHECK(usage_error({"-np", "2"}) == "missing the program to run");
  CHECK(usage_error({"-np", "x", "p"}) == "-np 'x' is not an integer");
  CHECK(usage_error({"-np", "0", "p"}) == "-np 0: the number of ranks must be at least 1");
  CHECK(usage_error({"-np", "2000000", "p"}) == "-np 2000000 is too many ranks");
  CHECK(usage_error({"-np"}) == "option -np needs a value");
  CHECK(usage_error({"--bogus", "p"}) == "unknown option '--bogus'");
  CHECK(usage_error({"-np", "1", "--timeout", "0", "p"}) ==
        "--timeout '0' is not a positive number of seconds");
  CHECK(usage_error({"-np", "1", "--timeout", "inf", "p"}) ==
        "--timeout 'inf' is not a positive number of seconds");
  CHECK(usage_error({"-np", "1", "--grace", "-1", "p"}) ==
        "--grace '-1' is not a number of seconds >= 0");
  CHECK(usage_error({"-np", "1", "--no-prefix=1", "p"}) == "option --no-prefix takes no value");
  CHECK(usage_error({"-np", "1", "--store-host", "", "p"}) ==
        "--store-host needs a non-empty address");
  CHECK(usage_error({"-np", "1", "-x", "1BAD", "p"}) == "-x '1BAD': expected NAME or NAME=VALUE");
  CHECK(usage_error({"-np", "1", "-x", "KOLO_RANK=3", "p"}) ==
        "-x KOLO_RANK: kolo-run sets KOLO_RANK itself, per rank");
  CHECK(usage_error({"-np", "5", "-H", "a:2,b:2", "p"}) ==
        "-H gives 4 slot(s) in total but -np is 5");
}

TEST_CASE("kolo-run args: -H host lists") {
  const auto h = kr::parse_hosts("a:4,b:4");
  REQUIRE(h.size() == 2);
  CHECK(h[0].name == "a");
  CHECK(h[0].slots == 4);
  CHECK(h[1].name == "b");
  // An IPv6 address keeps its colons: the slots follow the last one.
  const auto v6 = kr::parse_hosts("[::1]:2,user@host:1");
  CHECK(v6[0].name == "[::1]");
  CHECK(v6[0].slots == 2);
  CHECK(v6[1].name == "user@host");

  auto refused = [](const std::string& text) -> std::string {
    try {
      kr::parse_hosts(text);
    } catch (const kr::UsageError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(refused("") == "-H needs at least one host:slots entry");
  CHECK(refused("a") == "-H entry 'a' is not host:slots");
  CHECK(refused(":3") == "-H entry ':3' is not host:slots");
  CHECK(refused("a:2,") == "-H entry '' is not host:slots");
  CHECK(refused("a:0") == "-H entry 'a:0' has slots '0', which is not a positive integer");
  CHECK(refused("a:x") == "-H entry 'a:x' has slots 'x', which is not a positive integer");
  CHECK(refused("a:1,a:2") == "-H lists host 'a' twice; give its slots once");
}

TEST_CASE("kolo-run args: ssh command words split as a shell would") {
  const std::string what = "--ssh";
  CHECK(kr::split_words("ssh -p 2222", what) == std::vector<std::string>{"ssh", "-p", "2222"});
  CHECK(kr::split_words("  ssh\t-i 'my key'  ", what) ==
        std::vector<std::string>{"ssh", "-i", "my key"});
  CHECK(kr::split_words(R"(a "b \" \\ c" d\ e '')", what) ==
        std::vector<std::string>{"a", R"(b " \ c)", "d e", ""});
  CHECK_THROWS_WITH_AS(kr::split_words("ssh 'open", what), "--ssh has an unterminated ' quote",
                       kr::UsageError);
  CHECK_THROWS_WITH_AS(kr::split_words("ssh \"open", what), "--ssh has an unterminated \" quote",
                       kr::UsageError);
  CHECK(kr::parse_int("12") == 12);
  CHECK_FALSE(kr::parse_int("12x"));
  CHECK_FALSE(kr::parse_int(""));
  CHECK(kr::parse_seconds("0.25") == doctest::Approx(0.25));
  CHECK_FALSE(kr::parse_seconds("nan"));
  CHECK_FALSE(kr::parse_seconds("1s"));
}

TEST_CASE("kolo-run hosts: ranks fill the hosts in -H order") {
  const auto plan = kr::plan_ranks(parse({"-np", "5", "-H", "localhost:2,127.0.0.1:4", "p"}));
  REQUIRE(plan.size() == 5);
  CHECK(plan[0].host_key == "localhost");
  CHECK(plan[1].local_rank == 1);
  CHECK(plan[1].local_size == 2);
  CHECK(plan[2].host_key == "127.0.0.1");
  CHECK(plan[2].local_rank == 0);
  CHECK(plan[2].local_size == 3);  // only 3 of its 4 slots are used
  CHECK(plan[4].cross_rank == 1);
  for (const auto& p : plan) {
    CHECK(p.cross_size == 2);
    CHECK(p.kind == kr::HostKind::this_machine);
  }
  // A host left without ranks is no host of the job.
  const auto two = kr::plan_ranks(parse({"-np", "2", "-H", "localhost:2,::1:2", "p"}));
  CHECK(two.back().cross_size == 1);
  // Without -H: every rank here, host key "local".
  const auto here = kr::plan_ranks(parse({"-np", "3", "p"}));
  CHECK(here.size() == 3);
  CHECK(here[2].host_key == "local");
  CHECK(here[2].local_size == 3);
  CHECK(kr::is_this_machine("localhost"));
  CHECK(kr::is_loopback("127.0.0.2"));
  CHECK_FALSE(kr::is_loopback("10.0.0.1"));
  CHECK_FALSE(kr::is_netns("../etc"));
}

TEST_CASE("kolo-run hosts: the program is resolved as execvp would, or a LaunchError") {
  CHECK(kr::resolve_program("/bin/sh") == "/bin/sh");
  try {
    kr::resolve_program("/nonexistent/kolo-prog");
    FAIL("resolved a missing program");
  } catch (const kr::LaunchError& e) {
    CHECK(e.code() == kr::kExitNotFound);
  }
  try {
    kr::resolve_program("/etc");
    FAIL("resolved a directory");
  } catch (const kr::LaunchError& e) {
    CHECK(e.code() == kr::kExitNotExecutable);
  }
}

TEST_CASE("kolo-run ssh: quoting, destinations, signal names") {
  CHECK(kr::sh_quote("plain") == "'plain'");
  CHECK(kr::sh_quote("it's") == "'it'\\''s'");
  CHECK(kr::sh_quote("") == "''");
  CHECK(kr::ssh_destination("[fe80::1]") == "fe80::1");
  CHECK(kr::ssh_destination("user@host") == "user@host");
  CHECK(kr::describe_signal(SIGTERM) == "15 (SIGTERM)");
  CHECK(kr::describe_signal(64) == "64");
  CHECK(std::string(kr::kRemotePrologue).find(std::string(kr::kStartedMarker)) == 5);  // echo
}

TEST_CASE("kolo-run output: lines are relayed whole, with the prefix") {
  Pipe p;
  kr::OutStream out(p.wr);
  out.prepare();  // non-blocking: a line bigger than the pipe waits in the buffer
  // What the pipe got, taking turns with flush() until nothing is pending.
  auto take = [&] {
    std::string got = p.read_now();
    for (int i = 0; i < 1000 && out.pending() > 0; ++i) {
      out.flush();
      got += p.read_now();
    }
    return got;
  };
  kr::LineRelay relay(&out, "[3] ");
  relay.feed("hel", 3);
  CHECK(take().empty());  // no line yet
  relay.feed("lo\nwor", 6);
  CHECK(take() == "[3] hello\n");
  relay.feed("ld\n\n", 4);
  CHECK(take() == "[3] world\n[3] \n");
  relay.feed("tail", 4);
  relay.finish();  // a last line without '\n' gets one, so the next rank's starts afresh
  CHECK(take() == "[3] tail\n");

  kr::LineRelay bare(&out, "");
  bare.feed("no newline", 10);
  bare.finish();
  CHECK(take() == "no newline");

  // A line longer than kMaxLine is emitted in pieces rather than buffered without bound.
  const std::string big(kr::kMaxLine + 10, 'x');
  relay.feed(big.data(), big.size());
  CHECK(take() == "[3] " + big + "\n");
}

TEST_CASE("kolo-run output: a reader that takes nothing fills the buffer, never blocks") {
  Pipe p;
  kr::OutStream out(p.wr);
  out.prepare();  // a pipe: written through a non-blocking description of its own
  const std::string chunk(64 * 1024, 'y');
  std::size_t written = 0;
  while (!out.full()) {  // the pipe takes ~64 KiB, then the buffer grows to kOutBuffer
    out.write(chunk);
    written += chunk.size();
    REQUIRE(written < 64 * kr::kOutBuffer);
  }
  CHECK(out.pending() >= kr::kOutBuffer);
  kr::LineRelay relay(&out, "");
  CHECK(relay.full());  // kolo-run stops reading the ranks that feed it
  // The reader takes it all: flush() makes progress each time, until nothing is pending.
  std::size_t got = 0;
  for (int i = 0; i < 1000 && out.pending() > 0; ++i) {
    got += p.read_now().size();
    out.flush();
  }
  got += p.read_now().size();
  CHECK(out.pending() == 0);
  CHECK_FALSE(out.full());
  CHECK(got == written);
  // drop() at exit forgets what is left and says how much.
  out.write(chunk);
  out.write(chunk);
  const std::size_t left = out.pending();
  CHECK(out.drop() == left);
  CHECK(out.pending() == 0);
}
