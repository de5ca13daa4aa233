// A strict reader of one JSON object, shared by the config parser and the checkpoint
// manifest: typed reads with ranges, optional keys with a default or required ones, and a
// finish() that refuses any key nobody read (naming the closest known key). Every error names
// the key's dotted path after a label: "config key 'train.steps' ..." or
// "<manifest path>: field 'data.loader_cursors' ...".
// Non-obvious: a whole-valued float counts as an integer (DeepSpeed configs write 5e8).
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "longtrain/config/options.h"
#include "longtrain/config/problems.h"

namespace lt::config {

class JsonReader {
 public:
  // `j` may be null (an absent section: every optional read gives its default). `label`
  // starts every error message.
  JsonReader(const nlohmann::json* j, std::string path, std::string label = "config key");
  // Keeps, in `record`, every key read with the value it resolved to (given or default), at
  // its dotted path: the effective config `longtrain config --print` shows. Sub-readers share it.
  void recordInto(std::shared_ptr<nlohmann::json> record) { record_ = std::move(record); }
  // Keeps each read's error in `problems` and gives the default instead, so one pass finds every
  // problem (config/problems.h). Sub-readers share it. Without it, errors throw.
  void collectInto(std::shared_ptr<Problems> problems) { problems_ = std::move(problems); }

  // Records `value` as what `key` resolved to (for keys a parser reads itself through find()).
  void record(const std::string& key, const nlohmann::json& value) { recorded(key, value); }

  // Optional keys: absent or null gives `def`.
  int64_t getInt(const std::string& key, int64_t def, int64_t lo, int64_t hi);
  double getNum(const std::string& key, double def, double lo, double hi);
  bool getBool(const std::string& key, bool def);
  std::string getString(const std::string& key, const std::string& def);
  std::string getEnum(const std::string& key, const std::string& def, const std::vector<const char*>& choices);
  // One of an option enum's names (config/options.h), as its enum; `accepted` narrows the
  // names a key takes (empty: all of them).
  template <class E>
  E getOption(const std::string& key, E def, std::initializer_list<E> accepted = {}) {
    std::vector<const char*> names;
    for (const auto& [value, n] : OptionNames<E>::kAll)
      if (accepted.size() == 0 || std::find(accepted.begin(), accepted.end(), value) != accepted.end())
        names.push_back(n);
    return *optionFromName<E>(getEnum(key, optionName(def), names));  // getEnum gives a name of `names`
  }
  // A byte count: a non-negative integer, or a string with a unit ("4GiB", "512MiB").
  int64_t getBytes(const std::string& key, int64_t def);
  JsonReader sub(const std::string& key);  // an optional object

  // Required keys: absent is an error naming the key.
  const nlohmann::json& require(const std::string& key);
  int64_t requireInt(const std::string& key, int64_t lo, int64_t hi);
  std::string requireString(const std::string& key);
  bool requireBool(const std::string& key);
  const nlohmann::json& requireArray(const std::string& key);
  JsonReader requireObject(const std::string& key);

  const nlohmann::json* find(const std::string& key);  // marks the key known; null if absent
  bool has(const std::string& key) const;
  std::string keyPath(const std::string& key) const;
  std::string name(const std::string& key) const;  // "<label> '<path>'"
  // Any key present but never read is unknown: an error with the closest known key.
  void finish() const;

 private:
  int64_t toInt(const nlohmann::json& v, const std::string& key, int64_t lo, int64_t hi) const;
  double readNum(const std::string& key, double def, double lo, double hi);
  std::string readEnum(const std::string& key, const std::string& def, const std::vector<const char*>& choices);
  template <class T>
  T recorded(const std::string& key, T value) {
    if (record_) (*record_)[nlohmann::json::json_pointer("/" + pointerPath(key))] = value;
    return value;
  }
  std::string pointerPath(const std::string& key) const;
  // A read that throws: its error kept (collectInto) and `def` returned, or thrown.
  template <class T, class F>
  T guarded(T def, F&& read) {
    if (!problems_) return read();
    T out = def;
    problems_->attempt([&] { out = read(); });
    return out;
  }
  std::shared_ptr<nlohmann::json> record_;
  std::shared_ptr<Problems> problems_;
  const nlohmann::json* j_;
  std::string path_, label_;
  std::vector<std::string> known_;
};

}  // namespace lt::config
