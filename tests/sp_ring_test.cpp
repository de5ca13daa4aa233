// sp/ring_attention and sp/layout: ring-only (U = 1) and Ulysses x ring (U = 2, R = 2) on 4
// thread ranks, with and without zigzag, GQA and packed documents, and an odd sequence length
// (padded and masked): loss and every gradient equal one rank on the whole sequence. Also the
// U x R choice and its errors, the engine under ZeRO-3 at P = 4 on a 2-head model, and the CLI
// at --nproc 4 against --nproc 1.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/compile/executor.h"
#include "longtrain/core/check.h"
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/model/model.h"
#include "longtrain/sp/layout.h"
#include "longtrain/sp/ring_attention.h"
#include "testing.h"

namespace {

using lt::testing::relErr;
using lt::testing::runRanks;
using lt::testing::Tol;

struct RingCase {
  int p, ring;
  int64_t heads, kvHeads;
  std::string balance;  // "contiguous" | "zigzag"
  bool packed = false;
  int64_t seqLen = 16;
  int64_t window = 0;  // Mistral's sliding window (0: none)
};

std::string caseName(const RingCase& c) {
  return "P" + std::to_string(c.p) + "_R" + std::to_string(c.ring) + "_H" + std::to_string(c.heads) + "_KV" +
         std::to_string(c.kvHeads) + "_" + c.balance + (c.packed ? "_packed" : "") + "_S" +
         std::to_string(c.seqLen) + (c.window ? "_W" + std::to_string(c.window) : "");
}

lt::model::ModelConfig ringModel(const RingCase& c) {
  lt::model::ModelConfig mc;
  mc.vocabSize = 40;
  mc.hidden = 16 * c.heads;
  mc.layers = 2;
  mc.heads = c.heads;
  mc.kvHeads = c.kvHeads;
  mc.intermediate = 40;
  mc.resolved.packedDocuments = c.packed;
  if (c.window > 0) mc.modelType = lt::config::ModelType::Mistral, mc.slidingWindow = c.window;
  return mc;
}

// Two rows; with packing, documents of random lengths (positions restart at 0 after each).
lt::data::Batch wholeBatch(const RingCase& c, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const int64_t S = c.seqLen;
  lt::data::Batch b;
  b.input_ids = at::randint(vocab, {2, S}, gen, at::kLong);
  b.labels = b.input_ids.clone();
  b.labels.index_put_({0, at::indexing::Slice(0, 3)}, -100);
  b.position_ids = at::arange(S, at::kLong).unsqueeze(0).repeat({2, 1});
  if (c.packed) {
    auto* p = b.position_ids.data_ptr<int64_t>();
    for (int64_t r = 0; r < 2; ++r) {
      int64_t pos = 0;
      for (int64_t s = 0; s < S; ++s) {
        if (s > 0 && (s * 7 + r * 3) % 5 == 0) pos = 0;  // a document starts here
        p[r * S + s] = pos++;
      }
    }
  }
  b.shift_labels = lt::data::shiftLabels(b.labels);
  if (c.packed) {  // the cross-document target is not scored (data::collate's rule)
    auto next = b.position_ids.slice(1, 1).eq(0);
    b.shift_labels.slice(1, 0, S - 1).masked_fill_(next, -100);
  }
  return b;
}

struct Measured {
  double loss = 0, grad = 0;  // max relative differences over ranks and parameters
};

Measured checkRing(const RingCase& c) {
  at::set_num_threads(1);
  const auto mc = ringModel(c);
  const auto whole = wholeBatch(c, mc.vocabSize);
  lt::compile::RunOptions ro;
  ro.lossDenominator = whole.shift_labels.ne(-100).sum().item<double>();
  lt::model::Model ref(mc, 3);
  lt::model::AttentionFn naive = [w = c.window](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const at::Tensor& pos) {
    return lt::model::slidingWindowAttention(q, k, v, pos, w);
  };
  lt::compile::Executor rex(ref, naive, {});
  const auto rst = rex.run(lt::compile::baseProgram(ref.numBlocks()), whole, ro);

  const auto layout = lt::config::ParallelLayout::make(c.p, c.p, c.heads, c.kvHeads, c.ring, *lt::config::optionFromName<lt::config::SpBalance>(c.balance));
  EXPECT_EQ(layout.R, c.ring);
  std::vector<Measured> seen(c.p);
  runRanks(c.p, c.p, [&](int r, lt::comm::Groups& g) {
    lt::model::Model m(mc, 3);
    // Blocks of 3: tiles that straddle shard, chunk and document boundaries.
    auto attn = lt::sp::sequenceParallelAttention(g.spUlysses, g.spRing, layout, r, lt::model::attentionCore(mc), 3,
                                                  nullptr, c.window);
    lt::compile::Executor ex(m, attn, {});
    auto st = ex.run(lt::compile::baseProgram(m.numBlocks()), lt::sp::shardBatch(whole, r, layout), ro);
    auto loss = at::tensor({st.lossSum}, at::kDouble);
    g.sp->allReduce(loss).wait();
    seen[r].loss = std::abs(loss.item<double>() - rst.lossSum) / rst.lossSum;
    auto params = m.parameters(), refParams = ref.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto grad = params[i].grad().clone();
      g.sp->allReduce(grad).wait();  // SP ranks hold partial gradients of every parameter
      seen[r].grad = std::max(seen[r].grad, relErr(grad, refParams[i].grad()));
    }
  }, std::chrono::milliseconds(30000), layout.R);
  Measured worst;
  for (const auto& s : seen) worst.loss = std::max(worst.loss, s.loss), worst.grad = std::max(worst.grad, s.grad);
  std::printf("[ring] %s (%s): loss %.2e, gradients %.2e\n", caseName(c).c_str(), layout.describe().c_str(),
              worst.loss, worst.grad);
  return worst;
}

class RingEquivalence : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingEquivalence, LossAndEveryGradientMatchOneRank) {
  const auto m = checkRing(GetParam());
  EXPECT_LE(m.loss, Tol::kSequenceParallel);
  EXPECT_LE(m.grad, Tol::kSequenceParallel);
}

std::vector<RingCase> ringCases() {
  std::vector<RingCase> out;
  for (int ring : {4, 2})  // ring only (U = 1), hybrid U = 2 x R = 2
    for (int64_t heads : {2, 4})
      for (int64_t kv : {1, 2})
        for (const char* balance : {"contiguous", "zigzag"}) out.push_back({4, ring, heads, kv, balance});
  out.push_back({4, 4, 2, 1, "zigzag", true});      // packed documents crossing shards
  out.push_back({4, 2, 4, 2, "zigzag", true});
  out.push_back({4, 2, 4, 2, "contiguous", true});
  out.push_back({2, 2, 2, 2, "zigzag", false, 127});  // odd length: padded to 128
  out.push_back({2, 1, 2, 2, "contiguous", false, 127});  // Ulysses only, padded to 128
  out.push_back({2, 2, 2, 1, "contiguous", true, 127});
  // Sliding windows by global index: below, across and beyond the blocks of 3 and the shards.
  out.push_back({4, 4, 2, 1, "zigzag", false, 16, 3});
  out.push_back({4, 2, 4, 2, "zigzag", true, 16, 5});
  out.push_back({2, 2, 2, 1, "contiguous", true, 127, 7});
  out.push_back({2, 1, 2, 2, "contiguous", false, 127, 20});  // Ulysses only: the local core's window
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingEquivalence, ::testing::ValuesIn(ringCases()),
                         [](const ::testing::TestParamInfo<RingCase>& i) { return caseName(i.param); });

TEST(SpLayout, ChoosesTheLargestUlyssesDegreeTheHeadsAllow) {
  auto l = lt::config::ParallelLayout::make(8, 8, 4, 4, 0, lt::config::SpBalance::Auto);
  EXPECT_EQ(l.U, 4);
  EXPECT_EQ(l.R, 2);
  EXPECT_TRUE(l.zigzag);  // auto: zigzag when R > 1
  l = lt::config::ParallelLayout::make(4, 4, 8, 2, 0, lt::config::SpBalance::Auto);  // kv heads replicated
  EXPECT_EQ(l.U, 4);
  EXPECT_FALSE(l.zigzag);
  l = lt::config::ParallelLayout::make(6, 6, 4, 4, 0, lt::config::SpBalance::Auto);  // 6 = U 2 x R 3
  EXPECT_EQ(l.U, 2);
  EXPECT_EQ(l.R, 3);
  l = lt::config::ParallelLayout::make(4, 4, 2, 2, 0, lt::config::SpBalance::Contiguous);
  EXPECT_EQ(l.R, 2);
  EXPECT_FALSE(l.zigzag);
  EXPECT_EQ(l.describe(), "Ulysses 2 x ring 2, contiguous");
}

TEST(SpLayout, ErrorsNameTheKeyTheValueAndTheFix) {
  auto err = lt::testing::errorOf([] { lt::config::ParallelLayout::make(4, 4, 4, 4, 3, lt::config::SpBalance::Auto); });
  EXPECT_NE(err.find("sequence_parallel_ring_degree=3 does not divide sequence_parallel_size=4; choose one of: 1, 2, 4"),
            std::string::npos)
      << err;
  err = lt::testing::errorOf([] { lt::config::ParallelLayout::make(4, 4, 2, 2, 1, lt::config::SpBalance::Auto); });
  EXPECT_NE(err.find("sequence_parallel_ring_degree=1 leaves a Ulysses degree 4"), std::string::npos) << err;
  EXPECT_NE(err.find("choose one of: 2, 4"), std::string::npos) << err;
}

TEST(SpLayout, ZigzagHoldsChunksRAndTwoPMinusOneMinusR) {
  lt::config::ParallelLayout l;
  l.P = 2, l.U = 1, l.R = 2, l.zigzag = true;
  auto idx = lt::sp::tokenIndex(l, 0, 4);  // chunks 0 and 3 of 4 chunks of 2
  EXPECT_TRUE(at::equal(idx, at::tensor({0, 1, 6, 7}, at::kLong)));
  EXPECT_TRUE(at::equal(lt::sp::tokenIndex(l, 1, 4), at::tensor({2, 3, 4, 5}, at::kLong)));
  EXPECT_EQ(l.paddedLength(127), 128);
  EXPECT_EQ(l.paddedLength(5), 8);
  lt::data::Batch b;
  b.input_ids = at::arange(1, 6, at::kLong).unsqueeze(0);
  b.labels = b.input_ids.clone();
  b.position_ids = at::arange(5, at::kLong).unsqueeze(0);
  auto s0 = lt::sp::shardBatch(b, 0, l);
  EXPECT_TRUE(at::equal(s0.input_ids, at::tensor({1, 2, 0, 0}, at::kLong).unsqueeze(0)));
  EXPECT_TRUE(at::equal(s0.shift_labels, at::tensor({2, 3, -100, -100}, at::kLong).unsqueeze(0)));
  auto s1 = lt::sp::shardBatch(b, 1, l);
  EXPECT_TRUE(at::equal(s1.shift_labels, at::tensor({4, 5, -100, -100}, at::kLong).unsqueeze(0)));
  EXPECT_TRUE(at::equal(s1.position_ids, at::tensor({2, 3, 4, 0}, at::kLong).unsqueeze(0)));
}

// The engine at P = 4 on a 2-head model (U 2 x R 2, zigzag) with ZeRO-3, and ring-only with an
// odd seq_len, against one rank: losses over 3 steps and the parameters after them.
// RingInputs::bf16 puts the ring kernel's tile products in bf16, as bf16.attention does the local
// core's: within bf16's rounding of fp32, and not the fp32 bits (so bf16 did run). On 2 thread
// ranks, contiguous shards, GQA 4 / 2. Skipped where the CPU has no AVX512_BF16.
TEST(RingBf16, TileProductsInBf16StayWithinBf16Rounding) {
  if (!lt::kernels::fusedAttentionBf16Supported()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  at::set_num_threads(1);
  const int64_t n = 40, H = 4, KV = 2, D = 32;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  auto q = at::randn({1, 2 * n, H, D}, gen), k = at::randn({1, 2 * n, KV, D}, gen), v = at::randn({1, 2 * n, KV, D}, gen);
  std::vector<at::Tensor> fp32(2), bf16(2);
  lt::testing::runRanks(2, 2, [&](int r, lt::comm::Groups& g) {
    lt::sp::RingInputs in;
    in.queryIndex = at::arange(r * n, (r + 1) * n, at::kLong);
    in.keyIndex = at::arange(2 * n, at::kLong);
    in.ring = g.spRing.get();
    in.chunk = 16;
    auto mine = [&](const at::Tensor& x) { return x.slice(1, r * n, (r + 1) * n).contiguous(); };
    fp32[r] = lt::sp::ringAttention(mine(q), mine(k), mine(v), in);
    in.bf16 = true;
    bf16[r] = lt::sp::ringAttention(mine(q), mine(k), mine(v), in);
  }, std::chrono::milliseconds(30000), 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(relErr(bf16[r], fp32[r]), Tol::kBf16Attention) << "rank " << r;
    EXPECT_FALSE(at::equal(bf16[r], fp32[r])) << "rank " << r << ": the bf16 products did not run";
  }
}

TEST(RingEngine, HybridWithZero3AndOddLengthMatchOneRank) {
  at::set_num_threads(1);
  auto cfg = lt::testing::tinyTrainConfig();
  cfg["model"]["num_heads"] = 2;
  cfg["model"]["num_kv_heads"] = 1;
  cfg["optimizer"]["params"]["eps"] = 1e-6;  // see UlyssesEngine.SpTimesDpEqualsOneRank
  cfg["data"]["eval_samples"] = 4;
  for (int odd : {0, 1}) {
    auto ref = cfg;
    if (odd) ref["data"]["seq_len"] = 31;
    const auto expect = lt::testing::trainOnRanks(ref, 1, 1, 3)[0];
    auto c = ref;
    c["sequence_parallel_size"] = 4;
    if (odd) c["sequence_parallel_ring_degree"] = 4;
    else c["zero_optimization"] = {{"stage", 3}};
    const auto got = lt::testing::trainOnRanks(c, 4, 4, 3);
    double worstLoss = 0, worstParam = 0;
    for (int r = 0; r < 4; ++r) {
      for (int s = 0; s < 3; ++s)
        worstLoss = std::max(worstLoss, std::abs(got[r].losses[s] - expect.losses[s]) / expect.losses[s]);
      worstLoss = std::max(worstLoss, std::abs(got[r].evalLoss - expect.evalLoss) / expect.evalLoss);
      for (size_t i = 0; i < expect.params.size(); ++i)
        worstParam = std::max(worstParam, relErr(got[r].params[i], expect.params[i]));
    }
    std::printf("[ring] engine %s: losses %.2e, parameters after 3 steps %.2e\n",
                odd ? "ring 4, seq_len 31" : "U2 x R2 zigzag, ZeRO-3", worstLoss, worstParam);
    EXPECT_LE(worstLoss, Tol::kSequenceParallel);
    EXPECT_LE(worstParam, Tol::kAfterAdamSteps);
  }
}

// Through the CLI: 4 processes, SP 4 on a 2-head model (beyond the head count: U 2 x R 2,
// zigzag) train 10 steps with the losses of one process.
TEST(RingCli, FourProcessesOnATwoHeadModelMatchOne) {
  auto j = lt::testing::tinyTrainConfig();
  j["model"]["num_heads"] = 2;
  j["model"]["num_kv_heads"] = 2;
  j["data"]["eval_samples"] = 0;
  j["train"] = {{"steps", 10}, {"threads", 1}, {"comm_timeout_s", 20}};
  const std::string dir = "longtrain_ring_cli_" + std::to_string(getpid());
  const auto cfg = lt::testing::writeJsonFile(dir, "ring.json", j);
  const auto at = cfg.parent_path();
  auto losses = [](const std::filesystem::path& p) {
    std::vector<double> v;
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return v;
  };
  const std::string bin = LONGTRAIN_BIN;
  auto one = lt::testing::runCommand(bin + " train " + cfg.string() + " --nproc 1 --metrics " + (at / "one.jsonl").string());
  ASSERT_EQ(one.code, 0) << one.out;
  auto four = lt::testing::runCommand(bin + " train " + cfg.string() +
                                      " --nproc 4 --set sequence_parallel_size=4 --metrics " + (at / "four.jsonl").string());
  ASSERT_EQ(four.code, 0) << four.out;
  EXPECT_NE(four.out.find("sp=4: Ulysses 2 x ring 2, zigzag"), std::string::npos) << four.out;
  const auto a = losses(at / "one.jsonl"), b = losses(at / "four.jsonl");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / a[i]);
  std::printf("[ring] CLI --nproc 4 sp 4 (U2 x R2) vs --nproc 1: worst relative loss difference over 10 steps %.2e\n",
              worst);
  EXPECT_LE(worst, 1e-4);
  std::filesystem::remove_all(at);
}

// Saved at SP 4 = U2 x R2 (zigzag) after 2 steps, resumed in fresh engines at the same layout
// (bit-exact: the same ops in the same order) and at U1 x R4 (the parameters and the data
// stream do not depend on U x R: within the SP tolerance of the uninterrupted run).
TEST(RingResume, SameLayoutIsBitExactAndAnotherUxRStaysWithinTolerance) {
  at::set_num_threads(1);
  auto j = lt::testing::tinyTrainConfig();
  j["model"]["num_heads"] = 2;
  j["model"]["num_kv_heads"] = 2;
  j["sequence_parallel_size"] = 4;
  j["gradient_accumulation_steps"] = 3;  // a checkpoint falls mid-gather of the SP loader
  const int k = 2, n = 4;
  const auto ref = lt::testing::trainOnRanks(j, 4, 4, n)[0];
  const auto root = lt::testing::freshTempDir("longtrain_ring_resume_" + std::to_string(getpid()));
  auto run = [&](const nlohmann::json& cfg, bool save) {
    const auto c = lt::config::parseConfig(cfg, 4);
    std::vector<double> losses;
    runRanks(4, 4, [&](int r, lt::comm::Groups& g) {
      lt::train::Engine e(c, g);
      if (save) {
        for (int s = 0; s < k; ++s) e.step();
        lt::ckpt::save(e, root.string(), 0);
        return;
      }
      lt::ckpt::load(e, lt::ckpt::Checkpoint(lt::ckpt::resolve(root.string(), "--resume")));
      for (int s = k; s < n; ++s) {
        const double loss = e.step().loss;
        if (r == 0) losses.push_back(loss);
      }
    }, std::chrono::milliseconds(30000), c.layout.R);
    return losses;
  };
  run(j, true);
  const auto same = run(j, false);
  ASSERT_EQ(same.size(), static_cast<size_t>(n - k));
  for (int s = k; s < n; ++s) EXPECT_EQ(same[s - k], ref.losses[s]) << "step " << s + 1;
  auto ring4 = j;
  ring4["sequence_parallel_ring_degree"] = 4;
  const auto other = run(ring4, false);
  double worst = 0;
  for (int s = k; s < n; ++s) worst = std::max(worst, std::abs(other[s - k] - ref.losses[s]) / ref.losses[s]);
  // The losses are fp32 sums: equal ones are common, the gradients differ in their last bits.
  std::printf("[ring] resume U2 x R2 -> U1 x R4: worst relative loss difference %.2e\n", worst);
  EXPECT_LE(worst, Tol::kSequenceParallel);
  std::filesystem::remove_all(root);
}

}  // namespace
