// backends/torch/build_config.hpp — the variables `pip install backends/torch` reads (setup.py),
// declared here, next to it, for docs/environment.md and the name scan; the library reads none.
// How a variable is declared: kolo/core/config_var.hpp.
#pragma once

#include "kolo/core/config_var.hpp"

namespace kolo::config {

namespace vars {

// ---- building the PyTorch backend (read by backends/torch's build, not by the library) ----
inline constexpr Var include_dir{"KOLO_INCLUDE_DIR",
                                 Kind::text,
                                 Section::build,
                                 Reader::none,
                                 0,
                                 0,
                                 "the checkout's `include/`",
                                 "kolo headers to compile `kolo_torch` against (an installed kolo: "
                                 "`<prefix>/include`)",
                                 {},
                                 {},
                                 true};
inline constexpr Var torch_python{"KOLO_TORCH_PYTHON",
                                  Kind::text,
                                  Section::build,
                                  Reader::none,
                                  0,
                                  0,
                                  "the interpreter running pip",
                                  "Python whose torch `kolo_torch` is built against",
                                  {},
                                  {},
                                  true};

inline constexpr Var torch_cuda{"KOLO_TORCH_CUDA",
                                Kind::flag,
                                Section::build,
                                Reader::none,
                                0,
                                1,
                                "0",
                                "`1`: `pip install backends/torch` builds the CUDA variant (CUDA "
                                "tensors through kolo's NCCL transport; needs the CUDA toolkit)",
                                {},
                                {},
                                true};

}  // namespace vars

inline constexpr const Var* kBuildVars[] = {&vars::include_dir, &vars::torch_python,
                                            &vars::torch_cuda};

}  // namespace kolo::config
