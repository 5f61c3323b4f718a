// kolo/optim/optim.hpp — data-parallel training in one include: the Parameter and Optimizer
// concepts, the SGD and Adam reference optimizers, DistributedOptimizer, and its elastic state
// (ElasticState, run_elastic).
#pragma once

#include "kolo/optim/adam.hpp"
#include "kolo/optim/distributed_optimizer.hpp"
#include "kolo/optim/elastic.hpp"
#include "kolo/optim/parameter.hpp"
#include "kolo/optim/sgd.hpp"
