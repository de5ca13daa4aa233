// Base program construction and listing.
#include "longtrain/compile/program.h"

#include "longtrain/core/check.h"

namespace lt::compile {

const char* opName(OpCode op) {
  switch (op) {
    case OpCode::OpEmbed: return "Embed";
    case OpCode::OpGather: return "Gather";
    case OpCode::OpForward: return "Forward";
    case OpCode::OpRelease: return "Release";
    case OpCode::OpLossAndGrad: return "LossAndGrad";
    case OpCode::OpRecomputeBackward: return "RecomputeBackward";
    case OpCode::OpEmbedBackward: return "EmbedBackward";
    case OpCode::OpReduceGrads: return "ReduceGrads";
    case OpCode::OpOptimizerStep: return "OptimizerStep";
  }
  LT_ASSERT(false);
}

std::string Program::listing() const {
  std::string out;
  for (const auto& i : code) {
    out += opName(i.op);
    if (i.group >= 0) out += "(" + std::to_string(i.group) + ")";
    out += "\n";
  }
  return out;
}

Program baseProgram(int numBlocks, bool zero3) {
  Program p;
  const int head = numBlocks;
  auto emit = [&](OpCode op, int g = -1) { p.code.push_back({op, g}); };
  if (zero3) emit(OpCode::OpGather, head);
  emit(OpCode::OpEmbed, head);
  for (int b = 0; b < numBlocks; ++b) {
    if (zero3) emit(OpCode::OpGather, b);
    emit(OpCode::OpForward, b);
    if (zero3) emit(OpCode::OpRelease, b);
  }
  emit(OpCode::OpLossAndGrad, head);
  for (int b = numBlocks - 1; b >= 0; --b) {
    if (zero3) emit(OpCode::OpGather, b);
    emit(OpCode::OpRecomputeBackward, b);
    emit(OpCode::OpReduceGrads, b);
    if (zero3) emit(OpCode::OpRelease, b);
  }
  emit(OpCode::OpEmbedBackward, head);
  emit(OpCode::OpReduceGrads, head);
  if (zero3) emit(OpCode::OpRelease, head);
  emit(OpCode::OpOptimizerStep);
  return p;
}

}  // namespace lt::compile
