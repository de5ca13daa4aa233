// The bytes the executor itself holds while it runs an instruction, declared beside it
// (executor.cpp) for `longtrain plan`, which walks the same program. Non-obvious: the kept
// block inputs are not here: the plan follows them instruction by instruction.
#pragma once
#include "longtrain/compile/program.h"
#include "longtrain/core/footprint.h"

namespace lt::compile {

// The batch a micro-step runs on (data::Batch's int64 fields), held throughout.
double batchBytes(const StepShape& s);
// Executor::execute's own tensors while `op` runs: a block's output and the upstream gradient
// (RecomputeBackward, Backward), the gradient of the loss's input (LossAndGrad, tiled).
TensorBytes executorWork(OpCode op, const StepShape& s);

}  // namespace lt::compile
