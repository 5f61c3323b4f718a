// kolo-run's job: the ranks it supervises (Rank) and Job, which sets the job up (signals, the
// store, environments, spawning local, netns and ssh ranks: job_setup.cpp) and runs it (the poll
// loop, output relay, exits, grace, signals and teardown: job_loop.cpp).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/topology/store.hpp"
#include "kolo_run/args.hpp"
#include "kolo_run/hosts.hpp"
#include "kolo_run/output.hpp"

namespace kolo_run {

inline std::string rank_list(const std::vector<int>& ranks) {
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

  int run();

 private:
  enum class Phase { running, grace, terminating, killing };

  // Signals are taken through a signalfd in the poll loop, so they are blocked first: before
  // the store's threads exist (they inherit the mask, and a SIGINT delivered to one of them
  // would otherwise kill kolo-run without cleaning up).
  void setup_signals();

  void resolve_paths();

  void prepare_ssh(const RankPlan& ssh_rank, bool any_here);

  void start_store();

  void prepare_env();

  std::vector<std::string> env_for(int r) const;

  // The one line an ssh rank's prologue evaluates: its variables (the secret among them) and
  // kolo_* settings for the prologue itself.
  std::string job_line(int r) const;

  static void close_fd(int& fd);

  void spawn(int r);

  void kill_group(const Rank& r, int sig);

  // Waits for the watchdogs: each exits once its rank's tree is gone (at most
  // kKillAfterTermSeconds after its socket closed, plus SIGKILL's moment).
  void wait_watchdogs();

  // --- the poll loop --------------------------------------------------------------------------

  void loop();

  // Reads up to `max_reads` chunks from one of a rank's pipes, fewer once the stream it feeds
  // is full; returns how many it read.
  int read_some(Rank& r, bool is_err, int max_reads);

  // An ssh rank's stdout until the prologue's marker line: lines before it (a login script's)
  // pass on; the marker is dropped and ends the rank's "starting" state.
  void feed_before_start(Rank& r, const char* data, std::size_t n);

  // Starts the ranks not started yet, in rank order, as far as kMaxStartingPerHost allows; once
  // the job is being torn down, the rest never start.
  void spawn_ready();

  // Takes what a rank left in its pipes, bounded so a chatty grandchild cannot stall us.
  void drain(Rank& r);

  int next_timeout_ms() const;

  void handle_signals();

  void reap();

  template <class Failures>
  void reap_pass(Failures& failures);

  // The watchdog's messages: the rank's exit status (its start was read by spawn()).
  template <class Failures>
  void read_chan(Rank& r, Failures& failures);

  template <class Failures>
  void rank_exited(Rank& r, int status, Failures& failures);

  void begin_grace();

  // Signals the process group of every rank still running (and, with `all_groups`, also of
  // ranks already gone, whose helpers may still run in their groups).
  std::vector<int> signal_ranks(int sig, bool all_groups);

  // A signal for an ssh rank: INT, TERM and HUP travel as a control line to the remote
  // prologue, which signals the rank's process group there (the rank reports back through ssh
  // as usual). SIGKILL cannot wait for a connection that may be stuck: kolo-run closes the
  // control pipe and kills its ssh client; the remote side sees EOF and SIGKILLs the group.
  void signal_remote(Rank& r, int sig);

  void check_deadlines();

  void terminate();

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

}  // namespace kolo_run
