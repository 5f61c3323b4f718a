// backends/local/launcher_config.hpp — kolo-run's own variable (KOLO_RUN_SSH), declared next to
// kolo_run.cpp, which reads it. How a variable is declared: kolo/core/config_var.hpp.
#pragma once

#include "kolo/core/config_var.hpp"

namespace kolo::config {

namespace vars {

// ---- kolo-run ----
inline constexpr Var run_ssh{"KOLO_RUN_SSH",
                             Kind::text,
                             Section::launcher,
                             Reader::none,
                             0,
                             0,
                             "`ssh`",
                             "the ssh command (with options) kolo-run starts ranks on remote `-H` "
                             "hosts with, when `--ssh` is not given",
                             {},
                             {},
                             true};

}  // namespace vars

inline constexpr const Var* kLauncherVars[] = {&vars::run_ssh};

}  // namespace kolo::config
