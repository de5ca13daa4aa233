// Listing, pruning and finding checkpoints under a root; the start-up writability probe.
#include "longtrain/ckpt/catalog.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "longtrain/ckpt/safetensors.h"
#include "longtrain/config/json_text.h"
#include "longtrain/core/check.h"
#include "longtrain/core/files.h"
#include "longtrain/core/strings.h"

namespace lt::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<CatalogEntry> listCheckpoints(const fs::path& root) {
  std::vector<CatalogEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& d : fs::directory_iterator(root, ec)) {
    const std::string n = d.path().filename().string();
    if (!d.is_directory() || n.size() != 13 || n.rfind("step-", 0) != 0) continue;
    if (!std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    out.push_back({std::stoll(n.substr(5)), d.path(), fs::exists(d.path() / kManifestFile)});
  }
  std::sort(out.begin(), out.end(), [](const CatalogEntry& a, const CatalogEntry& b) { return a.step < b.step; });
  return out;
}

namespace {

// Deletes a checkpoint: its manifest first (so it is incomplete from then on), then the rest.
void removeCheckpoint(const CatalogEntry& e, const StageHook& hook) {
  if (e.complete) {
    fs::remove(e.path / kManifestFile);
    fsyncDirectory(e.path.string());
    if (hook) hook("pruning");
  }
  fs::remove_all(e.path);
}

}  // namespace

void prune(const fs::path& root, int64_t keepLast, int64_t newest, const StageHook& hook) {
  auto all = listCheckpoints(root);
  int64_t completeSeen = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->complete) {
      ++completeSeen;
      if (keepLast > 0 && completeSeen > keepLast) removeCheckpoint(*it, hook);
    } else if (it->step < newest) {
      removeCheckpoint(*it, hook);  // left by a crash during an earlier save
    }
  }
  fsyncDirectory(root.string());
}


void checkWritable(const std::string& root, const std::string& what) {
  std::error_code ec;
  LT_CHECK(!root.empty(), what, " is empty; give a directory");
  LT_CHECK(!fs::exists(root, ec) || fs::is_directory(root, ec), what, "='", root, "' exists and is not a directory; ",
           "give a directory (new or existing)");
  fs::create_directories(root, ec);
  LT_CHECK(!ec, what, "='", root, "' cannot be created: ", ec.message(), "; choose a directory this user can write");
  const fs::path probe = fs::path(root) / fmt::format(".longtrain-write-test-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = errno;
  if (fd >= 0) ::close(fd), ::unlink(probe.c_str());
  LT_CHECK(fd >= 0, what, "='", root, "' is not writable: ", std::strerror(err),
           "; fix its permissions or mount, or choose another directory (found at start-up, before any step)");
}

std::string findLatest(const std::string& root, const std::string& runId) {
  auto all = listCheckpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete) continue;
    if (runId.empty()) return it->path.string();
    const std::string manifest = (it->path / kManifestFile).string();
    json j;
    try {  // one that cannot be read or parsed is not this run's
      j = config::parseJsonText(readInputFile(manifest, "'" + manifest + "'"), "'" + manifest + "'");
    } catch (const Error&) {
      continue;
    }
    if (j.is_object() && j.value("run_id", std::string()) == runId) return it->path.string();
  }
  return "";
}

std::string resolve(const std::string& path, const std::string& what) {
  std::error_code ec;
  LT_CHECK(!path.empty(), what, " is empty; give a checkpoint directory");
  LT_CHECK(fs::exists(path, ec), what, " '", path, "' does not exist (absolute: '", fs::absolute(path, ec).string(),
           "')");
  LT_CHECK(fs::is_directory(path, ec), what, " '", path, "' is not a directory; give a checkpoint directory (a step ",
           "directory, or the root holding step-NNNNNNNN/ directories)");
  if (fs::exists(fs::path(path) / kManifestFile, ec)) return path;
  std::string latest = findLatest(path);
  LT_CHECK(!latest.empty(), what, " '", path, "' holds no complete checkpoint (a directory with ", kManifestFile,
           ", or step-NNNNNNNN/ directories holding one)");
  return latest;
}

}  // namespace lt::ckpt
