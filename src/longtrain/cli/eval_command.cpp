// The eval subcommand: flags, the two measures, and their report. Non-obvious: the token file's
// dtype and EOS come from its sidecar (F.bin.json) unless --dtype / --eos-id say otherwise, and
// nothing is printed or written for a measure that was not asked for (no zero losses).

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <optional>
#include <sstream>
#include <thread>

#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/cli/command.h"
#include "longtrain/comm/bring_up.h"
#include "longtrain/comm/launch.h"
#include "longtrain/core/check.h"
#include "longtrain/core/memory.h"
#include "longtrain/core/number_list.h"
#include "longtrain/report/heatmap.h"
#include "longtrain/train/long_eval.h"

namespace lt::cli {

namespace {

struct EvalFlags {
  std::string model, data, tokenizer, out;
  config::TokenDtype dtype = config::TokenDtype::FromSidecar;
  config::Packing packing = config::Packing::None;
  int64_t seqLen = 0, windows = 0, eosId = -1;
  int nproc = 1;  // --data on this many SP ranks (processes)
  bool json = false, needle = false;
  std::string lengths, depths;
  int trials = 4, digits = 5;
  uint64_t seed = 1234;
};

train::PositionLossOptions positionOptions(const EvalFlags& f) {
  return train::positionLossOptions(f.data, f.seqLen, f.windows, f.dtype, f.packing == config::Packing::Documents, f.eosId, -1,
                                    "eval --data");
}

void printPositionLoss(const train::PositionLoss& r, const EvalFlags& f) {
  std::printf("eval: %s: %lld windows x %lld tokens, %lld scored, loss %.4f (perplexity %.2f)\n", f.data.c_str(),
              (long long)r.windows, (long long)f.seqLen, (long long)r.tokens, r.loss(), std::exp(r.loss()));
  std::printf("  loss by position (the target's position in its %s):\n", f.packing == config::Packing::Documents ? "document" : "window");
  for (const auto& b : r.buckets)
    if (b.tokens > 0)
      std::printf("    [%7lld, %7lld)  %.4f  (%lld tokens)\n", (long long)b.start, (long long)b.end,
                  b.lossSum / static_cast<double>(b.tokens), (long long)b.tokens);
}

void printNeedle(const std::vector<train::NeedleCell>& cells, const train::NeedleOptions& o) {
  std::printf("needle: passkey retrieval, %d trials per cell, greedy, exact match of the %d-digit key\n", o.trials,
              o.digits);
  std::printf("  %-10s", "depth");
  for (int64_t l : o.lengths) std::printf(" %8lld", (long long)l);
  std::printf("   (prompt length in tokens)\n");
  for (size_t d = 0; d < o.depths.size(); ++d) {
    std::printf("  %-10.2f", o.depths[d]);
    for (size_t l = 0; l < o.lengths.size(); ++l) std::printf(" %8.2f", cells[l * o.depths.size() + d].accuracy());
    std::printf("\n");
  }
}

void writeGrid(const std::vector<train::NeedleCell>& cells, const train::NeedleOptions& o, const EvalFlags& f) {
  report::Heatmap h;
  h.title = "passkey retrieval: " + f.model;
  h.xLabel = "prompt length (tokens)";
  h.yLabel = "needle depth";
  for (int64_t l : o.lengths) h.columns.push_back(std::to_string(l));
  for (double d : o.depths) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.2f", d);
    h.rows.push_back(buf);
    h.values.emplace_back();
  }
  for (size_t l = 0; l < o.lengths.size(); ++l)
    for (size_t d = 0; d < o.depths.size(); ++d) h.values[d].push_back(cells[l * o.depths.size() + d].accuracy());
  report::writeHeatmap(h, f.out);
}

constexpr std::chrono::milliseconds kRankTimeout{120000};

// This rank's SP group: every rank of the job, split Ulysses x ring as training would split it.
train::SequenceParallel rankGroups(const model::ModelConfig& m) {
  train::SequenceParallel sp;
  const int world = comm::envInt("WORLD_SIZE", 1);
  sp.layout = config::ParallelLayout::make(world, world, m.heads, m.kvHeads, 0, lt::config::SpBalance::Auto);
  comm::BringUpOptions bo;
  bo.sequenceParallel = world;
  bo.ringDegree = sp.layout.R;
  bo.timeout = kRankTimeout;
  sp.groups = comm::bringUp(bo).groups;
  return sp;
}

void addEvalOptions(CLI::App* ev, EvalFlags& f) {
  ev->add_option("MODEL", f.model, "a checkpoint (step directory or root) or a Hugging Face model directory")->required();
  ev->add_option("--data", f.data, "a token file (longtrain tokenize's): mean next-token loss over its windows and "
                                   "the loss by position");
  ev->add_option("--seq-len", f.seqLen, "window length in tokens, with --data")->check(CLI::Range(int64_t(2), int64_t(1) << 30));
  ev->add_option("--nproc", f.nproc, "with --data: evaluate on this many sequence-parallel ranks (processes), each "
                                    "holding 1/N of every window's activations")
      ->check(CLI::Range(1, 1024));
  ev->add_option("--windows", f.windows, "evaluate at most this many windows (default: all)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  ev->add_option("--dtype", f.dtype, "the token file's dtype (default: its sidecar's)")
      ->transform(optionChoices({config::TokenDtype::Uint16, config::TokenDtype::Uint32}));
  ev->add_option("--packing", f.packing, "none (default): positions run through the window; documents: they "
                                         "restart after every EOS, and no token attends across one")
      ->transform(optionChoices<config::Packing>());
  ev->add_option("--eos-id", f.eosId, "the EOS id for --packing documents (default: the sidecar's)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  ev->add_flag("--needle", f.needle, "passkey retrieval: a number hidden in filler, asked for at the end");
  ev->add_option("--lengths", f.lengths, "with --needle: prompt lengths in tokens, comma-separated (e.g. 1024,4096)");
  ev->add_option("--depths", f.depths, "with --needle: needle depths from 0 (start) to 1 (end), comma-separated");
  ev->add_option("--trials", f.trials, "with --needle: trials per cell, each with its own key (default 4)")
      ->check(CLI::Range(1, 100000));
  ev->add_option("--digits", f.digits, "with --needle: digits of the key (default 5)")->check(CLI::Range(1, 18));
  ev->add_option("--seed", f.seed, "with --needle: seed of the keys (default 1234)");
  ev->add_option("--tokenizer", f.tokenizer, "with --needle: a tokenizer.json, .model or directory (default: the "
                                             "model's)");
  ev->add_option("--out", f.out, "with --needle: write the accuracy grid as an SVG heatmap here");
  ev->add_flag("--json", f.json, "print one JSON object (loss, tokens, loss_by_position, needle) instead of text");
}

// A prompt of L tokens keeps a KV cache of L x layers x 2 x kv heads x head_dim floats: each
// --lengths entry must fit in half of what this process may use (a huge one is refused, not
// std::bad_alloc).
void checkKvCacheFits(const std::vector<int64_t>& lengths, const model::ModelConfig& c) {
  const int64_t limit = rankMemoryLimitBytes(1);
  if (limit <= 0) return;
  const long double perToken = 4.0L * 2 * static_cast<long double>(c.layers * c.kvHeads * c.headDim());
  for (int64_t l : lengths)
    LT_CHECK(perToken * static_cast<long double>(l) <= limit / 2, "--lengths: a prompt of ", l, " tokens needs a ",
             static_cast<int64_t>(perToken * static_cast<long double>(l) / (1 << 20)), " MiB KV cache, more than half ",
             "of the ", limit / (1 << 20), " MiB this process may use; give at most ",
             static_cast<int64_t>(static_cast<long double>(limit / 2) / perToken), " tokens");
}

int runEval(const EvalFlags& f, int argc, char** argv) {
  LT_CHECK(!f.data.empty() || f.needle, "eval needs --data F.bin --seq-len S, or --needle (or both)");
  LT_CHECK(f.nproc == 1 || !f.needle, "eval --needle runs in one process; run it without --nproc (--data may use it)");
  const bool inRank = std::getenv("WORLD_SIZE") != nullptr;
  if (f.nproc > 1 && !inRank) {
    const auto m = ckpt::loadInferenceModel(f.model, "eval MODEL");  // a bad model or file fails here once,
    train::checkPositionLossFile(positionOptions(f), m.model->config().vocabSize);  // not once per rank
    comm::LaunchOptions lo;
    lo.nprocPerNode = f.nproc;
    lo.grace = kRankTimeout;
    return comm::launch(std::vector<std::string>(argv, argv + argc), lo);
  }
  LT_CHECK(f.data.empty() || f.seqLen > 0, "eval --data needs --seq-len (the window length in tokens)");
  LT_CHECK(f.needle || (f.lengths.empty() && f.depths.empty() && f.out.empty()), "--lengths, --depths and --out ",
           "belong to --needle; add --needle");
  at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  auto m = ckpt::loadInferenceModel(f.model, "eval MODEL");
  std::optional<train::SequenceParallel> sp;
  if (inRank) sp = rankGroups(m.model->config());  // sets this rank's share of the cores
  const bool rank0 = !sp || sp->groups.world->rank() == 0;
  nlohmann::json out = nlohmann::json::object();
  if (!f.data.empty()) {
    const train::PositionLoss r = train::evaluatePositions(*m.model, positionOptions(f), sp ? &*sp : nullptr);
    if (!f.json && rank0) printPositionLoss(r, f);
    out["loss"] = r.loss();
    out["tokens"] = r.tokens;
    out["windows"] = r.windows;
    out["loss_by_position"] = nlohmann::json::array();
    for (const auto& b : r.buckets)
      if (b.tokens > 0) out["loss_by_position"].push_back({b.start, b.end, b.lossSum / static_cast<double>(b.tokens)});
  }
  if (f.needle) {
    train::NeedleOptions o;
    o.lengths = parseNumberList<int64_t>(f.lengths.empty() ? "1024" : f.lengths, "--lengths", "1024,4096");
    for (int64_t l : o.lengths) LT_CHECK(l >= 64, "--lengths: ", l, " tokens cannot hold the prompt; give >= 64");
    checkKvCacheFits(o.lengths, m.model->config());
    const std::string tokPath = f.tokenizer.empty() ? m.tokenizer : f.tokenizer;
    LT_CHECK(!tokPath.empty(), "eval --needle needs a tokenizer: ", f.model, " names none; give --tokenizer");
    const data::Tokenizer tok(tokPath);
    LT_CHECK(tok.vocabSize() <= m.model->config().vocabSize, "the tokenizer '", tok.path(), "' has ", tok.vocabSize(),
             " tokens, the model only ", m.model->config().vocabSize);
    o.depths = parseNumberList<double>(f.depths.empty() ? "0,0.25,0.5,0.75,1" : f.depths, "--depths", "0,0.5,1");
    for (double d : o.depths) LT_CHECK(d >= 0 && d <= 1, "--depths: ", d, " is outside 0..1");
    o.trials = f.trials, o.digits = f.digits, o.seed = f.seed;
    o.startToken = m.promptAfterEos ? tok.eosId() : tok.bosId();
    const auto cells = train::needleGrid(*m.model, tok, o);
    if (!f.json) printNeedle(cells, o);
    if (!f.out.empty()) writeGrid(cells, o, f);
    out["needle"] = nlohmann::json::array();
    for (const auto& c : cells) out["needle"].push_back({c.length, c.depth, c.accuracy()});
  }
  if (f.json && rank0) std::printf("%s\n", out.dump().c_str());
  if (sp) sp->groups.world->barrier();  // nobody tears down its process group while a peer still needs it
  return 0;
}

}  // namespace

Command evalCommand(CLI::App& app, int argc, char** argv) {
  auto f = std::make_shared<EvalFlags>();
  auto* ev = app.add_subcommand("eval", "long-context evaluation of a checkpoint or a Hugging Face directory: the "
                                        "loss by position over a token file (--data), passkey retrieval (--needle)");
  addEvalOptions(ev, *f);
  return {ev, [f, argc, argv] { return runEval(*f, argc, argv); }};
}

}  // namespace lt::cli
