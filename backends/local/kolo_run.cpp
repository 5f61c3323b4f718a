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
//
// The parts (kolo_run/): common (exit codes, errors), args (the command line), hosts (where ranks
// run), output (kolo-run's own streams, line relay), ssh (the remote prologue, signal names), job
// (job.hpp; job_setup.cpp, job_loop.cpp). This file: main().

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <string>
#include <utility>

#include "kolo_run/args.hpp"
#include "kolo_run/common.hpp"
#include "kolo_run/hosts.hpp"
#include "kolo_run/job.hpp"
#include "kolo_run/output.hpp"

namespace {

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

using namespace kolo_run;

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
