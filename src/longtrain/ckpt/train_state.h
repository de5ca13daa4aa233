// What a checkpoint saves and restores, as the training side exposes it: the config, the
// world, the step counters, every parameter's name and shape, this rank's pieces of the fp32
// state and the data position. ckpt/ depends on this interface, not on the trainer
// (torchtitan's checkpointer asks components for their state the same way); train::Engine
// implements it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "longtrain/comm/comm.h"
#include "longtrain/config/config.h"
#include "longtrain/core/partition.h"

namespace lt::ckpt {

struct ParamMeta {
  std::string name;  // Hugging Face Llama name
  std::vector<int64_t> shape;
};

class TrainState {
 public:
  virtual ~TrainState() = default;
  virtual const config::Config& config() const = 0;
  virtual comm::Comm& world() = 0;
  virtual int64_t globalStep() const = 0;  // optimizer steps taken
  virtual std::vector<ParamMeta> parameterMeta() const = 0;  // Model::parameters() order
  // true under ZeRO stages 1-3 (each rank holds a chunk of every master and Adam state);
  // false: every rank holds everything, identical across ranks.
  virtual bool statePartitioned() const = 0;
  // This rank's pieces of master and Adam state, pointing into the live buffers.
  virtual std::vector<StateShard> stateShards() = 0;
  virtual int64_t adamStepCount() const = 0;
  virtual int64_t skippedSteps() const = 0;  // steps skipped for a non-finite gradient
  virtual int64_t loaderCursor() const = 0;  // micro-batches this rank has taken from its loader
  // Prepares a fresh state to continue after `step` optimizer steps: the step counter (so
  // the LR and pass schedules), the data position (derived from the step, so it holds for
  // any world size and SP degree with the same train_batch_size), Adam's step count; the
  // state is zeroed for the caller to fill through stateShards(). Collective under SP.
  virtual void resetToStep(int64_t step, int64_t adamStep, int64_t skippedSteps) = 0;
};

}  // namespace lt::ckpt
