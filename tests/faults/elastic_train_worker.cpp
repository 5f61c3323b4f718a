// elastic_train_worker — the rank program of the elastic training tests (test_elastic_train.cpp):
// a DistributedOptimizer training loop under kolo::run_elastic that goes on with the survivors
// when a rank is lost, and checks its final parameters bit for bit against a replay.
//
// `elastic_train_worker` under `kolo-run --elastic`. Four parameters (3000, 17, 20000 and 5
// floats; buckets of 16 KiB, so a step is several engine submissions) start from each rank's own
// values; run_elastic's first sync makes them rank 0's. Each step every rank's gradient is its
// rank + 1 in every element (reported parameter by parameter, last first, as a backward pass
// does); op = sum, so the summed gradient is exactly n(n + 1)/2 for the world size n of that
// step; SGD (lr 1/8, momentum 1/2) applies it; the step records n in a tracked history, and
// every third step commits. After STEPS steps each rank replays the history with the same SGD on
// rank 0's starting values: the parameters must equal the replay bit for bit — a step applied
// twice, a step lost because the state was not restored (the step counter moves first), an average
// over the wrong size, or survivors that diverged would all differ. Lines on stdout (one write
// each):
//   KOLO_PID rank=R pid=P pgid=G store=S       before connecting
//   KOLO_LOOP rank=R                           training has started (after the first sync)
//   KOLO_RESET rank=R new_rank=r size=n lost=1,3 gen=g resets=k step=s mono=T
//                                              after each recovery (s: the step it resumes at)
//   KOLO_TRAINED rank=R new_rank=r size=n steps=S resets=k history=4x120,3x180 digest=H
//   KOLO_WRONG rank=R ...                      the parameters differ from the replay (exit 5)
//   KOLO_FAULT rank=R kind=K ... what=W        an error not recovered (exit 3)
//   KOLO_PROGRESS step=s mono=T                rank 0, after each step (KOLO_TRAIN_PROGRESS=1)
//   KOLO_RESUMED step=s                        rank 0 loaded a checkpoint (KOLO_TRAIN_CHECKPOINT)
// KOLO_TRAINED's executed=E counts the steps this rank ran, those redone after a reset included.
// KOLO_TRAIN_STEPS (default 300) and KOLO_TRAIN_SLEEP_US (default 500, between steps) set the
// pace; KOLO_TEST_TRAIN_DIE="R:S" makes parent rank R SIGKILL itself in step S after it
// reported half of its gradients (buckets of that step in flight on the others).
// Joining: KOLO_TRAIN_JOIN=NAME makes every rank call ElasticState::admit_joiners(NAME), and
// KOLO_TRAIN_SPAWN_AT=S makes parent rank 0 start this program as `elastic_train_worker join`
// when it begins step S: that process calls kolo::join_elastic(NAME), builds the same model
// and optimizer, and trains the rest of the steps with the group (its lines say rank=j); rank 0
// prints "KOLO_JOINER_DONE status=X" after reaping it. KOLO_RESET lines carry joined=k.
// For benchmarks/recovery_train.py's restart baseline: KOLO_TRAIN_ELASTIC=0 runs the same loop
// without run_elastic (a lost rank ends the job), and KOLO_TRAIN_CHECKPOINT=PATH with
// KOLO_TRAIN_CHECKPOINT_EVERY=C makes rank 0 write the state (step, history, parameters,
// momentum) to PATH every C steps and load it at start when PATH exists.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>
#include <kolo/optim/optim.hpp>

#include "spawn_joiner.hpp"

namespace {

void say(const std::string& line) {
  const std::string s = line + "\n";
  [[maybe_unused]] const ssize_t k = ::write(STDOUT_FILENO, s.data(), s.size());
}

double mono_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string label = [] {
  const char* r = std::getenv("KOLO_RANK");
  return std::string(r ? r : "?");
}();

int report(const kolo::Error& e) {
  std::string what = e.what();
  for (char& c : what) {
    if (c == '\n') c = ' ';
  }
  say("KOLO_FAULT rank=" + label + " kind=" + kolo::error_kind_name(e.kind()) + " what=" + what);
  return 3;
}

long env_long(const char* name, long dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : dflt;
}

constexpr std::size_t kSizes[] = {3000, 17, 20000, 5};

// Rank r's starting value of element i of parameter p (run_elastic's sync makes them rank 0's).
float start_value(int r, std::size_t p, std::size_t i) {
  return static_cast<float>(r * 7) + static_cast<float>((i + 3 * p) % 13);
}

struct Model {
  std::vector<std::vector<float>> values, grads;
  std::vector<kolo::Parameter> params;
  explicit Model(int r) {
    for (std::size_t p = 0; p < std::size(kSizes); ++p) {
      values.emplace_back(kSizes[p]);
      grads.emplace_back(kSizes[p], 0.0f);
      for (std::size_t i = 0; i < kSizes[p]; ++i) values[p][i] = start_value(r, p, i);
    }
    for (std::size_t p = 0; p < std::size(kSizes); ++p) {
      params.push_back({"w" + std::to_string(p), values[p], grads[p]});
    }
  }
};

kolo::SGD make_sgd() {
  return kolo::SGD({.lr = 0.125, .momentum = 0.5});
}

std::uint64_t digest(const Model& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& v : m.values) {
    const auto* b = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

std::string history_text(const std::vector<std::int32_t>& sizes) {
  std::string s;
  for (std::size_t i = 0; i < sizes.size();) {
    std::size_t j = i;
    while (j < sizes.size() && sizes[j] == sizes[i]) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(sizes[i]) + "x" + std::to_string(j - i);
    i = j;
  }
  return s;
}

// The checkpoint file: "KCKP", the step, the history, every parameter's values, every state
// tensor's bytes (the shapes are fixed by the program, so the file is checked by its size).
template <class Opt>
std::vector<std::span<std::byte>> checkpoint_parts(Opt& opt, Model& m, std::int64_t& step,
                                                   std::vector<std::int32_t>& sizes) {
  std::vector<std::span<std::byte>> parts;
  parts.push_back(std::as_writable_bytes(std::span<std::int64_t>(&step, 1)));
  parts.push_back(std::as_writable_bytes(std::span<std::int32_t>(sizes)));
  for (auto& v : m.values) parts.push_back(std::as_writable_bytes(std::span<float>(v)));
  for (const auto& st : opt.optimizer().state(std::span<const kolo::Parameter>(m.params))) {
    parts.emplace_back(static_cast<std::byte*>(st.tensor.data), st.tensor.bytes());
  }
  return parts;
}

void save_checkpoint(const std::string& path, const std::vector<std::span<std::byte>>& parts) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write("KCKP", 4);
    for (auto p : parts)
      out.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size()));
    if (!out) throw kolo::Error("checkpoint: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw kolo::Error("checkpoint: cannot rename " + tmp);
}

bool load_checkpoint(const std::string& path, const std::vector<std::span<std::byte>>& parts) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  char magic[4] = {};
  in.read(magic, 4);
  if (std::memcmp(magic, "KCKP", 4) != 0) throw kolo::Error("checkpoint: " + path + " is not one");
  for (auto p : parts) {
    in.read(reinterpret_cast<char*>(p.data()), static_cast<std::streamsize>(p.size()));
  }
  if (!in || in.peek() != std::char_traits<char>::eof()) {
    throw kolo::Error("checkpoint: " + path + " has the wrong size");
  }
  return true;
}

int run(bool joiner) {
  const char* store = std::getenv("KOLO_STORE");
  say("KOLO_PID rank=" + label + " pid=" + std::to_string(::getpid()) +
      " pgid=" + std::to_string(::getpgrp()) + " store=" + (store ? store : "-"));
  const long steps = env_long("KOLO_TRAIN_STEPS", 300);
  const long sleep_us = env_long("KOLO_TRAIN_SLEEP_US", 500);
  const long commit_every = std::max(1L, env_long("KOLO_TRAIN_COMMIT_EVERY", 3));
  int die_rank = -1;
  long die_step = -1;
  if (const char* die = std::getenv("KOLO_TEST_TRAIN_DIE")) {
    std::sscanf(die, "%d:%ld", &die_rank, &die_step);
  }
  const char* join_name = std::getenv("KOLO_TRAIN_JOIN");
  const long spawn_at = env_long("KOLO_TRAIN_SPAWN_AT", -1);
  if (joiner) label = "j";
  kolo::Communicator<> comm = joiner ? kolo::join_elastic(join_name ? join_name : "")
                                     : kolo::Communicator<>(kolo::Topology::from_env());
  const int parent = joiner ? -1 : comm.rank();
  if (!joiner) label = std::to_string(parent);
  Model model(comm.rank());
  kolo::DistributedOptions o;
  o.op = kolo::ReduceOp::sum;
  o.bucket_bytes = 16 << 10;
  o.first_bucket_bytes = 4 << 10;
  kolo::DistributedOptimizer opt(std::move(comm), make_sgd(), model.params, o);
  kolo::ElasticState state(opt);
  if (join_name != nullptr) state.admit_joiners(join_name);
  pid_t spawned = -1;
  std::int64_t step = 0;
  std::vector<std::int32_t> sizes(static_cast<std::size_t>(steps), 0);
  state.track("step", step);
  state.track("sizes", std::as_writable_bytes(std::span<std::int32_t>(sizes)));
  int resets = 0;
  state.on_reset([&](const kolo::ResetInfo& r) {
    resets = r.resets;
    std::string lost;
    for (int q : r.lost) lost += (lost.empty() ? "" : ",") + std::to_string(q);
    char t[64];
    std::snprintf(t, sizeof(t), " mono=%.6f", mono_now());
    say("KOLO_RESET rank=" + label + " new_rank=" + std::to_string(r.new_rank) +
        " size=" + std::to_string(r.new_size) + " lost=" + lost +
        " gen=" + std::to_string(r.generation) + " resets=" + std::to_string(r.resets) +
        " joined=" + std::to_string(r.joined) + " step=" + std::to_string(step) + t);
  });
  const bool progress = env_long("KOLO_TRAIN_PROGRESS", 0) != 0;
  const bool elastic = env_long("KOLO_TRAIN_ELASTIC", 1) != 0;
  const char* ckpt = std::getenv("KOLO_TRAIN_CHECKPOINT");
  const long ckpt_every = env_long("KOLO_TRAIN_CHECKPOINT_EVERY", 0);
  long executed = 0;
  if (ckpt != nullptr && parent == 0 &&
      load_checkpoint(ckpt, checkpoint_parts(opt, model, step, sizes))) {
    say("KOLO_RESUMED step=" + std::to_string(step));
  }
  bool announced = false;
  auto loop = [&](auto& s) {
    if (!announced) {
      say("KOLO_LOOP rank=" + label);
      announced = true;
    }
    while (step < steps) {
      ++executed;
      if (parent == 0 && step == spawn_at && spawned < 0) {
        spawned = kolo_exact::spawn_joiner({"join"});
        if (spawned < 0)
          throw kolo::Error("posix_spawn failed: " + std::string(std::strerror(errno)));
      }
      // The step is counted before it is done, so a step that fails leaves the tracked state
      // ahead of the parameters: only restore() puts them back together.
      const long t = step++;
      sizes[static_cast<std::size_t>(t)] = opt.size();
      const float g = static_cast<float>(opt.rank() + 1);
      const std::size_t n = model.params.size();
      for (std::size_t k = n; k-- > 0;) {
        if (parent == die_rank && t == die_step && k == n / 2) ::raise(SIGKILL);
        std::fill(model.grads[k].begin(), model.grads[k].end(), g);
        opt.gradient_ready(k);
      }
      opt.step();
      if (step % commit_every == 0 || step == steps) s.commit();
      if (ckpt != nullptr && ckpt_every > 0 && step % ckpt_every == 0 && opt.rank() == 0) {
        save_checkpoint(ckpt, checkpoint_parts(opt, model, step, sizes));
      }
      if (progress && opt.rank() == 0) {
        char t[64];
        std::snprintf(t, sizeof(t), " mono=%.6f", mono_now());
        say("KOLO_PROGRESS step=" + std::to_string(step) + t);
      }
      if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
  };
  if (elastic) {
    kolo::run_elastic(state, loop);
  } else {
    state.sync();  // rank 0's values (and a loaded checkpoint) on every rank, as run_elastic does
    loop(state);
  }
  if (spawned > 0) say("KOLO_JOINER_DONE status=" + kolo_exact::reap(spawned));
  // The replay: rank 0's starting values, the recorded world sizes, the same optimizer.
  Model replay(0);
  kolo::SGD sgd = make_sgd();
  for (long t = 0; t < steps; ++t) {
    const int n = sizes[static_cast<std::size_t>(t)];
    if (n < 1) {
      say("KOLO_WRONG rank=" + label + " step " + std::to_string(t) + " has no recorded size");
      return 5;
    }
    const float sum = static_cast<float>(n * (n + 1) / 2);
    for (auto& gr : replay.grads) std::fill(gr.begin(), gr.end(), sum);
    sgd.step(std::span<kolo::Parameter>(replay.params));
  }
  for (std::size_t p = 0; p < model.values.size(); ++p) {
    if (std::memcmp(model.values[p].data(), replay.values[p].data(),
                    model.values[p].size() * sizeof(float)) != 0) {
      std::size_t i = 0;
      while (model.values[p][i] == replay.values[p][i]) ++i;
      say("KOLO_WRONG rank=" + label + " parameter w" + std::to_string(p) + "[" +
          std::to_string(i) + "] = " + std::to_string(model.values[p][i]) + ", replay " +
          std::to_string(replay.values[p][i]) + " (history " + history_text(sizes) + ")");
      return 5;
    }
  }
  char h[32];
  std::snprintf(h, sizeof(h), "%016llx", static_cast<unsigned long long>(digest(model)));
  say("KOLO_TRAINED rank=" + label + " new_rank=" + std::to_string(opt.rank()) +
      " size=" + std::to_string(opt.size()) + " steps=" + std::to_string(step) +
      " resets=" + std::to_string(resets) + " executed=" + std::to_string(executed) +
      " history=" + history_text(sizes) + " digest=" + h);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 && std::string(argv[1]) == "join");
  } catch (const kolo::Error& e) {
    return report(e);
  } catch (const std::exception& e) {
    say("KOLO_OTHER rank=" + label + " " + e.what());
    return 6;
  }
}
