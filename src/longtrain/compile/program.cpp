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
    case OpCode::OpPrefetch: return "Prefetch";
    case OpCode::OpFreeActivation: return "FreeActivation";
    case OpCode::OpOffloadActivation: return "OffloadActivation";
    case OpCode::OpReloadActivation: return "ReloadActivation";
    case OpCode::OpForwardGraph: return "ForwardGraph";
    case OpCode::OpBackward: return "Backward";
  }
  LT_ASSERT(false);
}

std::string Program::listingOf(size_t pc) const {
  const Instr& i = code.at(pc);
  return std::string(opName(i.op)) + (i.group >= 0 ? "(" + std::to_string(i.group) + ")" : "");
}

std::string Program::listing() const {
  std::string out;
  for (size_t pc = 0; pc < code.size(); ++pc) out += listingOf(pc) + "\n";
  return out;
}

std::vector<int> paramGroupsUsed(const Instr& in, int numBlocks, bool tiedEmbeddings) {
  const int head = numBlocks, embed = numBlocks + 1;
  switch (in.op) {
    case OpCode::OpEmbed: return {embed};
    case OpCode::OpForward:
    case OpCode::OpForwardGraph:
    case OpCode::OpBackward:  // autograd reads the saved parameters
    case OpCode::OpRecomputeBackward: return {in.group};
    case OpCode::OpLossAndGrad: return tiedEmbeddings ? std::vector<int>{embed, head} : std::vector<int>{head};
    default: return {};  // EmbedBackward reads no weights
  }
}

Program baseProgram(int numBlocks, int graphBlocks) {
  LT_ASSERT(graphBlocks >= 0 && graphBlocks <= numBlocks);
  auto keepsGraph = [&](int b) { return b >= numBlocks - graphBlocks; };
  Program p;
  const int head = numBlocks, embed = numBlocks + 1;
  auto emit = [&](OpCode op, int g = -1) { p.code.push_back({op, g}); };
  emit(OpCode::OpEmbed, embed);
  for (int b = 0; b < numBlocks; ++b) emit(keepsGraph(b) ? OpCode::OpForwardGraph : OpCode::OpForward, b);
  emit(OpCode::OpLossAndGrad, head);
  emit(OpCode::OpReduceGrads, head);  // final norm and LM head: their gradients are complete
  for (int b = numBlocks - 1; b >= 0; --b) {
    emit(keepsGraph(b) ? OpCode::OpBackward : OpCode::OpRecomputeBackward, b);
    emit(OpCode::OpReduceGrads, b);
  }
  emit(OpCode::OpEmbedBackward, embed);
  emit(OpCode::OpReduceGrads, embed);
  emit(OpCode::OpOptimizerStep);
  return p;
}

}  // namespace lt::compile
