#include "longtrain/ckpt/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "longtrain/ckpt/safetensors.h"
#include "longtrain/core/check.h"
#include "longtrain/core/partition.h"
#include "longtrain/core/trace.h"
#include "longtrain/core/crc32c.h"
#include "longtrain/core/strings.h"
#include "longtrain/train/engine.h"

namespace lt::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "longtrain-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kManifest = "manifest.json";

// ------------------------------------------------------------------------------ manifest fields
class Fields {
 public:
  Fields(const json& j, std::string what, std::string path) : j_(j), what_(std::move(what)), path_(std::move(path)) {
    LT_CHECK(j_.is_object(), what_, ": '", path_.empty() ? "(top level)" : path_, "' must be an object");
  }
  const json& at(const std::string& k) const {
    auto it = j_.find(k);
    LT_CHECK(it != j_.end(), what_, ": field '", key(k), "' is missing");
    return *it;
  }
  // Bounded well inside int64, so sums and products of fields cannot overflow.
  int64_t i64(const std::string& k, int64_t lo = 0, int64_t hi = int64_t{1} << 40) const {
    const json& v = at(k);
    LT_CHECK(v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) &&
                 v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
             what_, ": field '", key(k), "' must be an integer in [", lo, ", ", hi, "], got ", v.dump().substr(0, 80));
    return v.get<int64_t>();
  }
  std::string str(const std::string& k) const {
    const json& v = at(k);
    LT_CHECK(v.is_string(), what_, ": field '", key(k), "' must be a string, got ", v.dump().substr(0, 80));
    return v.get<std::string>();
  }
  bool boolean(const std::string& k) const {
    const json& v = at(k);
    LT_CHECK(v.is_boolean(), what_, ": field '", key(k), "' must be true or false");
    return v.get<bool>();
  }
  const json& array(const std::string& k) const {
    const json& v = at(k);
    LT_CHECK(v.is_array(), what_, ": field '", key(k), "' must be an array");
    return v;
  }
  std::string key(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }

 private:
  const json& j_;
  std::string what_, path_;
};

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

// Checkpoint directories under root: (step, path, complete), by step.
struct Entry {
  int64_t step;
  fs::path path;
  bool complete;
};
std::vector<Entry> listCheckpoints(const fs::path& root) {
  std::vector<Entry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& d : fs::directory_iterator(root, ec)) {
    const std::string n = d.path().filename().string();
    if (!d.is_directory() || n.size() != 13 || n.rfind("step-", 0) != 0) continue;
    if (!std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    out.push_back({std::stoll(n.substr(5)), d.path(), fs::exists(d.path() / kManifest)});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.step < b.step; });
  return out;
}

// Deletes a checkpoint: its manifest first (so it is incomplete from then on), then the rest.
void removeCheckpoint(const Entry& e, const StageHook& hook) {
  if (e.complete) {
    fs::remove(e.path / kManifest);
    fsyncDirectory(e.path.string());
    if (hook) hook("pruning");
  }
  fs::remove_all(e.path);
}

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

}  // namespace

int64_t ParamRecord::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::string configHash(const std::string& canonical) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : canonical) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

std::string checkpointDirName(int64_t step) { return fmt::format("step-{:08d}", step); }
std::string rankFileName(int rank, int world) { return fmt::format("rank-{:05d}-of-{:05d}.safetensors", rank, world); }

// ------------------------------------------------------------------------------ manifest
std::string manifestJson(const Manifest& m) {
  json params = json::array(), files = json::array();
  for (const auto& p : m.params) params.push_back({{"name", p.name}, {"shape", p.shape}});
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", hex32(f.crc32c)}});
  json j = {{"format", kFormat},
            {"version", kVersion},
            {"step", m.step},
            {"adam_step", m.adamStep},
            {"skipped_steps", m.skippedSteps},
            {"data", {{"samples_consumed", m.samplesConsumed},
                      {"train_batch_size", m.trainBatchSize},
                      {"loader_cursors", m.loaderCursors}}},
            {"layout", {{"world_size", m.worldSize},
                        {"sequence_parallel_size", m.spSize},
                        {"zero_stage", m.zeroStage},
                        {"partitioned", m.partitioned}}},
            {"config_hash", m.configHash},
            {"run_id", m.runId},
            {"config", m.config},
            {"params", params},
            {"files", files}};
  return j.dump(1) + "\n";
}

Manifest parseManifest(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  LT_CHECK(!j.is_discarded(), what, ": not valid JSON (a truncated or corrupt manifest)");
  Fields top(j, what, "");
  LT_CHECK(top.str("format") == kFormat, what, ": field 'format' is '", top.str("format"), "', expected '", kFormat,
           "'");
  LT_CHECK(top.i64("version") == kVersion, what, ": version ", top.i64("version"), " is not supported (this build reads ",
           kVersion, ")");
  Manifest m;
  m.step = top.i64("step");
  m.adamStep = top.i64("adam_step");
  m.skippedSteps = top.i64("skipped_steps");
  LT_CHECK(m.adamStep + m.skippedSteps == m.step, what, ": adam_step ", m.adamStep, " + skipped_steps ",
           m.skippedSteps, " != step ", m.step);
  Fields data(top.at("data"), what, "data");
  m.samplesConsumed = data.i64("samples_consumed", 0, int64_t{1} << 60);
  m.trainBatchSize = data.i64("train_batch_size", 1, int64_t{1} << 20);
  LT_CHECK(m.samplesConsumed == m.step * m.trainBatchSize, what, ": data.samples_consumed ", m.samplesConsumed,
           " != step ", m.step, " x train_batch_size ", m.trainBatchSize);
  for (const auto& c : data.array("loader_cursors")) {
    LT_CHECK(c.is_number_integer() && c.get<int64_t>() >= 0 && c.get<int64_t>() <= (int64_t{1} << 50), what,
             ": data.loader_cursors has a bad entry");
    m.loaderCursors.push_back(c.get<int64_t>());
  }
  Fields lay(top.at("layout"), what, "layout");
  m.worldSize = static_cast<int>(lay.i64("world_size", 1, 1 << 20));
  m.spSize = static_cast<int>(lay.i64("sequence_parallel_size", 1, 1 << 20));
  m.zeroStage = static_cast<int>(lay.i64("zero_stage", 0, 3));
  m.partitioned = lay.boolean("partitioned");
  LT_CHECK(m.worldSize % m.spSize == 0, what, ": world_size ", m.worldSize, " is not a multiple of sequence_parallel_size ",
           m.spSize);
  LT_CHECK(static_cast<int>(m.loaderCursors.size()) == m.worldSize, what, ": data.loader_cursors has ",
           m.loaderCursors.size(), " entries for world_size ", m.worldSize);
  m.configHash = top.str("config_hash");
  m.runId = top.str("run_id");
  m.config = top.at("config");
  LT_CHECK(m.config.is_object(), what, ": field 'config' must be an object");
  for (const auto& p : top.array("params")) {
    Fields f(p, what, "params[]");
    ParamRecord r;
    r.name = f.str("name");
    int64_t numel = 1;
    for (const auto& s : f.array("shape")) {
      LT_CHECK(s.is_number_integer() && s.get<int64_t>() >= 0 && s.get<int64_t>() <= (int64_t{1} << 40), what,
               ": params '", r.name, "': bad shape entry ", s.dump().substr(0, 40));
      r.shape.push_back(s.get<int64_t>());
      LT_CHECK(numel <= (int64_t{1} << 40) / std::max<int64_t>(1, s.get<int64_t>()), what, ": params '", r.name,
               "': shape too large");
      numel *= s.get<int64_t>();
    }
    m.params.push_back(std::move(r));
  }
  for (const auto& fj : top.array("files")) {
    Fields f(fj, what, "files[]");
    FileRecord r;
    r.name = f.str("name");
    LT_CHECK(!r.name.empty() && r.name.find('/') == std::string::npos && r.name != "." && r.name != "..", what,
             ": file name '", r.name, "' must be a plain name inside the checkpoint directory");
    r.bytes = f.i64("bytes", 0, int64_t{1} << 50);
    std::string c = f.str("crc32c");
    LT_CHECK(c.size() == 8 && c.find_first_not_of("0123456789abcdef") == std::string::npos, what, ": file '", r.name,
             "': crc32c '", c, "' is not 8 hex digits");
    r.crc32c = static_cast<uint32_t>(std::stoul(c, nullptr, 16));
    m.files.push_back(std::move(r));
  }
  LT_CHECK(static_cast<int>(m.files.size()) == m.worldSize, what, ": ", m.files.size(), " files for world_size ",
           m.worldSize);
  return m;
}

// ------------------------------------------------------------------------------ save
namespace {

// What one rank writes for one checkpoint, taken on the training thread at a step boundary.
struct Snapshot {
  fs::path root, dir;
  int rank = 0, world = 1;
  int64_t step = 0, keepLast = 0, cursor = 0;
  std::chrono::milliseconds timeout{60000};
  std::vector<NamedTensor> tensors;
  Manifest manifest;  // rank 0: all but the files and the loader cursors
};

std::string doneName(int rank) { return fmt::format("rank-{:05d}.done", rank); }

std::string mibText(double b) { return fmt::format("{:.1f} MiB", b / 1048576.0); }

// Collective: before anything is written, every rank checks that its filesystem has room for
// the files of all ranks writing to it (ranks on the same host and device), so a save that
// cannot fit is refused at once, on every rank, with the bytes needed and free.
void checkFreeSpace(const Snapshot& s, comm::Comm& world) {
  int64_t mine = 1 << 16;  // header and digest files
  for (const auto& t : s.tensors) mine += static_cast<int64_t>(t.tensor.nbytes());
  struct stat st {};
  ::stat(s.dir.c_str(), &st);
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const int64_t device = static_cast<int64_t>(std::hash<std::string>{}(host) ^ st.st_dev) & ((1LL << 62) - 1);
  auto local = at::tensor({mine, device}, at::kLong), all = at::empty({2 * world.size()}, at::kLong);
  world.allGather(all, local).wait();
  int64_t need = 0;
  for (int r = 0; r < world.size(); ++r)
    if (all[2 * r + 1].item<int64_t>() == device) need += all[2 * r].item<int64_t>();
  std::error_code ec;
  const auto space = fs::space(s.dir, ec);
  const int64_t avail = ec ? need : static_cast<int64_t>(space.available);
  auto ok = at::tensor({static_cast<int64_t>(need <= avail)}, at::kLong);
  world.allReduce(ok, comm::ReduceOp::Min).wait();
  if (ok.item<int64_t>() == 1) return;
  if (s.rank == 0) {
    fs::remove_all(s.dir, ec);
  }
  LT_CHECK(false, "checkpoint ", s.dir.string(), " not written: ",
           need > avail ? "it needs " + mibText(need) + " on this rank's disk, which has " + mibText(avail) + " free"
                        : std::string("another rank's disk is too full for its files"),
           " (is the disk full? free space, lower train.checkpoint.keep_last, or choose another train.checkpoint.dir)");
}

// Collective (one barrier): rank 0 prepares the directory. With `copy`, the state is copied
// (the engine may train on while it is written); else the tensors alias the live state.
Snapshot takeSnapshot(train::Engine& e, const std::string& root, int64_t keepLast, const std::string& runId,
                      bool copy) {
  auto& world = *e.groups().world;
  Snapshot s;
  s.root = root;
  s.rank = world.rank();
  s.world = world.size();
  s.step = e.globalStep();
  s.keepLast = keepLast;
  s.cursor = e.loaderCursor();
  s.timeout = std::chrono::milliseconds(static_cast<int64_t>(e.config().train.commTimeoutS * 1000));
  s.dir = s.root / checkpointDirName(s.step);
  if (s.rank == 0) {
    if (fs::exists(s.dir)) {  // re-saving a step (after a restart): the old one goes, manifest first
      fs::remove(s.dir / kManifest);
      fsyncDirectory(s.dir.string());
      fs::remove_all(s.dir);
    }
    fs::create_directories(s.dir);
    fsyncDirectory(root);
  }
  world.barrier();

  const auto meta = e.parameterMeta();
  auto keep = [&](const at::Tensor& t) { return copy ? t.clone() : t; };
  if (e.statePartitioned() || s.rank == 0)
    for (const auto& sh : e.stateShards()) {
      const std::string& n = meta[sh.param].name;
      s.tensors.push_back({n, keep(sh.master)});
      s.tensors.push_back({n + ".exp_avg", keep(sh.expAvg)});
      s.tensors.push_back({n + ".exp_avg_sq", keep(sh.expAvgSq)});
    }
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.tensors.push_back({"rng.cpu", gen.get_state()});
  }
  if (s.rank == 0) {
    const auto& cfg = e.config();
    Manifest& m = s.manifest;
    m.step = s.step;
    m.adamStep = e.adamStepCount();
    m.skippedSteps = e.skippedSteps();
    m.trainBatchSize = cfg.trainBatchSize;
    m.samplesConsumed = s.step * cfg.trainBatchSize;
    m.worldSize = s.world;
    m.spSize = cfg.sequenceParallelSize;
    m.zeroStage = cfg.zero.stage;
    m.partitioned = e.statePartitioned();
    m.configHash = configHash(cfg.source);
    m.runId = runId;
    m.config = json::parse(cfg.source);
    for (const auto& p : meta) m.params.push_back({p.name, p.shape});
  }
  checkFreeSpace(s, world);
  return s;
}

std::string failedName(int rank) { return fmt::format("rank-{:05d}.failed", rank); }

// Writes this rank's file and its digest (`rank-R.done`: bytes, CRC, loader cursor). A rank
// that cannot leaves `rank-R.failed` with the reason instead, so rank 0 learns it at once.
void writeRankFiles(const Snapshot& s, const StageHook& hook) {
  try {
    FileDigest d = writeSafetensors((s.dir / rankFileName(s.rank, s.world)).string(), s.tensors,
                                    {{"longtrain.rank", std::to_string(s.rank)}, {"longtrain.step", std::to_string(s.step)}},
                                    [&] { if (hook) hook("rank_file_fsynced"); });
    if (hook) hook("rank_file_renamed");
    const std::string t = fmt::format("{} {} {}\n", d.bytes, d.crc32c, s.cursor);
    AtomicFile f((s.dir / doneName(s.rank)).string());
    f.write(t.data(), t.size());
    f.commit();
  } catch (const lt::Error& e) {
    std::ofstream((s.dir / failedName(s.rank)).string()) << e.what() << "\n";
    throw;
  }
}

// Rank 0: waits for every rank's digest, writes the manifest and prunes. No collectives, so
// it can run on a background thread while training goes on; the ranks share the directory.
// `diagnose` (synchronous saves: the training thread may use the heartbeat) explains a
// timeout, e.g. "lost rank(s): 1".
void commitManifest(const Snapshot& s, const StageHook& hook, const std::atomic<bool>* cancel,
                    const std::function<std::string()>& diagnose) {
  Manifest m = s.manifest;
  const auto deadline = std::chrono::steady_clock::now() + s.timeout;
  for (int q = 0; q < s.world; ++q) {
    const fs::path done = s.dir / doneName(q);
    while (!fs::exists(done)) {
      LT_CHECK(!cancel || !*cancel, "checkpoint ", s.dir.string(), ": abandoned (the run is ending on an error)");
      if (fs::exists(s.dir / failedName(q))) {
        std::ifstream in(s.dir / failedName(q));
        std::string why;
        std::getline(in, why);
        LT_CHECK(false, "checkpoint ", s.dir.string(), ": rank ", q, " could not write its file: ", why);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        std::string missing;
        for (int k = q; k < s.world; ++k)
          if (!fs::exists(s.dir / doneName(k))) missing += fmt::format(" {}", k);
        LT_CHECK(false, "checkpoint ", s.dir.string(), ": rank(s)", missing, " did not finish writing within ",
                 s.timeout.count() / 1000.0, " s (train.comm_timeout_s); the checkpoint stays incomplete",
                 diagnose ? "; " + diagnose() : std::string());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream in(done);
    int64_t bytes = -1, cursor = -1;
    uint64_t crc = 0;
    in >> bytes >> crc >> cursor;
    LT_CHECK(in && bytes >= 0 && cursor >= 0, "checkpoint ", s.dir.string(), ": unreadable ", done.string());
    m.files.push_back({rankFileName(q, s.world), bytes, static_cast<uint32_t>(crc)});
    m.loaderCursors.push_back(cursor);
  }
  const std::string text = manifestJson(m);
  AtomicFile f((s.dir / kManifest).string());
  f.write(text.data(), text.size());
  f.commit([&] { if (hook) hook("manifest_fsynced"); });
  if (hook) hook("committed");
  for (int q = 0; q < s.world; ++q) fs::remove(s.dir / doneName(q));
  prune(s.root, s.keepLast, s.step, hook);
}

void writeSnapshot(const Snapshot& s, const StageHook& hook, const std::atomic<bool>* cancel) {
  writeRankFiles(s, hook);
  if (s.rank == 0) commitManifest(s, hook, cancel, {});
}

// Collective: every rank learns whether every rank wrote its file; if not, each throws (its
// own reason, or which ranks failed) and rank 0 removes the partial directory, so no rank
// waits out a timeout for a file that will never come.
void agreeWritten(const Snapshot& s, comm::Comm& world, const std::string& myError) {
  auto mine = at::tensor({static_cast<int64_t>(!myError.empty())}, at::kLong), all = at::empty({world.size()}, at::kLong);
  world.allGather(all, mine).wait();
  std::string failed;
  for (int r = 0; r < world.size(); ++r)
    if (all[r].item<int64_t>()) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (failed.empty()) return;
  std::error_code ec;
  if (s.rank == 0) fs::remove_all(s.dir, ec);  // incomplete either way; its space goes back
  LT_CHECK(false, "checkpoint ", s.dir.string(), " failed on rank(s) ", failed, " and was removed",
           myError.empty() ? std::string(" (their own messages say why)") : ": " + firstLine(myError));
}

}  // namespace

std::string save(train::Engine& e, const std::string& root, int64_t keepLast, const StageHook& hook,
                 const std::string& runId) {
  trace::Scope ts("checkpoint", "save (sync) to " + root);
  Snapshot s = takeSnapshot(e, root, keepLast, runId, /*copy=*/false);
  auto world = e.groups().world;
  std::string error;
  try {
    writeRankFiles(s, hook);
  } catch (const lt::Error& ex) {
    error = ex.what();
  }
  agreeWritten(s, *world, error);
  if (s.rank == 0) commitManifest(s, hook, nullptr, [&] { return world->diagnoseFailure(); });
  world->barrier();  // on return, the checkpoint is complete on every rank
  return s.dir.string();
}

AsyncSaver::~AsyncSaver() {
  cancel_ = true;  // a save still waiting for other ranks' files gives up (they may be dead)
  if (thread_.joinable()) thread_.join();
}

std::string AsyncSaver::save(train::Engine& e, const std::string& root, int64_t keepLast, const StageHook& hook,
                             const std::string& runId) {
  wait();
  std::shared_ptr<Snapshot> s;
  {
    trace::Scope ts("checkpoint", "snapshot copy (async save)");
    s = std::make_shared<Snapshot>(takeSnapshot(e, root, keepLast, runId, /*copy=*/true));
  }
  thread_ = std::thread([this, s, hook] {
    trace::nameThread("checkpoint writer");
    trace::Scope ts("checkpoint", "write (async) " + s->dir.string());
    // Below the trainer's threads: on a machine without a spare core the write should
    // take the idle time, not steal compute (Linux: nice is per thread).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
    try {
      writeSnapshot(*s, hook, &cancel_);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
  return s->dir.string();
}

void AsyncSaver::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void checkWritable(const std::string& root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  LT_CHECK(!ec, "train.checkpoint.dir='", root, "' cannot be created: ", ec.message(),
           "; choose a directory this user can write");
  const fs::path probe = fs::path(root) / fmt::format(".longtrain-write-test-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = errno;
  if (fd >= 0) ::close(fd), ::unlink(probe.c_str());
  LT_CHECK(fd >= 0, "train.checkpoint.dir='", root, "' is not writable: ", std::strerror(err),
           "; fix its permissions or mount, or choose another directory (found at start-up, before any step)");
}

std::string findLatest(const std::string& root, const std::string& runId) {
  auto all = listCheckpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete) continue;
    if (runId.empty()) return it->path.string();
    std::ifstream in(it->path / kManifest);
    std::stringstream ss;
    ss << in.rdbuf();
    json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("run_id", std::string()) == runId) return it->path.string();
  }
  return "";
}

std::string resolve(const std::string& path) {
  if (fs::exists(fs::path(path) / kManifest)) return path;
  std::string latest = findLatest(path);
  LT_CHECK(!latest.empty(), "--resume: '", path, "' holds no complete checkpoint (a directory with ", kManifest,
           ", or step-NNNNNNNN/ directories holding one)");
  return latest;
}

// ------------------------------------------------------------------------------ load
Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const fs::path mp = fs::path(dir) / kManifest;
  std::ifstream in(mp, std::ios::binary);
  LT_CHECK(in.good(), "'", dir, "' is not a complete checkpoint: it has no ", kManifest);
  std::stringstream ss;
  ss << in.rdbuf();
  m_ = parseManifest(ss.str(), fmt::format("'{}'", mp.string()));
  for (const auto& f : m_.files) {
    const std::string p = (fs::path(dir) / f.name).string();
    struct stat st{};
    LT_CHECK(::stat(p.c_str(), &st) == 0, "checkpoint file '", p, "' is missing (the manifest lists it)");
    LT_CHECK(st.st_size == f.bytes, "checkpoint file '", p, "' has ", st.st_size, " bytes, the manifest says ", f.bytes,
             ": it is truncated or was replaced; refusing to load it");
    files_.push_back(std::make_unique<SafetensorsFile>(p, [&](const uint8_t* data, size_t size) {
      uint32_t crc = crc32c(data, size);
      LT_CHECK(crc == f.crc32c, "checkpoint file '", p, "' is corrupt: its CRC-32C is ", hex32(crc),
               ", the manifest says ", hex32(f.crc32c), "; refusing to load it (resume from an older checkpoint)");
    }));
  }
}

Checkpoint::~Checkpoint() = default;

void Checkpoint::read(int param, const std::string& kind, int64_t offset, at::Tensor dst) const {
  LT_ASSERT(param >= 0 && param < static_cast<int>(m_.params.size()));
  const auto& p = m_.params[param];
  const int64_t numel = p.numel(), n = dst.numel();
  LT_ASSERT(offset >= 0 && offset + n <= numel, "range outside parameter ", p.name);
  const std::string name = kind.empty() ? p.name : p.name + "." + kind;
  auto piece = [&](int rank, int64_t lo, int64_t hi) {  // file `rank` holds [lo, hi)
    const auto& f = *files_[rank];
    const TensorEntry* e = f.find(name);
    LT_CHECK(e, "checkpoint file '", f.path(), "' has no tensor '", name, "' (the manifest's layout says it should)");
    at::Tensor v = f.view(name);
    LT_CHECK(v.scalar_type() == at::kFloat && v.dim() == 1 && v.numel() == hi - lo, "checkpoint file '", f.path(),
             "': tensor '", name, "' is ", e->dtype, " of ", v.numel(), " elements, expected F32 of ", hi - lo);
    const int64_t a = std::max(lo, offset), b = std::min(hi, offset + n);
    if (b > a) dst.narrow(0, a - offset, b - a).copy_(v.narrow(0, a - lo, b - a));
  };
  if (!m_.partitioned) return piece(0, 0, numel);
  const int64_t W = m_.worldSize, c = partitionChunk(numel, W);
  if (n == 0 || c == 0) return;
  for (int64_t r = offset / c; r <= (offset + n - 1) / c && r < W; ++r)
    piece(static_cast<int>(r), r * c, std::min(numel, (r + 1) * c));
}

at::Tensor Checkpoint::full(int param, const std::string& kind) const {
  const auto& p = m_.params.at(param);
  auto t = at::empty({p.numel()}, at::kFloat);
  read(param, kind, 0, t);
  return t.view(p.shape);
}

at::Tensor Checkpoint::rngState(int rank) const {
  const auto& f = *files_.at(rank);
  return f.find("rng.cpu") ? f.view("rng.cpu").clone() : at::Tensor();
}

void load(train::Engine& e, const Checkpoint& c) {
  const Manifest& m = c.manifest();
  const auto& cfg = e.config();
  const std::string what = "checkpoint '" + c.dir() + "'";
  // The model must be the same one: name the keys that differ.
  json now = json::parse(cfg.source);
  json then = m.config.contains("model") ? m.config["model"] : json::object();
  json nowModel = now.contains("model") ? now["model"] : json::object();
  if (then != nowModel) {
    std::string diffs;
    for (const auto& op : json::diff(then, nowModel)) diffs += " model" + op["path"].get<std::string>();
    LT_CHECK(false, what, " was saved for a different model; these keys differ:", diffs,
             ". Use the config it was saved with (its manifest.json holds it)");
  }
  const auto meta = e.parameterMeta();
  LT_CHECK(meta.size() == m.params.size(), what, " has ", m.params.size(), " parameters, this model ", meta.size());
  for (size_t i = 0; i < meta.size(); ++i)
    LT_CHECK(meta[i].name == m.params[i].name && meta[i].shape == m.params[i].shape, what, ": parameter ", i, " is '",
             m.params[i].name, "' there and '", meta[i].name, "' here (or their shapes differ)");
  LT_CHECK(m.trainBatchSize == cfg.trainBatchSize, what, " was taken at train_batch_size=", m.trainBatchSize,
           ", this run has ", cfg.trainBatchSize, ": the data position cannot carry over; keep train_batch_size (",
           "change train_micro_batch_size_per_gpu or gradient_accumulation_steps with the world size instead)");

  e.beginRestore(m.step, m.adamStep, m.skippedSteps);
  for (const auto& s : e.stateShards()) {
    c.read(s.param, "", s.offset, s.master);
    c.read(s.param, "exp_avg", s.offset, s.expAvg);
    c.read(s.param, "exp_avg_sq", s.offset, s.expAvgSq);
  }
  const int r = e.groups().world->rank();
  const bool sameLayout = m.worldSize == e.groups().world->size() && m.spSize == cfg.sequenceParallelSize &&
                          m.partitioned == e.statePartitioned();
  if (sameLayout)
    LT_ASSERT(e.loaderCursor() == m.loaderCursors[r], what, ": rank ", r, " data position ", e.loaderCursor(),
              " != the saved ", m.loaderCursors[r]);
  at::Tensor rng = c.rngState(sameLayout ? r : 0);
  if (rng.defined()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
}

void exportModel(const Checkpoint& c, const std::string& outPath) {
  std::vector<NamedTensor> ts;
  for (size_t i = 0; i < c.manifest().params.size(); ++i)
    ts.push_back({c.manifest().params[i].name, c.full(static_cast<int>(i))});
  writeSafetensors(outPath, ts, {{"format", "pt"}});
}

}  // namespace lt::ckpt
