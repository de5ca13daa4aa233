// Every problem of a config in one pass. The parser's reads and validate()'s rules run through
// a Problems, which keeps the message of each one that fails and goes on; at the end one error
// lists them all, so a config ported from DeepSpeed is fixed in one edit, not one run per key.
// Non-obvious: a failed read yields its default, so the rules after it still see a whole
// config; a rule whose result later rules need (the layout, the batch) stops the pass instead.
#pragma once
#include <string>
#include <vector>

#include "longtrain/core/check.h"

namespace lt::config {

class Problems {
 public:
  // Runs `f`; an lt::Error it throws is kept, not thrown. Returns whether `f` succeeded.
  template <class F>
  bool attempt(F&& f) {
    try {
      f();
      return true;
    } catch (const Error& e) {
      add(e.what());
      return false;
    }
  }
  void add(const std::string& message);
  bool empty() const { return list_.empty(); }
  size_t size() const { return list_.size(); }
  // One lt::Error: the message alone when there is one problem, else a numbered list.
  void throwIfAny() const;

 private:
  std::vector<std::string> list_;
};

}  // namespace lt::config
