// The checkpoints under a root directory (ckpt/ internal): step-NNNNNNNN/ directories,
// complete iff they hold a manifest. Pruning deletes a checkpoint's manifest before its files,
// so a crash at any moment leaves every complete checkpoint loadable.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "longtrain/ckpt/checkpoint.h"

namespace lt::ckpt {

struct CatalogEntry {
  int64_t step;
  std::filesystem::path path;
  bool complete;
};
// Checkpoint directories under root, by step.
std::vector<CatalogEntry> listCheckpoints(const std::filesystem::path& root);
// Keeps the newest keepLast complete checkpoints (0: all) and deletes incomplete ones older
// than `newest` (left by crashed saves).
void prune(const std::filesystem::path& root, int64_t keepLast, int64_t newest, const StageHook& hook);

}  // namespace lt::ckpt
