// The checkpoint manifest (manifest.json, written last: a checkpoint is complete iff it
// exists) and the names of a checkpoint's files. It records the step, the data position, the
// config and its hash, the world/SP/ZeRO layout, the parameter names and shapes, the Adam step
// count, and each rank file's size and CRC-32C. Reading is strict (config/json_reader.h):
// every field present with its type and range, cross-checked, so a damaged manifest is refused
// by name rather than half-read.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lt::ckpt {

inline constexpr const char* kManifestFile = "manifest.json";

struct FileRecord {
  std::string name;  // relative to the checkpoint directory
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct ParamRecord {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

struct Manifest {
  int64_t step = 0;              // optimizer steps taken
  int64_t adamStep = 0;          // Adam's bias-correction step count (step minus skipped steps)
  int64_t skippedSteps = 0;
  int64_t samplesConsumed = 0;   // step x train_batch_size: the data position
  int64_t trainBatchSize = 0;
  std::vector<int64_t> loaderCursors;  // per world rank: micro-batches taken from its loader
  int worldSize = 1, spSize = 1, zeroStage = 0;
  bool partitioned = false;
  std::string configHash;        // FNV-1a 64 of the parsed config, hex
  std::string runId;             // the launch that wrote it (LONGTRAIN_RUN_ID; "" outside the launcher)
  nlohmann::json config;         // the parsed config (after --set overrides)
  std::vector<ParamRecord> params;
  std::vector<FileRecord> files; // one per world rank, in rank order
};

// Strict: every field present with its type; an lt::Error names `what` and the field.
Manifest parseManifest(const std::string& text, const std::string& what);
std::string manifestJson(const Manifest& m);

std::string configHash(const std::string& canonicalConfigJson);
std::string checkpointDirName(int64_t step);  // "step-00000042"
std::string rankFileName(int rank, int world);

std::string crcHex(uint32_t crc);  // 8 lowercase hex digits, as the manifest writes it

}  // namespace lt::ckpt
