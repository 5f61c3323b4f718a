// Ranks on ssh hosts, and signal names: the remote sh prologue (the job line on stdin, the
// control channel, the started marker), how many ssh ranks may start at once per host, shell
// quoting and the ssh destination of a -H name; signal_name/describe_signal for exit reports.
#pragma once

#include <signal.h>

#include <string>
#include <string_view>

namespace kolo_run {

inline const char* signal_name(int sig) {
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

inline std::string describe_signal(int sig) {
  const char* n = signal_name(sig);
  return std::to_string(sig) + (n ? std::string(" (") + n + ")" : std::string());
}

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
inline std::string sh_quote(const std::string& s) {
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
inline std::string ssh_destination(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace kolo_run
