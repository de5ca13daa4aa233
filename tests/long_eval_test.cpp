// train/long_eval (longtrain eval): the loss by position against an independent computation
// (the whole-sequence forward through the naive attention core, log-softmax in double), with
// and without packed documents; the passkey prompt's length and needle depth under Llama 3's
// real tokenizer; the exact-match rule; the heatmap's SVG; and the command end to end.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/data/data.h"
#include "longtrain/data/tokenizer.h"
#include "longtrain/model/model.h"
#include "longtrain/report/heatmap.h"
#include "longtrain/train/long_eval.h"

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path fixture(const std::string& name) { return fs::path(LONGTRAIN_SOURCE_DIR) / "tests/fixtures/hf_llama" / name; }

// `n` random ids below `vocab` as a uint16 token file; every 7th id from `eosEvery` on is `eos`.
fs::path writeTokens(const fs::path& p, int n, int vocab, int eos = -1) {
  std::mt19937 rng(7);
  std::ofstream f(p, std::ios::binary);
  for (int i = 0; i < n; ++i) {
    uint16_t v = static_cast<uint16_t>(rng() % static_cast<unsigned>(vocab));
    if (eos >= 0 && i % 7 == 5) v = static_cast<uint16_t>(eos);
    f.write(reinterpret_cast<const char*>(&v), 2);
  }
  return p;
}

// The independent figure: per-target losses from Model::forward (naive core), bucketed.
lt::train::PositionLoss reference(lt::model::Model& m, const fs::path& file, int64_t S, int64_t eos) {
  lt::data::TokenFileDataset d(file.string(), 2, S, m.config().vocabSize, {eos, 0, -1});
  lt::train::PositionLoss r;
  for (int64_t start = 1; start < S; start *= 2) r.buckets.push_back({start, std::min(start * 2, S), 0, 0});
  at::NoGradGuard ng;
  for (int64_t w = 0; w < d.size(); ++w) {
    const auto s = d.get(w);
    auto ids = at::tensor(s.ids, at::kLong).view({1, S});
    auto pos = s.positions.empty() ? at::arange(S, at::kLong).view({1, S}) : at::tensor(s.positions, at::kLong).view({1, S});
    const lt::model::AttentionFn naive = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor&) {
      return lt::model::causalAttention(q, k, v, eos >= 0 ? pos : at::Tensor());
    };
    auto logp = at::log_softmax(m.forward(ids, pos, naive)[0].to(at::kDouble), -1);
    for (int64_t i = 0; i + 1 < S; ++i) {
      const int64_t y = s.labels[static_cast<size_t>(i + 1)];
      if (y == lt::data::kIgnoreIndex) continue;
      const double l = -logp[i][y].item<double>();
      const int64_t where = pos[0][i].item<int64_t>() + 1;
      r.lossSum += l, ++r.tokens;
      for (auto& b : r.buckets)
        if (where >= b.start && where < b.end) b.lossSum += l, ++b.tokens;
    }
  }
  return r;
}

void expectSame(const lt::train::PositionLoss& got, const lt::train::PositionLoss& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_NEAR(got.loss(), want.loss(), 1e-5);
  ASSERT_EQ(got.buckets.size(), want.buckets.size());
  for (size_t i = 0; i < got.buckets.size(); ++i) {
    EXPECT_EQ(got.buckets[i].start, want.buckets[i].start);
    EXPECT_EQ(got.buckets[i].tokens, want.buckets[i].tokens) << i;
    if (want.buckets[i].tokens) {
      EXPECT_NEAR(got.buckets[i].lossSum / got.buckets[i].tokens, want.buckets[i].lossSum / want.buckets[i].tokens,
                  lt::testing::Tol::kHfOracle) << i;
    }
  }
}

TEST(LongEval, LossByPositionEqualsTheIndependentForward) {
  at::set_num_threads(1);
  const auto dir = lt::testing::freshTempDir("longtrain_long_eval");
  auto m = lt::ckpt::loadInferenceModel(fixture("gqa_untied").string(), "generate MODEL");
  const fs::path file = writeTokens(dir / "t.bin", 3 * 12 + 5, 40);
  lt::train::PositionLossOptions o;
  o.path = file.string(), o.seqLen = 12;
  const auto got = lt::train::evaluatePositions(*m.model, o);
  EXPECT_EQ(got.windows, 3);
  EXPECT_EQ(got.tokens, 3 * 11);
  ASSERT_EQ(got.buckets.size(), 4u);  // [1,2) [2,4) [4,8) [8,12)
  EXPECT_EQ(got.buckets[3].end, 12);
  EXPECT_EQ(got.buckets[0].tokens, 3);
  expectSame(got, reference(*m.model, file, 12, -1));
  o.maxWindows = 2;
  EXPECT_EQ(lt::train::evaluatePositions(*m.model, o).windows, 2);
}

// A Mistral window under a ring layout (2 thread ranks, Ulysses 1 x ring 2, zigzag): the ring
// kernel is given the window, so the figures equal one process's (the ring used to see every
// earlier key there, and evaluate a windowed model as a full-causal one).
TEST(LongEval, RingLayoutKeepsTheSlidingWindow) {
  const auto dir = lt::testing::freshTempDir("longtrain_long_eval_ring");
  const fs::path file = writeTokens(dir / "t.bin", 3 * 16, 40);
  lt::model::ModelConfig mc;
  mc.vocabSize = 40, mc.hidden = 32, mc.layers = 2, mc.heads = 2, mc.kvHeads = 1, mc.intermediate = 48;
  mc.modelType = lt::config::ModelType::Mistral, mc.slidingWindow = 3;
  lt::train::PositionLossOptions o;
  o.path = file.string(), o.seqLen = 16;
  lt::model::Model one(mc, 5);
  const auto want = lt::train::evaluatePositions(one, o);
  const auto layout = lt::config::ParallelLayout::make(2, 2, mc.heads, mc.kvHeads, 2, lt::config::SpBalance::Zigzag);
  ASSERT_EQ(layout.R, 2);
  std::vector<lt::train::PositionLoss> got(2);
  lt::testing::runRanks(2, 2, [&](int r, lt::comm::Groups& g) {
    lt::model::Model m(mc, 5);
    const lt::train::SequenceParallel sp{g, layout};
    got[r] = lt::train::evaluatePositions(m, o, &sp);
  }, std::chrono::milliseconds(30000), layout.R);
  for (const auto& g : got) {
    EXPECT_EQ(g.tokens, want.tokens);
    EXPECT_NEAR(g.loss(), want.loss(), lt::testing::Tol::kSequenceParallel * want.loss());
  }
}

TEST(LongEval, PackedDocumentsRestartPositionsAndMaskAcrossThem) {
  at::set_num_threads(1);
  const auto dir = lt::testing::freshTempDir("longtrain_long_eval_packed");
  auto m = lt::ckpt::loadInferenceModel(fixture("gqa_untied").string(), "generate MODEL");
  const fs::path file = writeTokens(dir / "t.bin", 2 * 12, 40, /*eos=*/3);
  lt::train::PositionLossOptions o;
  o.path = file.string(), o.seqLen = 12, o.packEos = 3;
  const auto got = lt::train::evaluatePositions(*m.model, o);
  expectSame(got, reference(*m.model, file, 12, 3));
  EXPECT_EQ(got.buckets.back().tokens, 0);  // no document reaches position 8
  EXPECT_LT(got.tokens, 2 * 11);            // the first target after each EOS is not scored
}

TEST(LongEval, NeedlePromptHasItsLengthAndDepth) {
  const fs::path tokFile = lt::testing::npmTokenizer("tokenizer-llama3");
  ASSERT_TRUE(fs::exists(tokFile)) << "run scripts/fetch_tokenizers.sh";
  const lt::data::Tokenizer tok(tokFile.string());
  for (int64_t length : {200, 1000}) {
    for (double depth : {0.0, 0.5, 1.0}) {
      const auto ids = lt::train::needlePrompt(tok, length, depth, "48213", tok.bosId());
      EXPECT_LE(static_cast<int64_t>(ids.size()), length);
      EXPECT_GT(static_cast<int64_t>(ids.size()), length - 30);  // within one filler sentence
      EXPECT_EQ(ids.front(), tok.bosId());
      const std::string text = tok.decode(ids);
      const size_t at = text.find("The pass key is 48213");
      ASSERT_NE(at, std::string::npos);
      int before = 0, total = 0;  // filler sentences before the needle, and in all
      for (size_t i = 0; (i = text.find("The grass is green", i)) != std::string::npos; ++i) ++total, before += i < at;
      ASSERT_GT(total, 0);
      EXPECT_NEAR(static_cast<double>(before) / total, depth, 0.5 / total + 1e-12) << length << " " << depth;
      EXPECT_EQ(text.substr(text.size() - 15), "The pass key is");
    }
  }
  EXPECT_TRUE(lt::train::needleAnswered(" 48213. Remember", "48213"));
  EXPECT_FALSE(lt::train::needleAnswered(" 482130", "48213"));
  EXPECT_FALSE(lt::train::needleAnswered(" 4821", "48213"));
  EXPECT_FALSE(lt::train::needleAnswered(" none", "48213"));
}

TEST(LongEval, HeatmapHasACellPerValue) {
  lt::report::Heatmap h{"t <1>", "length", "depth", {"128", "256"}, {"0.00", "1.00"}, {{0.0, 0.5}, {1.0, 0.25}}};
  const std::string svg = lt::report::heatmapSvg(h);
  size_t cells = 0;
  for (size_t at = 0; (at = svg.find("<rect x=", at)) != std::string::npos; ++at) ++cells;
  EXPECT_EQ(cells, 4u);
  for (const char* s : {">0.50<", ">0.25<", ">256<", "t &lt;1&gt;", "hsl(120,", "hsl(0,"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;
}

}  // namespace

namespace {

// `eval --nproc 2`: the windows split over two SP ranks (Ulysses 2) give the one-process figures,
// at a length SP divides, at one it pads, and with packed documents.
TEST(LongEvalCli, TwoSequenceParallelRanksEqualOneProcess) {
  const auto dir = lt::testing::freshTempDir("longtrain_long_eval_sp");
  const fs::path file = writeTokens(dir / "t.bin", 4 * 13, 40, /*eos=*/3);
  const std::string base = std::string(LONGTRAIN_BIN) + " eval " + fixture("gqa_untied").string() + " --data " +
                           file.string() + " --dtype uint16 --json";
  for (const std::string extra : {" --seq-len 12", " --seq-len 13", " --seq-len 13 --packing documents --eos-id 3"}) {
    auto one = lt::testing::runCommand(base + extra);
    auto two = lt::testing::runCommand(base + extra + " --nproc 2");
    ASSERT_EQ(one.code, 0) << one.out;
    ASSERT_EQ(two.code, 0) << two.out;
    const json a = json::parse(one.out.substr(one.out.rfind("\n{") + 1));
    const json b = json::parse(two.out.substr(two.out.rfind("\n{") + 1));
    EXPECT_EQ(a["tokens"], b["tokens"]) << extra;
    EXPECT_NEAR(a["loss"].get<double>(), b["loss"].get<double>(), lt::testing::Tol::kSequenceParallel) << extra;
    ASSERT_EQ(a["loss_by_position"].size(), b["loss_by_position"].size()) << extra;
    for (size_t i = 0; i < a["loss_by_position"].size(); ++i)
      EXPECT_NEAR(a["loss_by_position"][i][2].get<double>(), b["loss_by_position"][i][2].get<double>(),
                  lt::testing::Tol::kSequenceParallel) << extra << " bucket " << i;
  }
  auto r = lt::testing::runCommand(base + " --seq-len 12 --nproc 2 --needle");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--needle runs in one process"), std::string::npos) << r.out;
}

}  // namespace

namespace {

// train.eval: each evaluation writes the loss by position to the metrics, and the last one is
// what `longtrain eval` measures on the final checkpoint.
TEST(LongEvalCli, TrainEvalWritesWhatEvalMeasures) {
  const auto dir = lt::testing::freshTempDir("longtrain_train_eval");
  const fs::path file = writeTokens(dir / "t.bin", 20 * 12, 40);
  const json cfg = {
      {"train_micro_batch_size_per_gpu", 2},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
      {"model", {{"vocab_size", 40}, {"hidden_size", 16}, {"num_layers", 1}, {"num_heads", 2}, {"intermediate_size", 32}}},
      {"data", {{"type", "uint16"}, {"path", file.string()}, {"seq_len", 12}, {"eval_samples", 0}}},
      {"train", {{"steps", 3}, {"eval_every", 2},
                 {"eval", {{"data", file.string()}, {"seq_len", 12}, {"windows", 3}, {"dtype", "uint16"}}},
                 {"checkpoint", {{"dir", (dir / "ckpt").string()}, {"every_steps", 3}}}}}};
  std::ofstream(dir / "cfg.json") << cfg.dump();
  const std::string bin = LONGTRAIN_BIN;
  auto r = lt::testing::runCommand(bin + " train " + (dir / "cfg.json").string() + " --metrics " +
                                   (dir / "m.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("eval-long @ step 2"), std::string::npos) << r.out;
  // No eval set (eval_samples 0): no eval line, no eval loss in the summary or the metrics.
  EXPECT_EQ(r.out.find("over 0 tokens"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("eval loss"), std::string::npos) << r.out;
  std::vector<json> lines;
  std::ifstream in(dir / "m.jsonl");
  for (std::string l; std::getline(in, l);) lines.push_back(json::parse(l));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_FALSE(lines[0].contains("eval_loss_by_position"));  // nothing for an evaluation that did not run
  EXPECT_TRUE(lines[1].contains("eval_loss_by_position"));
  for (const auto& l : lines) EXPECT_FALSE(l.contains("eval_loss")) << l.dump();
  r = lt::testing::runCommand(bin + " eval " + (dir / "ckpt").string() + " --data " + file.string() +
                              " --dtype uint16 --seq-len 12 --windows 3 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const json e = json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  EXPECT_NEAR(lines[2]["eval_long_loss"].get<double>(), e["loss"].get<double>(), 1e-9);
  EXPECT_EQ(lines[2]["eval_loss_by_position"], e["loss_by_position"]);
  // A missing file is refused before training, with the path tried.
  json bad = cfg;
  bad["train"]["eval"]["data"] = "no/such.bin";
  std::ofstream(dir / "bad.json") << bad.dump();
  r = lt::testing::runCommand(bin + " train " + (dir / "bad.json").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("'train.eval.data' = 'no/such.bin' is not a file (absolute: '"), std::string::npos) << r.out;
}

}  // namespace
