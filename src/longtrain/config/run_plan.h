// The choices a run makes once, at start, from measurements and the machine: the fp32 GEMM
// route, whether GEMMs run in bf16, which blocks keep their graph, the memory budget. They are
// kept apart from the Config, which stays as the user wrote it (checkpoints record that one).
// Non-obvious: whatever shapes the collectives or the numerics must be the same on every
// rank, so those fields are compared over the world (train::agreeOnPlan) and a mismatch
// names the first that differs; the memory budget is this rank's own and is not compared.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "longtrain/config/config.h"

namespace lt::config {

struct RunPlan {
  KernelChoices kernels;  // GEMM route, bf16 GEMMs and attention, document packing
  int graphBlocks = 0;           // activation_checkpointing resolved: the last k blocks keep their graph
  // model.loss_chunk and model.tiled_mlp "auto" resolved (plan::chooseTiling); unused otherwise.
  int64_t lossChunk = 0;
  bool tiledMlp = false;
  int64_t memoryBudget = 0;      // this rank's bytes, what "auto" chose against (not compared)

  // The fields every rank must hold the same, by config-style name, as numbers.
  std::vector<std::pair<std::string, double>> agreedFields() const;
  // The model's options: its config section with the plan's choices in.
  ModelConfig model(const ModelConfig& m) const;
  // The config with the plan's choices in (what the memory model predicts this run from).
  Config applied(const Config& c) const;
};

}  // namespace lt::config
