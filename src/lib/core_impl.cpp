// kolo::kolo_lib: the non-template code behind the public headers' declarations, compiled once
// (include/kolo/core/compiled_core.hpp, KOLO_IMPL_INLINE): what a user's file would otherwise
// parse and compile in every translation unit.
#include "kolo/algorithm/detail/registry_impl.hpp"
#include "kolo/algorithm/detail/selector_impl.hpp"
#include "kolo/core/detail/simd_x86.hpp"
#include "kolo/detail/communicator_impl.hpp"
#include "kolo/engine/detail/timeline_impl.hpp"
#include "kolo/topology/detail/bootstrap_impl.hpp"
#include "kolo/topology/detail/topology_impl.hpp"
#include "kolo/transport/detail/mesh_impl.hpp"
