// `longtrain eval MODEL`: the loss by position over a token file and the passkey grid
// (train/long_eval.h), printed as text or one JSON object, the grid also as an SVG heatmap.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lt::cli {

struct EvalFlags {
  std::string model, data, dtype, packing = "none", tokenizer, out;
  int64_t seqLen = 0, windows = 0, eosId = -1;
  int nproc = 1;  // --data on this many SP ranks (processes)
  bool json = false, needle = false;
  std::string lengths, depths;
  int trials = 4, digits = 5;
  uint64_t seed = 1234;
};

CLI::App* addEvalCommand(CLI::App& app, EvalFlags& f);
// argv: the command line, which --nproc re-runs in each rank.
int cmdEval(const EvalFlags& f, int argc, char** argv);

}  // namespace lt::cli
