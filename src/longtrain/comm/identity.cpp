// Job identity exchange over the rendezvous store (see identity.h).
#include "longtrain/comm/identity.h"

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fstream>
#include <iterator>
#include <set>

#include "longtrain/core/check.h"
#include "longtrain/core/crc32c.h"
#include "longtrain/core/strings.h"

namespace lt::comm {

namespace {

std::string rankList(const std::vector<int>& ranks) {  // 0,1,2,5 -> "0-2, 5"
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return s;
}

std::string shortValue(const std::string& v) { return v.size() <= 80 ? v : v.substr(0, 77) + "..."; }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

std::string describeDisagreement(const std::vector<std::map<std::string, std::string>>& ids) {
  std::set<std::string> keys;
  for (const auto& m : ids)
    for (const auto& [k, v] : m) keys.insert(k);
  std::string out;
  int shown = 0, differing = 0;
  for (const auto& k : keys) {
    std::map<std::string, std::vector<int>> byValue;
    for (int r = 0; r < static_cast<int>(ids.size()); ++r) {
      auto it = ids[r].find(k);
      byValue[it == ids[r].end() ? "(absent)" : it->second].push_back(r);
    }
    if (byValue.size() < 2) continue;
    ++differing;
    if (++shown > 12) continue;
    out += "\n  " + k + ":";
    for (const auto& [v, ranks] : byValue)
      out += " rank" + std::string(ranks.size() > 1 ? "s " : " ") + rankList(ranks) + " = " + shortValue(v) + ";";
    out.pop_back();
  }
  if (shown > 12) out += "\n  ... and " + std::to_string(differing - 12) + " more key(s)";
  return out;
}

std::vector<std::string> exchangeIdentity(c10d::Store& store, int rank, int size, const RankIdentity& mine,
                                          std::chrono::milliseconds timeout, const std::string& storeWhere) {
  const auto claims = store.add("lt/id/claim/" + std::to_string(rank), 1);
  LT_CHECK(claims == 1, "rank ", rank, " was already claimed in the rendezvous store ", storeWhere,
           ": another job uses that port (or two ranks were given RANK=", rank, "); choose another MASTER_PORT / ",
           "--master-port, or check RANK");
  nlohmann::json j{{"agreed", mine.agreed}, {"host", mine.host}};
  store.set("lt/id/" + std::to_string(rank), bytes(j.dump()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("lt/id/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    std::string missing;
    for (int r = 0; r < size; ++r)
      if (!store.check({keys[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    LT_CHECK(false, "rank ", rank, ": rank(s) ", missing, " did not join within ", timeout.count() / 1000,
             " s (not started, crashed before rendezvous, or started with another WORLD_SIZE)");
  }
  std::vector<std::map<std::string, std::string>> agreed(size);
  std::vector<std::string> hosts(size);
  for (int r = 0; r < size; ++r) {
    const auto b = store.get(keys[r]);
    const auto other = nlohmann::json::parse(std::string(b.begin(), b.end()));
    agreed[r] = other.at("agreed").get<std::map<std::string, std::string>>();
    hosts[r] = other.at("host").get<std::string>();
  }
  const std::string diff = describeDisagreement(agreed);
  LT_CHECK(diff.empty(), "the ranks of this job disagree, so none starts (rank ", rank, " of ", size,
           "); every rank needs the same config, --set flags, world layout and build:", diff);
  return hosts;
}

std::string binaryDigest() {
  std::ifstream f("/proc/self/exe", std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32c(data.data(), data.size()));
  return std::string(hex) + "/" + std::to_string(data.size());
}

}  // namespace lt::comm
