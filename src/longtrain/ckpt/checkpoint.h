// Sharded checkpoints (DeepSpeed's ZeRO checkpoints, loadable at another layout like its
// universal checkpointing). A checkpoint is a directory <root>/step-NNNNNNNN/ holding
//   rank-RRRRR-of-WWWWW.safetensors  one per world rank: its piece of every parameter's fp32
//                                    value (the master weights), Adam m and v, as flat
//                                    [length] tensors "<name>", "<name>.exp_avg",
//                                    "<name>.exp_avg_sq", plus "rng.cpu" (generator state);
//   manifest.json                    written last: the checkpoint is complete iff it exists.
// Layout "partitioned" (ZeRO-3): rank r holds elements [r*c, min(numel, (r+1)*c)) of a
// parameter, c = ceil(numel / W). Layout "replicated" (no ZeRO): rank 0 holds everything
// (DP ranks are identical), the other ranks only their generator state.
// The manifest records the step, the data position, the config and its hash, the world/SP/
// ZeRO layout, the parameter names and shapes, the Adam step count, and each file's size and
// CRC-32C. Every file is written to a temporary name, fsynced and renamed; the manifest is
// renamed last, and pruning (keep_last) deletes a checkpoint's manifest before its files,
// so a crash at any moment leaves every complete checkpoint loadable.
// Loading verifies the size and CRC-32C of every file before reading a byte of state, and
// reads any layout: a parameter range is assembled from whichever rank files hold it.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "longtrain/ckpt/manifest.h"
#include "longtrain/ckpt/train_state.h"

namespace lt::ckpt {

class SafetensorsFile;

// Test and fault-injection hook: called on the saving rank at each stage of a save, by name:
// "rank_file_fsynced" (temporary rank file written and fsynced, not renamed yet),
// "rank_file_renamed", "manifest_fsynced" (rank 0, not renamed yet), "committed" (rank 0,
// manifest in place, before pruning), "pruning" (rank 0, an old checkpoint's manifest
// deleted, its files not yet). Throwing from it abandons the save as a crash would.
using StageHook = std::function<void(const std::string& stage)>;

// Saves the training state after its last step into <root>/step-N/ (collective over the
// world; the ranks exchange their files' digests through `rank-R.done` files in the
// directory, so it must be shared, as for loading). keepLast > 0 then deletes all but the newest keepLast complete checkpoints, and
// any incomplete one older than this. Returns the checkpoint directory.
std::string save(TrainState& state, const std::string& root, int64_t keepLast, const StageHook& hook = {},
                 const std::string& runId = "");

// save() with the writing taken off the training thread: the state is copied at the step
// boundary (host memory: one more copy of this rank's state while it is written), then a
// background thread writes the files and (rank 0) the manifest while training goes on. One
// save is in flight at a time: the next save() waits for the previous one, and wait() (call
// it before exiting) waits and rethrows its error. A checkpoint is complete, as always, once
// its manifest exists.
class AsyncSaver {
 public:
  AsyncSaver() = default;
  // Joins; a save still waiting for other ranks' digests is abandoned (incomplete, like a
  // crash), so a run failing on an error does not wait out the timeout twice.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;
  std::string save(TrainState& state, const std::string& root, int64_t keepLast, const StageHook& hook = {},
                   const std::string& runId = "");
  void wait();

 private:
  std::thread thread_;
  std::exception_ptr error_;
  std::atomic<bool> cancel_{false};
};

// Creates `root` if missing and checks this process can write there; an lt::Error naming the
// directory and the reason otherwise (start-up, so a read-only mount is found before step 1).
// `what` names it as the user gave it ("train.checkpoint.dir", "export --out").
void checkWritable(const std::string& root, const std::string& what);

// The newest complete checkpoint under `root` ("" if none); with runId, the newest one that
// launch wrote (a restart must not pick up another run's checkpoints).
std::string findLatest(const std::string& root, const std::string& runId = "");
// `path` itself if it holds a manifest, else the newest complete checkpoint under it; an
// error naming `path` as `what` (the user's flag: "--resume", "export CKPT") if there is none.
std::string resolve(const std::string& path, const std::string& what);

// An opened checkpoint: manifest parsed, every file's size and CRC-32C verified.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  ~Checkpoint();
  const Manifest& manifest() const { return m_; }
  const std::string& dir() const { return dir_; }
  // kind: "" (the parameter), "exp_avg" or "exp_avg_sq". Copies elements [offset, offset +
  // dst.numel()) of parameter p's flattened state into dst (fp32), from the files that hold them.
  void read(int param, const std::string& kind, int64_t offset, at::Tensor dst) const;
  at::Tensor full(int param, const std::string& kind = "") const;  // shaped
  at::Tensor rngState(int rank) const;  // empty if that file has none

 private:
  std::string dir_;
  Manifest m_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

// Loads a checkpoint into a freshly constructed training state (collective under SP). The model's
// parameter names and shapes, and train_batch_size, must match; world size, SP degree and
// ZeRO stage may differ (resharding).
void load(TrainState& state, const Checkpoint& c);

// The consolidated model, Hugging Face Llama names, fp32, as one safetensors file.
void exportModel(const Checkpoint& c, const std::string& outPath);

}  // namespace lt::ckpt
