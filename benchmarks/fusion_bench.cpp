// kolo-fusion-bench — the fusion target (docs/engine.md): many small gradients through
// kolo::Engine (negotiation + fusion) against one allreduce of the same total size.
//
//   kolo-run -np 2 kolo-fusion-bench [--tensors 1024] [--tensor-bytes 4K] [-n 20] [-w 3]
//                                    [-r 5] [--transport shm|tcp|routed] [-J file]
//
// Three timings, each a mean per step over -n steps after warm-up, averaged across ranks:
//   one      one tensors x tensor-bytes float32 allreduce through Communicator (the reference)
//   engine1  the same single tensor through the Engine (enqueue, wait)
//   fused    `tensors` tensors of tensor-bytes each, all enqueued, then all waited for: the
//            engine's steady state (cached negotiation, fusion into one collective)
//   coalesced the same tensors as one submission (Engine::allreduce_coalesced_async): one
//            handle, one negotiation entry
// and with --optimizer, four more: the tensors as the gradients of a DistributedOptimizer (SGD)
// on the same engine, summed and applied by step():
//   opt-each      gradient_ready(i) for each, from the last to the first (a backward pass's
//                 order), then step(), with the default buckets (one coalesced submission per
//                 bucket: 1 MiB, then up to 25 MiB)
//   opt-each, =   the same with first_bucket_bytes = 0 (every bucket up to 25 MiB)
//   opt-each, 0   the same with bucket_bytes = 0 (one submission per gradient)
//   opt-list, 0   bucket_bytes = 0, gradients_ready() (one coalesced submission), then step()
// measured -r times, interleaved (the order rotates each repeat), so that a busy machine weighs
// on all of them alike. Each repeat gives the ratios fused / one and coalesced / one; the median of
// the repeats and the worst are printed (target <= 1.2). The results are checked after the timed
// steps (exact small-integer sums). Exit 1 on a wrong element, 2 on bad arguments.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>
#include <kolo/optim/optim.hpp>

#include "size_arg.hpp"

namespace {

struct Args {
  std::size_t tensors = 1024;
  std::size_t tensor_bytes = 4096;
  long iters = 20;
  long warmup = 3;
  long repeats = 5;
  bool flat = false;       // --layout flat: the tensors are views into one buffer, back to back
  bool optimizer = false;  // --optimizer: also time a DistributedOptimizer's two ways to report
  std::string transport;
  std::string json;
};

constexpr const char* kUsage =
    "Usage: kolo-fusion-bench [--tensors N] [--tensor-bytes SIZE] [-n ITERS] [-w WARMUP]\n"
    "                         [-r REPEATS] [--layout separate|flat] [--transport shm|tcp|routed]\n"
    "                         [--optimizer] [-J FILE]\n"
    "                         (under kolo-run)\n";

using kolo::bench::parse_bytes;

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--optimizer") {
      a.optimizer = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--tensors") {
      a.tensors = std::stoul(v);
    } else if (k == "--tensor-bytes") {
      a.tensor_bytes = parse_bytes(v);
    } else if (k == "-n") {
      a.iters = std::stol(v);
    } else if (k == "-w") {
      a.warmup = std::stol(v);
    } else if (k == "-r") {
      a.repeats = std::stol(v);
    } else if (k == "--transport") {
      if (v != "shm" && v != "tcp" && v != "routed") throw std::invalid_argument(v);
      a.transport = v;
    } else if (k == "--layout") {
      if (v != "separate" && v != "flat") throw std::invalid_argument("--layout " + v);
      a.flat = v == "flat";
    } else if (k == "-J") {
      a.json = v;
    } else {
      throw std::invalid_argument("unknown option " + k);
    }
  }
  if (a.tensors == 0 || a.tensor_bytes < sizeof(float) || a.iters < 1 || a.warmup < 0 ||
      a.repeats < 1) {
    throw std::invalid_argument("counts must be positive");
  }
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Cycles run by a thread waiting for its handles (0 for an engine that has no such count).
template <class Stats>
std::uint64_t driven_cycles(const Stats& s) {
  if constexpr (requires { s.driven_cycles; }) {
    return s.driven_cycles;
  } else {
    return 0;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Small integers: every sum over the ranks is exact in float32.
void fill(std::span<float> v, int rank) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i + 3 * rank) % 7);
}

std::size_t count_wrong(std::span<const float> v, int n) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    float expect = 0;
    for (int r = 0; r < n; ++r) expect += static_cast<float>((i + 3 * r) % 7);
    wrong += v[i] != expect;
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo-fusion-bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  if (!a.transport.empty()) ::setenv("KOLO_TRANSPORT", a.transport.c_str(), 1);
  try {
    // Two communicators (each its own rendezvous prefix): the reference, and the engine's.
    auto ref = kolo::Communicator<>::from_env();
    kolo::Engine<> engine(kolo::Communicator<>::from_env());
    const int n = ref.size();
    const int me = ref.rank();
    const std::size_t per = a.tensor_bytes / sizeof(float);
    const std::size_t total = per * a.tensors;
    auto mean_us = [&](double secs, long iters) {
      double us = secs / static_cast<double>(iters) * 1e6;
      ref.allreduce(std::span<double>(&us, 1), kolo::ReduceOp::sum);
      return us / n;
    };

    // The measurements run interleaved, repeat by repeat (the order rotates), so that
    // whatever else the machine does falls on all of them alike; each repeat gives a ratio.
    std::vector<float> big(total);
    fill(big, me);
    // Separate allocations (the engine packs them into its fusion buffer and unpacks them), or
    // views into one buffer, back to back (the engine reduces them where they are).
    std::vector<std::vector<float>> separate;
    std::vector<float> flat;
    std::vector<std::span<float>> grads;
    if (a.flat) {
      flat.resize(total);
      for (std::size_t k = 0; k < a.tensors; ++k) grads.emplace_back(flat.data() + k * per, per);
    } else {
      separate.assign(a.tensors, std::vector<float>(per));
      for (auto& g : separate) grads.emplace_back(g);
    }
    std::vector<std::string> names;
    // "grad/k": the names a DistributedOptimizer with name_prefix "" gives parameter "k"'s
    // gradient, so that --optimizer's submissions share the engine's cache entries with these
    // (1024 more names would exceed the default cache capacity and evict each other).
    for (std::size_t k = 0; k < a.tensors; ++k) names.push_back("grad/" + std::to_string(k));
    std::vector<kolo::Handle> handles(a.tensors);
    auto one = [&] { ref.allreduce(std::span<float>(big)); };
    auto engine1 = [&] {
      engine.allreduce_async("big", kolo::TensorView(std::span<float>(big))).wait();
    };
    auto step = [&] {
      for (std::size_t k = 0; k < a.tensors; ++k) {
        handles[k] = engine.allreduce_async(names[k], kolo::TensorView(grads[k]));
      }
      for (auto& h : handles) h.wait();
    };
    std::vector<kolo::TensorView> views;
    for (auto g : grads) views.emplace_back(g);
    auto coalesced = [&] { engine.allreduce_coalesced_async("bucket", views).wait(); };
    // --optimizer: the tensors are the gradients of parameters (values of their own); SGD with
    // lr = 0 leaves the values as they are, the step's pass over them is timed in both cases.
    // Three optimizers over the same parameters: default buckets, buckets without the smaller
    // first one, and no buckets.
    std::vector<std::vector<float>> values;
    std::unique_ptr<kolo::DistributedOptimizer<kolo::SGD>> dopt, dopt1, dopt0;
    if (a.optimizer) {
      values.assign(a.tensors, std::vector<float>(per));
      std::vector<kolo::Parameter> params;
      for (std::size_t k = 0; k < a.tensors; ++k) {
        params.push_back({std::to_string(k), values[k], grads[k]});
      }
      kolo::DistributedOptions o;
      o.name_prefix = "";
      o.op = kolo::ReduceOp::sum;  // the check below wants exact sums
      using Dopt = kolo::DistributedOptimizer<kolo::SGD>;
      dopt = std::make_unique<Dopt>(engine, kolo::SGD({.lr = 0.0}), params, o);
      o.name_prefix = "equal/";
      o.first_bucket_bytes = 0;
      dopt1 = std::make_unique<Dopt>(engine, kolo::SGD({.lr = 0.0}), params, o);
      o.name_prefix = "";
      o.bucket_bytes = 0;
      dopt0 = std::make_unique<Dopt>(engine, kolo::SGD({.lr = 0.0}), std::move(params), o);
    }
    struct OptCase {
      const char* what;
      std::function<void()> run;
      std::vector<double> us, ratios;
    };
    std::vector<OptCase> opt_cases;
    if (a.optimizer) {
      auto each = [&](kolo::DistributedOptimizer<kolo::SGD>* d) {
        return [&a, d] {
          for (std::size_t k = a.tensors; k-- > 0;) d->gradient_ready(k);  // backward's order
          d->step();
        };
      };
      opt_cases.push_back({"optimizer: gradient_ready(i) each, buckets", each(dopt.get()), {}, {}});
      opt_cases.push_back(
          {"optimizer: the same, no smaller first bucket", each(dopt1.get()), {}, {}});
      opt_cases.push_back(
          {"optimizer: gradient_ready(i) each, no buckets", each(dopt0.get()), {}, {}});
      opt_cases.push_back({"optimizer: gradients_ready(), no buckets",
                           [&] {
                             dopt0->gradients_ready();
                             dopt0->step();
                           },
                           {},
                           {}});
    }
    const int cases = 4 + static_cast<int>(opt_cases.size());
    for (long i = 0; i < a.warmup; ++i) {
      one();
      engine1();
      step();
      coalesced();
      for (auto& c : opt_cases) c.run();
    }
    // Besides the wall time: this process's CPU time (all threads) and its voluntary context
    // switches (a thread went to sleep: waiting for a peer or for another thread), per step.
    // Both depend far less on what else the machine runs than the wall time does.
    struct Usage {
      double cpu_us = 0, sleeps = 0;
    };
    auto usage_now = [] {
      rusage u{};
      ::getrusage(RUSAGE_SELF, &u);
      Usage x;
      x.cpu_us = (static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 +
                  static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec));
      x.sleeps = static_cast<double>(u.ru_nvcsw);
      return x;
    };
    Usage one_use, fused_use;
    auto timed = [&](auto&& body, Usage* use) {
      ref.barrier();
      const Usage u0 = usage_now();
      const auto t0 = std::chrono::steady_clock::now();
      for (long i = 0; i < a.iters; ++i) body();
      const double secs = seconds_since(t0);
      const Usage u1 = usage_now();
      if (use) {
        use->cpu_us += (u1.cpu_us - u0.cpu_us) / static_cast<double>(a.iters);
        use->sleeps += (u1.sleeps - u0.sleeps) / static_cast<double>(a.iters);
      }
      return mean_us(secs, a.iters);
    };
    std::vector<double> ones, engine1s, fuseds, ratios, coalesceds, coalesced_ratios;
    std::uint64_t fused_collectives = 0, cycles = 0, driven = 0;
    for (long rep = 0; rep < a.repeats; ++rep) {
      double o = 0, e1 = 0, f = 0, c = 0;
      std::vector<double> opt_us(opt_cases.size());
      for (int k = 0; k < cases; ++k) {
        switch ((k + rep) % cases) {
          case 0:
            o = timed(one, &one_use);
            break;
          case 1:
            e1 = timed(engine1, nullptr);
            break;
          case 2:
            c = timed(coalesced, nullptr);
            break;
          case 3: {
            const kolo::EngineStats before = engine.stats();
            f = timed(step, &fused_use);
            const kolo::EngineStats after = engine.stats();
            fused_collectives += after.fused_collectives - before.fused_collectives;
            cycles += after.cycles - before.cycles;
            driven += driven_cycles(after) - driven_cycles(before);
            break;
          }
          default: {
            const auto j = static_cast<std::size_t>((k + rep) % cases - 4);
            opt_us[j] = timed(opt_cases[j].run, nullptr);
          }
        }
      }
      ones.push_back(o);
      engine1s.push_back(e1);
      fuseds.push_back(f);
      ratios.push_back(f / o);
      coalesceds.push_back(c);
      coalesced_ratios.push_back(c / o);
      for (std::size_t j = 0; j < opt_cases.size(); ++j) {
        opt_cases[j].us.push_back(opt_us[j]);
        opt_cases[j].ratios.push_back(opt_us[j] / o);
      }
    }
    const double coalesced_us = median(coalesceds), coalesced_ratio = median(coalesced_ratios);
    const double coalesced_worst =
        *std::max_element(coalesced_ratios.begin(), coalesced_ratios.end());
    const double one_us = median(ones), engine1_us = median(engine1s), fused_us = median(fuseds);
    const double ratio = median(ratios);
    const double worst = *std::max_element(ratios.begin(), ratios.end());
    const double steps = static_cast<double>(a.iters * a.repeats);
    const double collectives_per_step = static_cast<double>(fused_collectives) / steps;
    const double cycles_per_step = static_cast<double>(cycles) / steps;
    const double driven_per_step = static_cast<double>(driven) / steps;
    // Means over the repeats, then over the ranks.
    double use[4] = {one_use.cpu_us, one_use.sleeps, fused_use.cpu_us, fused_use.sleeps};
    for (double& x : use) x /= static_cast<double>(a.repeats);
    ref.allreduce(std::span<double>(use, 4), kolo::ReduceOp::sum);
    for (double& x : use) x /= n;

    // Check: fresh inputs, one more of each, exact sums.
    std::size_t wrong = 0;
    fill(big, me);
    ref.allreduce(std::span<float>(big));
    wrong += count_wrong(big, n);
    fill(big, me);
    engine.allreduce_async("big", kolo::TensorView(std::span<float>(big))).wait();
    wrong += count_wrong(big, n);
    for (auto g : grads) fill(g, me);
    step();
    for (const auto g : grads) wrong += count_wrong(g, n);
    for (auto g : grads) fill(g, me);
    coalesced();
    for (const auto g : grads) wrong += count_wrong(g, n);
    for (auto& c : opt_cases) {
      for (auto g : grads) fill(g, me);
      c.run();
      for (const auto g : grads) wrong += count_wrong(g, n);
    }
    double w = static_cast<double>(wrong);
    ref.allreduce(std::span<double>(&w, 1), kolo::ReduceOp::sum);

    if (me == 0) {
      const char* route = std::getenv("KOLO_TRANSPORT");
      std::printf(
          "# kolo-fusion-bench: %zu tensors x %zu B float32 sum (%s) vs one %zu B allreduce\n",
          a.tensors, a.tensor_bytes, a.flat ? "views into one buffer" : "separate allocations",
          total * sizeof(float));
      std::printf(
          "# ranks %d, transport %s, iters %ld, warmup %ld, repeats %ld (interleaved); time = "
          "mean per step, averaged across ranks, median of the repeats\n",
          n, route ? route : "routed", a.iters, a.warmup, a.repeats);
      std::printf("%-44s %12.1f us\n", "one allreduce (Communicator)", one_us);
      std::printf("%-44s %12.1f us\n", "one tensor through the Engine", engine1_us);
      std::printf(
          "%-44s %12.1f us  (per step: %.1f fused collectives, %.1f cycles, %.1f of them run by "
          "the waiting thread)\n",
          "fused: all tensors, Engine", fused_us, collectives_per_step, cycles_per_step,
          driven_per_step);
      std::printf("%-44s %12.1f us\n", "coalesced: all tensors, one submission", coalesced_us);
      std::printf(
          "# per step and rank: CPU %.0f us one, %.0f us fused (%.2fx); sleeps %.1f one, %.1f "
          "fused\n",
          use[0], use[2], use[2] / use[0], use[1], use[3]);
      std::printf("# fused / one : %.3f median, %.3f worst of %ld (target <= 1.2)\n", ratio, worst,
                  a.repeats);
      std::printf("# coalesced / one : %.3f median, %.3f worst of %ld\n", coalesced_ratio,
                  coalesced_worst, a.repeats);
      for (const auto& c : opt_cases) {  // each includes step()'s SGD pass over the values
        std::printf("%-48s %8.1f us  (/ one: %.3f median, %.3f worst)\n", c.what, median(c.us),
                    median(c.ratios), *std::max_element(c.ratios.begin(), c.ratios.end()));
      }
      std::printf("# Out of bounds values : %.0f %s\n", w, w > 0 ? "FAILED" : "OK");
      if (!a.json.empty()) {
        std::ofstream f(a.json);
        f << "{\"tool\": \"kolo-fusion-bench\", \"ranks\": " << n << ", \"transport\": \""
          << (route ? route : "routed") << "\", \"layout\": \"" << (a.flat ? "flat" : "separate")
          << "\", \"tensors\": " << a.tensors << ", \"tensor_bytes\": " << a.tensor_bytes
          << ", \"repeats\": " << a.repeats << ", \"one_us\": " << one_us
          << ", \"engine_one_us\": " << engine1_us << ", \"fused_us\": " << fused_us
          << ", \"collectives_per_step\": " << collectives_per_step
          << ", \"cycles_per_step\": " << cycles_per_step
          << ", \"driven_cycles_per_step\": " << driven_per_step << ", \"one_cpu_us\": " << use[0]
          << ", \"fused_cpu_us\": " << use[2] << ", \"one_sleeps\": " << use[1]
          << ", \"fused_sleeps\": " << use[3] << ", \"ratio\": " << ratio
          << ", \"worst_ratio\": " << worst << ", \"coalesced_us\": " << coalesced_us
          << ", \"coalesced_ratio\": " << coalesced_ratio
          << ", \"coalesced_worst_ratio\": " << coalesced_worst;
        if (!opt_cases.empty()) {
          const char* keys[] = {"optimizer_each", "optimizer_each_equal_buckets",
                                "optimizer_each_nobuckets", "optimizer_list_nobuckets"};
          for (std::size_t j = 0; j < opt_cases.size(); ++j) {
            f << ", \"" << keys[j] << "_us\": " << median(opt_cases[j].us) << ", \"" << keys[j]
              << "_ratio\": " << median(opt_cases[j].ratios);
          }
        }
        f << ", \"ratios\": [";
        for (std::size_t i = 0; i < ratios.size(); ++i) f << (i ? ", " : "") << ratios[i];
        f << "], \"wrong\": " << w << "}\n";
      }
    }
    return w > 0 ? 1 : 0;
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "kolo-fusion-bench: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 1;
  }
}
