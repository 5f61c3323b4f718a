// spawn_joiner.hpp — starts this program again as a process that joins the job (the grow and
// elastic-join workers: grow_worker.cpp, elastic_train_worker.cpp): the same environment less
// the launcher's per-rank variables, since a joiner has no rank until it joins.
#pragma once

#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace kolo_exact {

// posix_spawn of /proc/self/exe with `args` (argv[1..]); -1 (errno set) when it failed.
inline pid_t spawn_joiner(const std::vector<std::string>& args) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool per_rank = false;
    for (const char* v : {"KOLO_RANK=", "KOLO_SIZE=", "KOLO_LOCAL_RANK=", "KOLO_LOCAL_SIZE=",
                          "KOLO_CROSS_RANK=", "KOLO_CROSS_SIZE="}) {
      if (kv.rfind(v, 0) == 0) per_rank = true;
    }
    if (!per_rank) env.push_back(kv);
  }
  std::vector<std::string> argv_s = {"/proc/self/exe"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return pid;
}

// The joiner's exit as text: "0".."255", "sig9", "?".
inline std::string reap(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st)     ? std::to_string(WEXITSTATUS(st))
         : WIFSIGNALED(st) ? "sig" + std::to_string(WTERMSIG(st))
                           : "?";
}

}  // namespace kolo_exact
