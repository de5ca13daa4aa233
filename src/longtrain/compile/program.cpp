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

Program baseProgram(int numBlocks, bool zero3, bool tiedEmbeddings) {
  Program p;
  const int head = numBlocks, embed = numBlocks + 1;
  auto emit = [&](OpCode op, int g = -1) { p.code.push_back({op, g}); };
  auto gather = [&](int g) { if (zero3) emit(OpCode::OpGather, g); };
  auto release = [&](int g) { if (zero3) emit(OpCode::OpRelease, g); };
  gather(embed);
  emit(OpCode::OpEmbed, embed);
  release(embed);
  for (int b = 0; b < numBlocks; ++b) {
    gather(b);
    emit(OpCode::OpForward, b);
    release(b);
  }
  if (tiedEmbeddings) gather(embed);
  gather(head);
  emit(OpCode::OpLossAndGrad, head);
  emit(OpCode::OpReduceGrads, head);  // final norm and LM head: their gradients are complete
  release(head);
  if (tiedEmbeddings) release(embed);
  for (int b = numBlocks - 1; b >= 0; --b) {
    gather(b);
    emit(OpCode::OpRecomputeBackward, b);
    emit(OpCode::OpReduceGrads, b);
    release(b);
  }
  emit(OpCode::OpEmbedBackward, embed);  // reads no weights: nothing to gather
  emit(OpCode::OpReduceGrads, embed);
  emit(OpCode::OpOptimizerStep);
  return p;
}

}  // namespace lt::compile
