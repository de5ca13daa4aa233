// JsonReader. Range checks happen before any cast (a cast of an out-of-range double to
// int64 is undefined behaviour).
#include "longtrain/config/json_reader.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "longtrain/core/check.h"
#include "longtrain/core/strings.h"

namespace lt::config {

using json = nlohmann::json;

JsonReader::JsonReader(const json* j, std::string path, std::string label)
    : j_(j), path_(std::move(path)), label_(std::move(label)) {
  LT_CHECK(!j_ || j_->is_object(), name(""), " must be an object, got ", j_->type_name(), " ",
           j_->dump().substr(0, 80));
}

std::string JsonReader::keyPath(const std::string& key) const {
  if (key.empty()) return path_.empty() ? "(top level)" : path_;
  return path_.empty() ? key : path_ + "." + key;
}

std::string JsonReader::name(const std::string& key) const { return label_ + " '" + keyPath(key) + "'"; }

const json* JsonReader::find(const std::string& key) {
  known_.push_back(key);
  const json* v = nullptr;
  if (j_)
    if (auto it = j_->find(key); it != j_->end() && !it->is_null()) v = &*it;
  // Keys read through find() alone (objects and lists a parser walks itself) are recorded as given.
  if (record_ && !record_->contains(json::json_pointer("/" + pointerPath(key))))
    (*record_)[json::json_pointer("/" + pointerPath(key))] = v ? *v : json();
  return v;
}

bool JsonReader::has(const std::string& key) const { return j_ && j_->contains(key) && !(*j_)[key].is_null(); }

int64_t JsonReader::toInt(const json& v, const std::string& key, int64_t lo, int64_t hi) const {
  auto whole = [](double d) { return std::abs(d) < 9.0e18 && d == std::trunc(d); };
  const bool integral = v.is_number_integer() || (v.is_number_float() && whole(v.get<double>()));
  LT_CHECK(integral, name(key), " must be an integer, got ", v.type_name(), " ", v.dump().substr(0, 80));
  LT_CHECK(!(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX), name(key), " = ", v.dump(),
           " is out of range; expected ", lo, " <= value <= ", hi);
  const int64_t x = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
  LT_CHECK(x >= lo && x <= hi, name(key), " = ", x, " is out of range; expected ", lo, " <= value <= ", hi);
  return x;
}

std::string JsonReader::pointerPath(const std::string& key) const {
  std::string p;
  for (char c : keyPath(key)) p += c == '.' ? std::string("/") : c == '~' ? std::string("~0") : std::string(1, c);
  return p;
}

int64_t JsonReader::getInt(const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  return guarded(def, [&] {
    const json* v = find(key);
    return recorded(key, v ? toInt(*v, key, lo, hi) : def);
  });
}

double JsonReader::getNum(const std::string& key, double def, double lo, double hi) {
  return guarded(def, [&] { return readNum(key, def, lo, hi); });
}

double JsonReader::readNum(const std::string& key, double def, double lo, double hi) {
  const json* v = find(key);
  if (!v) return recorded(key, def);
  LT_CHECK(v->is_number(), name(key), " must be a number, got ", v->type_name(), " ", v->dump().substr(0, 80));
  const double x = v->get<double>();
  LT_CHECK(x >= lo && x <= hi, name(key), " = ", x, " is out of range; expected ", lo, " <= value <= ", hi);
  return recorded(key, x);
}

bool JsonReader::getBool(const std::string& key, bool def) {
  return guarded(def, [&] {
    const json* v = find(key);
    if (!v) return recorded(key, def);
    LT_CHECK(v->is_boolean(), name(key), " must be true or false, got ", v->type_name(), " ", v->dump().substr(0, 80));
    return recorded(key, v->get<bool>());
  });
}

std::string JsonReader::getString(const std::string& key, const std::string& def) {
  return guarded(def, [&] {
    const json* v = find(key);
    if (!v) return recorded(key, def);
    LT_CHECK(v->is_string(), name(key), " must be a string, got ", v->type_name(), " ", v->dump().substr(0, 80));
    return recorded(key, v->get<std::string>());
  });
}

std::string JsonReader::getEnum(const std::string& key, const std::string& def,
                                const std::vector<const char*>& choices) {
  return guarded(def, [&] { return readEnum(key, def, choices); });
}

std::string JsonReader::readEnum(const std::string& key, const std::string& def, const std::vector<const char*>& choices) {
  const std::string s = getString(key, def);
  std::string list;
  for (const char* c : choices) {
    if (s == c) return s;
    list += std::string(list.empty() ? "" : ", ") + "\"" + c + "\"";
  }
  LT_CHECK(false, name(key), " = \"", s, "\" is not one of ", list);
  return s;
}

int64_t JsonReader::getBytes(const std::string& key, int64_t def) {
  return guarded(def, [&] {
    const json* v = find(key);
    if (!v) return recorded(key, def);
    if (v->is_string()) return recorded(key, parseByteSize(v->get<std::string>(), name(key)));
    return recorded(key, toInt(*v, key, 0, int64_t{1} << 60));
  });
}

JsonReader JsonReader::sub(const std::string& key) {
  const json* v = find(key);
  if (v && !v->is_object() && problems_) {  // reported; its keys read as absent, and recorded under it
    problems_->add(name(key) + " must be an object, got " + v->type_name() + " " + v->dump().substr(0, 80));
    v = nullptr;
    if (record_) (*record_)[json::json_pointer("/" + pointerPath(key))] = json::object();
  }
  JsonReader r(v, keyPath(key), label_);
  r.record_ = record_;
  r.problems_ = problems_;
  return r;
}

const json& JsonReader::require(const std::string& key) {
  const json* v = find(key);
  LT_CHECK(v, name(key), " is missing");
  return *v;
}

int64_t JsonReader::requireInt(const std::string& key, int64_t lo, int64_t hi) { return toInt(require(key), key, lo, hi); }

std::string JsonReader::requireString(const std::string& key) {
  const json& v = require(key);
  LT_CHECK(v.is_string(), name(key), " must be a string, got ", v.dump().substr(0, 80));
  return v.get<std::string>();
}

bool JsonReader::requireBool(const std::string& key) {
  const json& v = require(key);
  LT_CHECK(v.is_boolean(), name(key), " must be true or false, got ", v.dump().substr(0, 80));
  return v.get<bool>();
}

const json& JsonReader::requireArray(const std::string& key) {
  const json& v = require(key);
  LT_CHECK(v.is_array(), name(key), " must be an array, got ", v.type_name());
  return v;
}

JsonReader JsonReader::requireObject(const std::string& key) {
  JsonReader r(&require(key), keyPath(key), label_);
  r.record_ = record_;
  return r;
}

void JsonReader::finish() const {
  if (!j_) return;
  for (auto it = j_->begin(); it != j_->end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
    const std::string best = closestName(it.key(), known_);
    const std::string message = "unknown " + name(it.key()) +
                                (best.empty() ? std::string() : "; did you mean '" + keyPath(best) + "'?") +
                                " (see the configuration reference)";
    if (!problems_) throw Error(message);
    problems_->add(message);
  }
}

}  // namespace lt::config
