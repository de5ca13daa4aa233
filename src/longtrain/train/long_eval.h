// Long-context evaluation (`longtrain eval`): the mean next-token loss over a token file's
// windows together with the loss by position (does the model use far context?), and passkey
// retrieval (a number hidden in filler at a given depth of a given length, asked for at the
// end, greedy decoding, exact match). Non-obvious: the logits are formed a tile of positions at
// a time, so a 32K window with a 150K vocabulary needs tens of MiB for them, not 19 GiB.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "longtrain/comm/comm.h"
#include "longtrain/config/parallel_layout.h"
#include "longtrain/data/tokenizer.h"
#include "longtrain/model/model.h"

namespace lt::train {

struct PositionLossOptions {
  std::string path;        // the token file
  int bytesPerToken = 2;   // 2: uint16, 4: uint32
  int64_t seqLen = 0;      // window length (the training windows' convention: non-overlapping)
  int64_t maxWindows = 0;  // 0: every whole window of the file
  int64_t packEos = -1;    // >= 0: documents separated by this id, positions restart after it
  // How errors name the file, the window length and the dtype: the user's flags or keys.
  std::string source = "eval --data", seqLenKey = "--seq-len", typeKey = "--dtype";
};

// Targets by position: [start, end) counts the target's position in its window (or document);
// the first bucket is [1, 2), each next one twice as wide, the last ends at the window length.
struct PositionBucket {
  int64_t start = 0, end = 0, tokens = 0;
  double lossSum = 0;
};
struct PositionLoss {
  int64_t windows = 0, tokens = 0;
  double lossSum = 0;
  std::vector<PositionBucket> buckets;
  double loss() const { return tokens ? lossSum / static_cast<double>(tokens) : 0; }
};

// On one process (`sp` null) or on the ranks of an SP group: each rank runs its shard of
// every window (`layout`: Ulysses x ring, as training shards) and the sums are all-reduced,
// so every rank returns the whole result.
struct SequenceParallel {
  comm::Groups groups;
  config::ParallelLayout layout;
};
// The options for token file `path` as eval and train.eval give them: `dtype` "" takes the
// file's sidecar's; with packed documents the EOS is `eosOverride` (>= 0), else the sidecar's,
// else `eosFallback`. `source` names the flag or key in errors: "eval --data" (then --seq-len
// and --dtype) or "train.eval.data" (then train.eval.seq_len and train.eval.dtype).
PositionLossOptions positionLossOptions(const std::string& path, int64_t seqLen, int64_t windows,
                                        config::TokenDtype dtype, bool packDocuments, int64_t eosOverride,
                                        int64_t eosFallback, const std::string& source);

PositionLoss evaluatePositions(model::Model& m, const PositionLossOptions& o, const SequenceParallel* sp = nullptr);
// The token file opened and cut into windows as evaluatePositions will, without a model: the
// launcher's check before ranks start (lt::Error as each rank would throw it).
void checkPositionLossFile(const PositionLossOptions& o, int64_t vocabSize);

struct NeedleOptions {
  std::vector<int64_t> lengths;  // prompt lengths in tokens
  std::vector<double> depths;    // where the needle sits in the filler, 0 (start) .. 1 (end)
  int trials = 4;                // per cell, each with its own random key
  int digits = 5;
  uint64_t seed = 1234;
  int64_t startToken = -1;  // BOS (or EOS after packed training) before the prompt; -1: none
};
struct NeedleCell {
  int64_t length = 0;  // asked
  double depth = 0;
  int correct = 0, trials = 0;
  int64_t promptTokens = 0;  // the prompts' mean length, as built
  double accuracy() const { return trials ? static_cast<double>(correct) / trials : 0; }
};

// The prompt of one trial: start token, instructions, filler around the needle, the question.
std::vector<int64_t> needlePrompt(const data::Tokenizer& tok, int64_t length, double depth, const std::string& key,
                                  int64_t startToken);
// Exact match: the first run of digits in `answer` is `key`.
bool needleAnswered(const std::string& answer, const std::string& key);
std::vector<NeedleCell> needleGrid(model::Model& m, const data::Tokenizer& tok, const NeedleOptions& o);

// The logits of the last position of `ids` (the whole sequence through every block).
at::Tensor lastLogits(model::Model& m, const std::vector<int64_t>& ids);

}  // namespace lt::train
