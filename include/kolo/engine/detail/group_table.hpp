// kolo/engine/detail/group_table.hpp — the group table: members of a grouped allreduce that
// every rank agreed on wait here until their whole group is ready, then run together.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kolo/engine/detail/records.hpp"

namespace kolo::detail::engine {

class GroupTable {
 public:
  // Group members in `responses` wait (as copies: their slot may be evicted meanwhile) until
  // the whole group is ready; a completed group joins the responses where its last member
  // arrived. Other responses keep their order.
  void hold_incomplete(std::vector<Response>& responses) {
    bool any = false;
    for (const Response& r : responses) any = any || (!r.p->group.empty() && r.error().empty());
    if (!any) return;
    scratch_.clear();
    for (const Response& r : responses) {
      if (r.p->group.empty() || !r.error().empty()) {
        scratch_.push_back(r);
        continue;
      }
      auto data = std::make_unique<Decided>();
      data->name = *r.name;
      data->p = *r.p;
      if (r.decided) data->counts = r.decided->counts;
      Response h = r;
      h.name = &data->name;
      h.p = &data->p;
      h.decided = data.get();
      h.slot = -1;  // found by name when it runs
      const std::string group = data->p.group;
      held_names_.insert(data->name);
      auto& members = groups_[group];
      members.push_back(Held{std::move(data), h});
      if (members.size() == members.front().r.p->group_size) {
        for (auto& m : members) {
          held_names_.erase(*m.r.name);
          scratch_.push_back(m.r);
          released_.push_back(std::move(m.data));
        }
        groups_.erase(group);
      }
    }
    responses.swap(scratch_);
  }

  // Whether `name` is a member that waits for the rest of its group.
  bool holds(std::string_view name) const {
    return !held_names_.empty() && held_names_.find(name) != held_names_.end();
  }

  // The last cycle's released groups are done with (their handles completed or failed).
  void end_cycle() { released_.clear(); }

 private:
  struct Held {  // a group member that waits for the rest of its group
    std::unique_ptr<Decided> data;
    Response r;
  };
  std::map<std::string, std::vector<Held>> groups_;
  std::set<std::string, std::less<>> held_names_;
  std::vector<std::unique_ptr<Decided>> released_;  // this cycle's completed groups
  std::vector<Response> scratch_;
};

}  // namespace kolo::detail::engine
