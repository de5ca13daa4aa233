// Saving: a snapshot of this rank's state at the step boundary (aliasing the live state, or
// a copy for an async save), a free-space check across ranks, each rank's file with its
// digest, and rank 0's manifest once every digest is in. The ranks exchange digests through
// files in the (shared) directory rather than a collective, so an async save runs entirely
// on a background thread.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <thread>
#include <utility>

#include "longtrain/ckpt/catalog.h"
#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/ckpt/safetensors.h"
#include "longtrain/core/check.h"
#include "longtrain/core/strings.h"
#include "longtrain/core/trace.h"

namespace lt::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

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
Snapshot takeSnapshot(TrainState& e, const std::string& root, int64_t keepLast, const std::string& runId,
                      bool copy) {
  auto& world = e.world();
  Snapshot s;
  s.root = root;
  s.rank = world.rank();
  s.world = world.size();
  s.step = e.globalStep();
  s.keepLast = keepLast;
  s.cursor = e.loaderCursor();
  s.timeout = std::chrono::milliseconds(e.config().train.commTimeoutMs());
  s.dir = s.root / checkpointDirName(s.step);
  if (s.rank == 0) {
    if (fs::exists(s.dir)) {  // re-saving a step (after a restart): the old one goes, manifest first
      fs::remove(s.dir / kManifestFile);
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
      auto view = [&](float* p) { return keep(at::from_blob(p, {sh.length}, at::kFloat)); };
      s.tensors.push_back({n, view(sh.master)});
      s.tensors.push_back({n + ".exp_avg", view(sh.expAvg)});
      s.tensors.push_back({n + ".exp_avg_sq", view(sh.expAvgSq)});
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
  AtomicFile f((s.dir / kManifestFile).string());
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

std::string save(TrainState& e, const std::string& root, int64_t keepLast, const StageHook& hook,
                 const std::string& runId) {
  trace::Scope ts("checkpoint", "save (sync) to " + root);
  Snapshot s = takeSnapshot(e, root, keepLast, runId, /*copy=*/false);
  comm::Comm* world = &e.world();
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

std::string AsyncSaver::save(TrainState& e, const std::string& root, int64_t keepLast, const StageHook& hook,
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

}  // namespace lt::ckpt
