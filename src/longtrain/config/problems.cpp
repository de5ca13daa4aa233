// Problems: the list and the one error that reports it.
#include "longtrain/config/problems.h"

#include <algorithm>

namespace lt::config {

void Problems::add(const std::string& message) {
  if (std::find(list_.begin(), list_.end(), message) == list_.end()) list_.push_back(message);
}

void Problems::throwIfAny() const {
  if (list_.empty()) return;
  if (list_.size() == 1) throw Error(list_[0]);
  std::string all = "the config has " + std::to_string(list_.size()) + " problems:";
  for (size_t i = 0; i < list_.size(); ++i) all += "\n  " + std::to_string(i + 1) + ". " + list_[i];
  throw Error(all);
}

}  // namespace lt::config
