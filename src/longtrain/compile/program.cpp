// Base program construction and listing.
#include "longtrain/compile/program.h"

#include "longtrain/core/check.h"

namespace lt::compile {

const char* opName(OpCode op) {
  switch (op) {
    case OpCode::Embed: return "Embed";
    case OpCode::Gather: return "Gather";
    case OpCode::Forward: return "Forward";
    case OpCode::Release: return "Release";
    case OpCode::LossAndGrad: return "LossAndGrad";
    case OpCode::RecomputeBackward: return "RecomputeBackward";
    case OpCode::EmbedBackward: return "EmbedBackward";
    case OpCode::ReduceGrads: return "ReduceGrads";
    case OpCode::OptimizerStep: return "OptimizerStep";
    case OpCode::Prefetch: return "Prefetch";
    case OpCode::FreeActivation: return "FreeActivation";
    case OpCode::OffloadActivation: return "OffloadActivation";
    case OpCode::ReloadActivation: return "ReloadActivation";
    case OpCode::ForwardGraph: return "ForwardGraph";
    case OpCode::Backward: return "Backward";
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
    case OpCode::Embed: return {embed};
    case OpCode::Forward:
    case OpCode::ForwardGraph:
    case OpCode::Backward:  // autograd reads the saved parameters
    case OpCode::RecomputeBackward: return {in.group};
    case OpCode::LossAndGrad: return tiedEmbeddings ? std::vector<int>{embed, head} : std::vector<int>{head};
    default: return {};  // EmbedBackward reads no weights
  }
}

Program baseProgram(int numBlocks, int graphBlocks) {
  LT_ASSERT(graphBlocks >= 0 && graphBlocks <= numBlocks);
  auto keepsGraph = [&](int b) { return b >= numBlocks - graphBlocks; };
  Program p;
  const int head = numBlocks, embed = numBlocks + 1;
  auto emit = [&](OpCode op, int g = -1) { p.code.push_back({op, g}); };
  emit(OpCode::Embed, embed);
  for (int b = 0; b < numBlocks; ++b) emit(keepsGraph(b) ? OpCode::ForwardGraph : OpCode::Forward, b);
  emit(OpCode::LossAndGrad, head);
  emit(OpCode::ReduceGrads, head);  // final norm and LM head: their gradients are complete
  for (int b = numBlocks - 1; b >= 0; --b) {
    emit(keepsGraph(b) ? OpCode::Backward : OpCode::RecomputeBackward, b);
    emit(OpCode::ReduceGrads, b);
  }
  emit(OpCode::EmbedBackward, embed);
  emit(OpCode::ReduceGrads, embed);
  emit(OpCode::OptimizerStep);
  return p;
}

}  // namespace lt::compile
