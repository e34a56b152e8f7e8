// A registry of named entries, filled before main() by static registrars (one in each file that
// defines an entry: a CLI command, a model family, an optimizer) and only read after. Names are
// kept sorted. A name registered twice is a bug: the program says so and aborts at start-up,
// before any command runs.
//
//   Registry<OptimizerFactory>& Optimizers() {
//     static Registry<OptimizerFactory> registry("optimizer");
//     return registry;
//   }
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace crucible {

template <typename Entry>
class Registry {
 public:
  // `kind`: what an entry is, in the singular ("model"), for messages.
  explicit Registry(const char* kind) : kind_(kind) {}
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  void Add(const std::string& name, Entry entry) {
    if (!entries_.emplace(name, std::move(entry)).second) {
      std::fprintf(stderr, "crucible: internal error: two %ss registered as '%s'\n", kind_,
                   name.c_str());
      std::abort();
    }
  }
  // The entry of `name`; UsageError (exit 2) naming `key` and every registered name otherwise:
  // "optimizer.name: unknown optimizer 'Adam' (choose one of AdamW, Lion, SGD)".
  const Entry& Find(const std::string& name, const std::string& key) const {
    const auto found = entries_.find(name);
    if (found != entries_.end()) return found->second;
    std::string all;
    for (const auto& [registered, entry] : entries_) all += (all.empty() ? "" : ", ") + registered;
    throw UsageError(key + ": unknown " + kind_ + " '" + name + "' (choose one of " + all + ")");
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& [name, entry] : entries_) names.push_back(name);
    return names;
  }
  const std::map<std::string, Entry>& entries() const { return entries_; }

 private:
  const char* kind_;
  std::map<std::string, Entry> entries_;
};

}  // namespace crucible
