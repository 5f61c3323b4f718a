// backends/torch/csrc/torch_config.hpp — the PyTorch backend's variable (KOLO_TORCH_SPIN_US),
// declared next to kolo_backend.cpp, which reads it. How a variable is declared and read:
// kolo/core/config_var.hpp.
#pragma once

#include "kolo/core/config_var.hpp"

namespace kolo::config {

namespace vars {

// ---- PyTorch backend ----
inline constexpr Var torch_spin_us{"KOLO_TORCH_SPIN_US",
                                   Kind::integer,
                                   Section::torch,
                                   Reader::torch,
                                   0,
                                   10000000,
                                   "50",
                                   "how long a waiting Python thread, and the idle worker thread, "
                                   "spin (with `sched_yield`) before blocking"};

}  // namespace vars

inline constexpr const Var* kTorchVars[] = {&vars::torch_spin_us};

}  // namespace kolo::config
