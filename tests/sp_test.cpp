// sp/: the Ulysses adapter on DeepSpeed's own example and its error cases; SP attention,
// loss and gradients equal one rank processing the whole batch (SP 2 and 4, GQA with
// kv_heads < P); the engine at SP x DP = 2 x 2 equals one rank with accumulation; the
// pipelined Ulysses path (head groups) has the bits of one group.
#include <nlohmann/json.hpp>

#include "longtrain/compile/executor.h"
#include "longtrain/core/check.h"
#include "longtrain/model/attention.h"
#include "longtrain/sp/footprint.h"
#include "longtrain/sp/ulysses.h"
#include "longtrain/config/parse.h"
#include "longtrain/config/validate.h"
#include "longtrain/train/engine.h"
#include "testing.h"

namespace {

using lt::testing::relErr;
using lt::testing::runRanks;
using lt::testing::Tol;

// A source yielding a fixed list of batches, round and round.
class ListSource : public lt::sp::BatchSource {
 public:
  explicit ListSource(std::vector<lt::data::Batch> b) : batches_(std::move(b)) {}
  lt::data::Batch next() override { return batches_[i_++ % batches_.size()]; }

 private:
  std::vector<lt::data::Batch> batches_;
  size_t i_ = 0;
};

lt::data::Batch rowBatch(std::vector<int64_t> ids) {
  lt::data::Batch b;
  int64_t s = static_cast<int64_t>(ids.size());
  b.input_ids = at::tensor(ids, at::kLong).view({1, s});
  b.labels = b.input_ids.clone();
  b.position_ids = at::arange(s, at::kLong).view({1, s});
  return b;
}

std::vector<int64_t> row(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Plain Ulysses over P ranks: contiguous shards.
lt::config::ParallelLayout ulyssesLayout(int P) {
  return lt::config::ParallelLayout::make(P, P, 4 * P, 4 * P, 1, lt::config::SpBalance::Contiguous);
}

TEST(UlyssesLoader, DeepSpeedExample) {
  runRanks(2, 2, [](int r, lt::comm::Groups& g) {
    auto sample = r == 0 ? std::vector<int64_t>{1, 10, 10, 10, 2, 2} : std::vector<int64_t>{1, 20, 20, 20, 2, 2};
    lt::sp::UlyssesLoader ul(std::make_unique<ListSource>(std::vector<lt::data::Batch>{rowBatch(sample)}), g.sp,
                             ulyssesLayout(2));
    for (int round = 0; round < 2; ++round) {  // the second gather serves the same shards again
      for (int64_t v : {10, 20}) {
        auto b = std::make_optional(ul.next());
        if (r == 0) {
          EXPECT_EQ(row(b->input_ids), (std::vector<int64_t>{1, v, v}));
          EXPECT_EQ(row(b->position_ids), (std::vector<int64_t>{0, 1, 2}));
          EXPECT_EQ(row(b->shift_labels), (std::vector<int64_t>{v, v, v}));
        } else {
          EXPECT_EQ(row(b->input_ids), (std::vector<int64_t>{v, 2, 2}));
          EXPECT_EQ(row(b->position_ids), (std::vector<int64_t>{3, 4, 5}));
          EXPECT_EQ(row(b->shift_labels), (std::vector<int64_t>{2, 2, -100}));
        }
      }
    }
  });
}

void expectAllRanksThrow(std::function<lt::data::Batch(int)> make, const std::string& needle) {
  std::vector<std::string> errs(2);
  runRanks(2, 2, [&](int r, lt::comm::Groups& g) {
    lt::sp::UlyssesLoader ul(std::make_unique<ListSource>(std::vector<lt::data::Batch>{make(r)}), g.sp,
                             ulyssesLayout(2));
    try {
      ul.next();
    } catch (const lt::Error& e) {
      errs[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errs[r].find(needle), std::string::npos) << "rank " << r << ": " << errs[r];
}

TEST(UlyssesLoader, Errors) {
  expectAllRanksThrow([](int r) {
    auto b = rowBatch({1, 2, 3, 4});
    if (r == 0) b.position_ids = at::Tensor();
    return b;
  }, "SP rank 0's batch has no 'position_ids'");
  expectAllRanksThrow([](int r) {
    auto b = rowBatch({1, 2, 3, 4});
    if (r == 1) b.labels = at::zeros({1, 6}, at::kLong);
    return b;
  }, "SP rank 1's batch: 'labels' (6) or 'position_ids' (4) length differs from 'input_ids' (4)");
  expectAllRanksThrow([](int r) {
    auto b = rowBatch({1, 2, 3, 4});
    if (r == 1) b.labels = at::Tensor();
    return b;
  }, "SP rank 1's batch has no 'labels'");
}

// A sequence that does not divide by P is padded: rank 1's 5 tokens become shards of 3, the
// padding labelled -100 (before the layout, Ulysses refused it).
TEST(UlyssesLoader, PadsALengthPDoesNotDivide) {
  runRanks(2, 2, [](int r, lt::comm::Groups& g) {
    auto sample = r == 1 ? std::vector<int64_t>{1, 2, 3, 4, 5} : std::vector<int64_t>{1, 2, 3, 4};
    lt::sp::UlyssesLoader ul(std::make_unique<ListSource>(std::vector<lt::data::Batch>{rowBatch(sample)}), g.sp,
                             ulyssesLayout(2));
    (void)ul.next();  // rank 0's batch
    auto b = ul.next();  // rank 1's: [1 2 3 | 4 5 pad]
    EXPECT_EQ(row(b.input_ids), (r == 0 ? std::vector<int64_t>{1, 2, 3} : std::vector<int64_t>{4, 5, 0}));
    EXPECT_EQ(row(b.shift_labels), (r == 0 ? std::vector<int64_t>{2, 3, 4} : std::vector<int64_t>{5, -100, -100}));
  });
}

// Pure Ulysses (ring degree 1): the head counts must allow P (DeepSpeed's rules).
TEST(Ulysses, HeadChecks) {
  auto ulysses = [](int64_t heads, int64_t kv, int P) { return lt::config::ParallelLayout::make(P, P, heads, kv, 1, lt::config::SpBalance::Auto); };
  EXPECT_NO_THROW(ulysses(8, 2, 4));  // KV replicated
  EXPECT_NO_THROW(ulysses(8, 8, 4));
  EXPECT_THROW(ulysses(6, 6, 4), lt::Error);
  EXPECT_THROW(ulysses(12, 3, 4), lt::Error);  // neither 3 % 4 nor 4 % 3
}

// The 2-layer model of the equivalence tests.
lt::model::ModelConfig smallModel(int64_t heads, int64_t kvHeads, int64_t hidden) {
  lt::model::ModelConfig mc;
  mc.vocabSize = 40;
  mc.hidden = hidden;
  mc.layers = 2;
  mc.heads = heads;
  mc.kvHeads = kvHeads;
  mc.intermediate = 40;
  return mc;
}

struct SpCase {
  int p;
  int64_t heads, kvHeads;
};

class UlyssesEquivalence : public ::testing::TestWithParam<SpCase> {};

// SP over `c.p` thread ranks with `core` as the local attention vs one rank with naive
// attention on the whole batch: loss and every gradient.
void checkSpEquivalence(const SpCase& c, const lt::model::AttentionFn& core) {
  at::set_num_threads(1);
  const auto mc = smallModel(c.heads, c.kvHeads, 32);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  lt::data::Batch whole;
  whole.input_ids = at::randint(mc.vocabSize, {2, 16}, gen, at::kLong);
  whole.labels = whole.input_ids.clone();
  whole.labels.index_put_({0, at::indexing::Slice(0, 5)}, -100);
  whole.position_ids = at::arange(16, at::kLong).unsqueeze(0).expand({2, 16}).contiguous();
  whole.shift_labels = lt::data::shiftLabels(whole.labels);
  const double count = whole.shift_labels.ne(-100).sum().item<double>();

  // Reference: one rank, whole batch.
  lt::model::Model ref(mc, 3);
  lt::compile::Executor rex(ref, lt::model::causalAttention, {});
  lt::compile::RunOptions ro;
  ro.lossDenominator = count;
  auto rst = rex.run(lt::compile::baseProgram(ref.numBlocks()), whole, ro);

  runRanks(c.p, c.p, [&](int r, lt::comm::Groups& g) {
    lt::model::Model m(mc, 3);
    lt::compile::Executor ex(m, lt::sp::ulyssesAttention(g.sp, core), {});
    auto shard = lt::sp::shardBatch(whole, r, ulyssesLayout(c.p));
    auto st = ex.run(lt::compile::baseProgram(m.numBlocks()), shard, ro);
    auto loss = at::tensor({st.lossSum}, at::kDouble);
    g.sp->allReduce(loss).wait();
    EXPECT_LE(std::abs(loss.item<double>() - rst.lossSum) / rst.lossSum, Tol::kSequenceParallel);
    auto params = m.parameters(), refParams = ref.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto grad = params[i].grad().clone();
      g.sp->allReduce(grad).wait();  // SP ranks hold partial gradients of every parameter
      EXPECT_LE(relErr(grad, refParams[i].grad()), Tol::kSequenceParallel) << "rank " << r << " parameter " << i;
    }
  });
}

TEST_P(UlyssesEquivalence, LossAndGradientsMatchOneRank) { checkSpEquivalence(GetParam(), lt::model::causalAttention); }

TEST(UlyssesEquivalenceChunked, ChunkedAttentionInsideSpMatchesOneRank) {
  // Chunk 3 does not divide the 16-token sequence.
  auto chunked = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos) {
    return lt::model::chunkedAttention(q, k, v, 3, pos);
  };
  checkSpEquivalence(SpCase{2, 4, 2}, chunked);
  checkSpEquivalence(SpCase{4, 8, 2}, chunked);
}

INSTANTIATE_TEST_SUITE_P(Degrees, UlyssesEquivalence,
                         ::testing::Values(SpCase{2, 4, 4}, SpCase{2, 4, 2}, SpCase{4, 4, 4},
                                           SpCase{4, 8, 2} /* kv_heads < P: replicated */),
                         [](const ::testing::TestParamInfo<SpCase>& i) {
                           return "P" + std::to_string(i.param.p) + "_H" + std::to_string(i.param.heads) + "_KV" +
                                  std::to_string(i.param.kvHeads);
                         });

TEST(UlyssesEngine, SpTimesDpEqualsOneRank) {
  at::set_num_threads(1);
  auto cfg = lt::testing::tinyTrainConfig();
  cfg["gradient_clipping"] = 0.5;
  // Adam's eps at 1e-6, not 1e-8: with 1e-8 a few LM-head elements whose gradient is ~1e-8
  // step by ~lr x (g / |g|), so their last-bit differences (summation order across ranks) move
  // the parameter by up to 2.5e-4 of the tensor's scale (measured: 1.7e-4 with naive attention,
  // 2.54e-4 with the fused kernel). At 1e-6 the same runs agree to 1.5e-5.
  cfg["optimizer"]["params"]["eps"] = 1e-6;
  cfg["data"]["eval_samples"] = 8;
  auto ref = cfg;
  ref["gradient_accumulation_steps"] = 2;
  const auto expect = lt::testing::trainOnRanks(ref, 1, 1, 3)[0];
  for (int world : {2, 4}) {  // SP 2 x DP 1 (with accumulation 2), and SP 2 x DP 2
    auto c = cfg;
    c["sequence_parallel_size"] = 2;
    if (world == 2) c["gradient_accumulation_steps"] = 2;
    const auto got = lt::testing::trainOnRanks(c, world, 2, 3);
    for (int r = 0; r < world; ++r) {
      for (int s = 0; s < 3; ++s)
        EXPECT_LE(std::abs(got[r].losses[s] - expect.losses[s]) / expect.losses[s], Tol::kSequenceParallel)
            << "step " << s;
      EXPECT_LE(std::abs(got[r].evalLoss - expect.evalLoss) / expect.evalLoss, Tol::kSequenceParallel);
      for (size_t i = 0; i < expect.params.size(); ++i)
        EXPECT_LE(relErr(got[r].params[i], expect.params[i]), Tol::kAfterAdamSteps)
            << "world " << world << " rank " << r << " parameter " << i;
    }
  }
}

// ---------------------------------------------------------------------------- head groups
struct PipelineCase {
  int64_t heads, kvHeads;
  bool packed;         // documents restarting mid-shard and across the shard boundary
  int64_t window;      // model.sliding_window
  std::vector<int> groups;  // G > 1 to compare with G = 1
};

struct RankResult {
  double lossSum = 0;
  std::vector<at::Tensor> grads;  // this rank's (partial) gradient of every parameter
};

lt::model::ModelConfig pipelineModel(const PipelineCase& c) {
  auto mc = smallModel(c.heads, c.kvHeads, 64);
  mc.slidingWindow = c.window;
  mc.attention = lt::config::AttentionKernel::Fused;
  mc.attentionChunk = 8;  // several query and key tiles per head over the 32 tokens
  return mc;
}

lt::data::Batch pipelineBatch(const PipelineCase& c, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  lt::data::Batch whole;
  whole.input_ids = at::randint(vocab, {2, 32}, gen, at::kLong);
  whole.labels = whole.input_ids.clone();
  whole.labels.index_put_({1, at::indexing::Slice(0, 3)}, -100);
  whole.position_ids = at::arange(32, at::kLong).unsqueeze(0).repeat({2, 1});
  if (c.packed) {  // row 0: documents of 7, 13 (over the boundary at 16) and 12; row 1: 20 and 12
    using at::indexing::Slice;
    whole.position_ids.index_put_({0, Slice(7, 20)}, at::arange(13, at::kLong));
    whole.position_ids.index_put_({0, Slice(20, 32)}, at::arange(12, at::kLong));
    whole.position_ids.index_put_({1, Slice(20, 32)}, at::arange(12, at::kLong));
  }
  whole.shift_labels = lt::data::shiftLabels(whole.labels);
  return whole;
}

// Ulysses over 2 thread ranks with the fused core split into `groups` head groups (1: the
// unpipelined all-to-alls around model::attentionCore).
std::vector<RankResult> runUlysses(const PipelineCase& c, const lt::data::Batch& whole, int groups, double count) {
  const auto mc = pipelineModel(c);
  std::vector<RankResult> out(2);
  runRanks(2, 2, [&](int r, lt::comm::Groups& g) {
    lt::model::Model m(mc, 3);
    auto attn = lt::sp::ulyssesAttention(g.sp, lt::model::attentionCore(mc), lt::sp::ulyssesPipeline(mc, groups));
    lt::compile::Executor ex(m, attn, {});
    lt::compile::RunOptions ro;
    ro.lossDenominator = count;
    out[r].lossSum = ex.run(lt::compile::baseProgram(m.numBlocks()), lt::sp::shardBatch(whole, r, ulyssesLayout(2)), ro)
                         .lossSum;
    for (const auto& p : m.parameters()) out[r].grads.push_back(p.grad().clone());
  });
  return out;
}

// Loss and every gradient, element by element: pipelined (each G) bit-identical to G = 1,
// because the fused kernel computes each head (and each kv head's gradients) on its own, so
// cutting the heads into groups changes no operation's operands or order; and within
// Tol::kSequenceParallel of one rank with the same fused core on the whole batch.
void checkPipelined(const PipelineCase& c) {
  at::set_num_threads(1);
  const auto mc = pipelineModel(c);
  const auto whole = pipelineBatch(c, mc.vocabSize);
  const double count = whole.shift_labels.ne(-100).sum().item<double>();
  lt::model::Model ref(mc, 3);
  lt::compile::Executor rex(ref, lt::model::attentionCore(mc), {});
  lt::compile::RunOptions ro;
  ro.lossDenominator = count;
  const double refLoss = rex.run(lt::compile::baseProgram(ref.numBlocks()), whole, ro).lossSum;

  const auto base = runUlysses(c, whole, 1, count);
  for (int groups : c.groups) {
    const auto got = runUlysses(c, whole, groups, count);
    EXPECT_LE(std::abs(got[0].lossSum + got[1].lossSum - refLoss) / refLoss, Tol::kSequenceParallel);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(got[r].lossSum, base[r].lossSum) << "G " << groups << " rank " << r;
      for (size_t i = 0; i < base[r].grads.size(); ++i)
        EXPECT_TRUE(at::equal(got[r].grads[i], base[r].grads[i]))
            << "G " << groups << " rank " << r << " parameter " << i;
    }
    const auto params = ref.parameters();
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_LE(relErr(got[0].grads[i] + got[1].grads[i], params[i].grad()), Tol::kSequenceParallel)
          << "G " << groups << " parameter " << i;
  }
}

TEST(UlyssesHeadGroups, GqaTwoGroupsMatchOneGroup) {
  checkPipelined({/*heads=*/8, /*kvHeads=*/4, false, 0, {2}});  // 2 kv heads a rank: G = 2 is all of them
}

TEST(UlyssesHeadGroups, GqaEveryKvHeadItsOwnGroup) {
  checkPipelined({16, 8, false, 0, {2, 4}});  // 4 kv heads a rank, 2 query heads each
}

TEST(UlyssesHeadGroups, PackedDocumentsAndWindow) {
  checkPipelined({16, 8, true, 0, {2, 4}});
  checkPipelined({8, 4, true, 6, {2}});
}

// kv_heads < P: each rank holds one replicated kv head, which no group boundary can split.
TEST(UlyssesHeadGroups, ReplicatedKvHeadsStayOneGroup) {
  auto cfg = lt::testing::tinyTrainConfig();  // 4 heads, 2 kv heads
  cfg["sequence_parallel_size"] = 4;
  const auto parsed = lt::config::parseConfig(cfg, 4);
  EXPECT_EQ(lt::config::ulyssesHeadGroups(parsed, parsed.layout), 1);
  cfg["sequence_parallel_ulysses_head_groups"] = 2;
  EXPECT_NE(lt::testing::errorOf([&] { lt::config::parseConfig(cfg, 4); })
                .find("sequence_parallel_ulysses_head_groups=2 does not divide the 1 kv heads each Ulysses rank holds"),
            std::string::npos);
  // The attention function refuses it too, naming the key.
  PipelineCase c{8, 2, false, 0, {}};
  const auto mc = pipelineModel(c);
  std::vector<std::string> errs(4);
  runRanks(4, 4, [&](int r, lt::comm::Groups& g) {
    auto attn = lt::sp::ulyssesAttention(g.sp, lt::model::attentionCore(mc), lt::sp::ulyssesPipeline(mc, 2));
    auto q = at::randn({1, 4, 8, 8}), kv = at::randn({1, 4, 2, 8});
    errs[r] = lt::testing::errorOf([&] { attn(q, kv, kv, at::Tensor()); });
  });
  for (const auto& e : errs) EXPECT_NE(e.find("sequence_parallel_ulysses_head_groups"), std::string::npos) << e;
}

TEST(UlyssesHeadGroups, ConfigResolvesAndChecks) {
  auto cfg = lt::testing::tinyTrainConfig();
  cfg["model"]["num_heads"] = 8;
  cfg["model"]["num_kv_heads"] = 4;
  cfg["sequence_parallel_size"] = 2;
  auto groups = [](const nlohmann::json& j) {
    const auto c = lt::config::parseConfig(j, 2);
    return lt::config::ulyssesHeadGroups(c, c.layout);
  };
  EXPECT_EQ(groups(cfg), 2);  // "auto": 2 kv heads a rank
  cfg["sequence_parallel_ulysses_head_groups"] = 1;
  EXPECT_EQ(groups(cfg), 1);
  cfg["sequence_parallel_ulysses_head_groups"] = 3;
  EXPECT_NE(lt::testing::errorOf([&] { groups(cfg); }).find("choose a divisor of 2, or \"auto\""), std::string::npos);
  cfg["sequence_parallel_ulysses_head_groups"] = "two";
  EXPECT_NE(lt::testing::errorOf([&] { groups(cfg); }).find("must be an integer or \"auto\", got \"two\""),
            std::string::npos);
  cfg["sequence_parallel_ulysses_head_groups"] = "auto";
  cfg["model"]["attention"] = "chunked";  // no fused kernel to run per group: unpipelined
  EXPECT_EQ(groups(cfg), 1);
}

// Through the engine: "auto" (2 groups at 4 kv heads over SP 2) trains to the bits of 1 group.
TEST(UlyssesHeadGroups, EngineAutoEqualsOneGroup) {
  at::set_num_threads(1);
  auto cfg = lt::testing::tinyTrainConfig();
  cfg["model"]["num_kv_heads"] = 4;
  cfg["sequence_parallel_size"] = 2;
  auto one = cfg;
  one["sequence_parallel_ulysses_head_groups"] = 1;
  const auto expect = lt::testing::trainOnRanks(one, 2, 2, 3);
  const auto got = lt::testing::trainOnRanks(cfg, 2, 2, 3);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].losses, expect[r].losses);
    for (size_t i = 0; i < expect[r].params.size(); ++i)
      EXPECT_TRUE(at::equal(got[r].params[i], expect[r].params[i])) << "rank " << r << " parameter " << i;
  }
}

// `longtrain plan`'s declaration: the pipeline saves what the unpipelined kernel saves (per
// group, the same tensors), and its per-group buffers shrink with G.
TEST(UlyssesHeadGroups, PlanDeclaresThePipeline) {
  auto cfg = lt::testing::tinyTrainConfig();
  cfg["model"]["num_heads"] = 8;
  cfg["model"]["num_kv_heads"] = 8;
  cfg["sequence_parallel_size"] = 2;
  lt::StepShape s;
  s.batch = 1, s.seq = 4096, s.tokens = 2048, s.sp = 2, s.ulysses = 2;
  s.heads = 8, s.kvHeads = 8, s.headDim = 16, s.hidden = 128;
  auto footprint = [&](int groups) {
    auto j = cfg;
    j["sequence_parallel_ulysses_head_groups"] = groups;
    return lt::sp::attentionFootprint(lt::config::parseConfig(j, 2), s);
  };
  const auto one = footprint(1), two = footprint(2), four = footprint(4);
  EXPECT_EQ(two.saved.total(), one.saved.total());
  EXPECT_EQ(four.saved.total(), one.saved.total());
  EXPECT_LT(four.work.total(), two.work.total());
  EXPECT_EQ(two.work.total(), lt::sp::ulyssesPipelineFootprint(s, 2).work.total());
}

}  // namespace
