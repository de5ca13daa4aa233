// The step program: one micro-batch's forward, loss and backward as an explicit
// list of instructions over parameter groups (blocks 0..L-1, head L, embed L+1), plus the
// gradient reduction, and where the optimizer step falls (OptimizerStep, the last instruction:
// the executor runs nothing for it, and the engine runs the step once the accumulation
// boundary's micro-batch has returned, so control never climbs from the executor to the engine). Compile passes rewrite
// this list; the executor runs it. Each block either is checkpointed (Forward keeps only its
// input, RecomputeBackward recomputes it with grad and backpropagates) or keeps its autograd
// graph from forward (ForwardGraph, then Backward without recompute): `activation_checkpointing`.
#pragma once
#include <string>
#include <vector>

namespace lt::compile {

enum class OpCode {
  Embed,              // x0 = embed(ids), no grad
  Gather,             // make group g's parameters whole (ZeRO-3); no-op otherwise
  Forward,            // x_{g+1} = block_g(x_g), no grad; x_g kept
  Release,            // drop group g's gathered parameters
  LossAndGrad,        // loss of head(x_L); its gradient flows into x_L and the head group
  RecomputeBackward,  // recompute block g from kept x_g with grad, backprop dL/dx_{g+1}
  EmbedBackward,      // backprop dL/dx0 into the embedding
  ReduceGrads,        // start reducing group g's gradients (async)
  OptimizerStep,      // the step boundary, always last: the engine steps after the last micro-batch's run
  Prefetch,           // start gathering group g asynchronously; a later Gather(g) waits for it
  FreeActivation,     // free the kept input of block g (after its last use)
  OffloadActivation,  // move the kept input of block g to host memory
  ReloadActivation,   // bring it back before its use
  ForwardGraph,       // x_{g+1} = block_g(x_g) with grad; the block's autograd graph is kept
  Backward,           // backprop dL/dx_{g+1} through block g's kept graph (no recompute)
};

struct Instr {
  OpCode op;
  int group = -1;
};

struct Program {
  std::vector<Instr> code;
  std::string listing() const;         // one instruction per line, e.g. "Forward(3)"
  std::string listingOf(size_t pc) const;  // instruction pc alone, e.g. "Forward(3)"
};

const char* opName(OpCode op);

// The base program for `numBlocks` blocks (head group = numBlocks, embed = numBlocks + 1):
// no Gather/Release (the `zero3` pass inserts them) and kept activations live until the end
// of the micro-step (the `free_activations` pass frees each after its last use). The last
// `graphBlocks` blocks keep their autograd graph (ForwardGraph/Backward); the others are
// recomputed. Keeping the last ones frees their graphs first in backward, before any
// recompute runs, so the peak is the same as for any other choice of as many blocks.
Program baseProgram(int numBlocks, int graphBlocks = 0);

// Groups each instruction reads parameters of (empty for none): where `zero3` gathers. With
// tiedEmbeddings the loss also reads the embed group.
std::vector<int> paramGroupsUsed(const Instr& in, int numBlocks, bool tiedEmbeddings);

}  // namespace lt::compile
