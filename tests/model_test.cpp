// model/ + compile/: the block-checkpointed step program gives the same loss and gradients
// as plain autograd over the whole model (fp32).
#include <nlohmann/json.hpp>

#include "longtrain/compile/executor.h"
#include "longtrain/compile/passes.h"
#include "longtrain/compile/program.h"
#include "longtrain/data/data.h"
#include "longtrain/model/attention.h"
#include "longtrain/model/model.h"
#include "testing.h"

namespace {

using lt::testing::relErr;
using lt::testing::Tol;

lt::data::Batch makeBatch(int64_t b, int64_t s, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  lt::data::Batch out;
  out.input_ids = at::randint(vocab, {b, s}, gen, at::kLong);
  out.labels = out.input_ids.clone();
  out.labels.index_put_({at::indexing::Slice(), at::indexing::Slice(0, s / 3)}, -100);  // some ignored
  out.position_ids = at::arange(s, at::kLong).unsqueeze(0).expand({b, s}).contiguous();
  out.shift_labels = lt::data::shiftLabels(out.labels);
  return out;
}

TEST(StepProgram, CheckpointedEqualsPlainAutograd) {
  at::set_num_threads(1);
  for (bool tied : {false, true}) {
    lt::model::ModelConfig mc;
    mc.vocabSize = 50;
    mc.hidden = 32;
    mc.layers = 3;
    mc.heads = 4;
    mc.kvHeads = 2;  // grouped-query attention
    mc.intermediate = 48;
    mc.tieEmbeddings = tied;
    lt::model::Model m(mc, 7);
    auto batch = makeBatch(2, 70, mc.vocabSize, 3);  // 70 tokens over hidden 32: 3 MLP shards

    // Reference: one autograd graph over the whole model.
    auto ls = lt::model::lossSum(m.forward(batch.input_ids, batch.position_ids, lt::model::causalAttention),
                                 batch.shift_labels);
    auto refLoss = ls.sum.item<double>() / ls.count;
    (ls.sum / static_cast<double>(ls.count)).backward();
    std::vector<at::Tensor> refGrads;
    for (auto& p : m.parameters()) {
      refGrads.push_back(p.grad().clone());
      p.grad().zero_();
    }

    // Untiled, then tiled (logits-loss tiles of 5 tokens do not divide S = 70; tiled MLP).
    for (int64_t lossChunk : {0, 5}) {
      mc.lossChunk = lossChunk;
      mc.tiledMlp = lossChunk > 0;
      lt::model::Model mt(mc, 7);
      lt::compile::Executor ex(mt, lt::model::causalAttention, {});
      lt::compile::RunOptions ro;
      ro.lossDenominator = static_cast<double>(ls.count);
      auto st = ex.run(lt::compile::baseProgram(mt.numBlocks()), batch, ro);
      EXPECT_EQ(st.tokens, ls.count);
      EXPECT_LE(std::abs(st.lossSum / ls.count - refLoss) / refLoss, Tol::kCheckpointedVsPlain);
      auto params = mt.parameters();
      for (size_t i = 0; i < params.size(); ++i)
        EXPECT_LE(relErr(params[i].grad(), refGrads[i]), Tol::kCheckpointedVsPlain)
            << "parameter " << i << " loss_chunk " << lossChunk;
    }
  }
}

TEST(StepProgram, BaseListing) {
  auto p = lt::compile::baseProgram(2);
  EXPECT_EQ(p.listing(),
            "Embed(3)\nForward(0)\nForward(1)\nLossAndGrad(2)\nReduceGrads(2)\nRecomputeBackward(1)\n"
            "ReduceGrads(1)\nRecomputeBackward(0)\nReduceGrads(0)\nEmbedBackward(3)\nReduceGrads(3)\n"
            "OptimizerStep\n");
  lt::compile::PassContext c;  // the zero3 lowering with a tied head: the loss reads the embedding too
  c.numBlocks = 1;
  c.tiedEmbeddings = true;
  auto z = lt::compile::applyPasses(lt::compile::baseProgram(1), {"zero3"}, c);
  EXPECT_EQ(z.listing(),
            "Gather(2)\nEmbed(2)\nRelease(2)\nGather(0)\nForward(0)\nRelease(0)\nGather(2)\nGather(1)\n"
            "LossAndGrad(1)\nRelease(1)\nRelease(2)\nReduceGrads(1)\nGather(0)\nRecomputeBackward(0)\n"
            "Release(0)\nReduceGrads(0)\nEmbedBackward(2)\nReduceGrads(2)\nOptimizerStep\n");
}

TEST(Model, InitIsDeterministicFromSeed) {
  lt::model::ModelConfig mc;
  mc.vocabSize = 20;
  mc.hidden = 16;
  lt::model::Model a(mc, 5), b(mc, 5), c(mc, 6);
  auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i], pb[i]));
  EXPECT_FALSE(at::equal(pa[0], pc[0]));  // the embedding
  EXPECT_EQ(static_cast<int64_t>(at::cat([&] {
              std::vector<at::Tensor> v;
              for (auto& p : pa) v.push_back(p.reshape({-1}));
              return v;
            }()).numel()),
            mc.numParams());
}

TEST(Model, RopeIsRelative) {
  // q·k after RoPE depends only on the position difference.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  auto q = at::randn({1, 1, 1, 8}, gen), k = at::randn({1, 1, 1, 8}, gen);
  auto dot = [&](int64_t pq, int64_t pk) {
    auto a = lt::model::rope(q, at::full({1, 1}, pq, at::kLong), 10000);
    auto b = lt::model::rope(k, at::full({1, 1}, pk, at::kLong), 10000);
    return (a * b).sum().item<double>();
  };
  EXPECT_NEAR(dot(5, 2), dot(105, 102), Tol::kRopeRelative);
  EXPECT_GT(std::abs(dot(5, 2) - dot(5, 4)), Tol::kRopeRelative);
}

}  // namespace

namespace {

// Tiled MLP equals the plain MLP: output and the gradients of input and weights, with
// shard counts that do and do not divide S.
TEST(TiledMlp, EqualsUntiled) {
  at::set_num_threads(1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  auto wg = at::randn({24, 8}, gen).requires_grad_(true), wu = at::randn({24, 8}, gen).requires_grad_(true);
  auto wd = at::randn({8, 24}, gen).requires_grad_(true);
  auto x = at::randn({2, 17, 8}, gen).requires_grad_(true);
  auto up = at::randn({2, 17, 8}, gen);
  auto params = std::vector<at::Tensor>{x, wg, wu, wd};
  auto run = [&](int64_t shards) {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    auto y = lt::model::tiledMlp(x, wg, wu, wd, shards);
    (y * up).sum().backward();
    std::vector<at::Tensor> out{y.detach()};
    for (auto& p : params) out.push_back(p.grad().clone());
    return out;
  };
  auto ref = run(1);
  for (int64_t shards : {2, 3, 17}) {
    auto got = run(shards);
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_LE(relErr(got[i], ref[i]), Tol::kFusedKernel) << "shards " << shards << " #" << i;
  }
}

// Chunked attention equals naive attention, outputs and every input gradient, for lengths
// that are and are not multiples of the chunk, with grouped-query heads.
TEST(ChunkedAttention, EqualsNaive) {
  at::set_num_threads(1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  for (auto [S, chunk] : std::vector<std::pair<int64_t, int64_t>>{{16, 4}, {19, 5}, {7, 16}, {33, 1}}) {
    auto q = at::randn({2, S, 4, 8}, gen).requires_grad_(true);
    auto k = at::randn({2, S, 2, 8}, gen).requires_grad_(true);
    auto v = at::randn({2, S, 2, 8}, gen).requires_grad_(true);
    auto up = at::randn({2, S, 4, 8}, gen);
    auto ref = lt::model::causalAttention(q, k, v);
    (ref * up).sum().backward();
    auto gq = q.grad().clone(), gk = k.grad().clone(), gv = v.grad().clone();
    q.mutable_grad() = at::Tensor();
    k.mutable_grad() = at::Tensor();
    v.mutable_grad() = at::Tensor();
    auto out = lt::model::chunkedAttention(q, k, v, chunk);
    (out * up).sum().backward();
    EXPECT_LE(relErr(out, ref), Tol::kFusedKernel) << "S " << S << " chunk " << chunk;
    EXPECT_LE(relErr(q.grad(), gq), Tol::kFusedKernel) << "S " << S << " chunk " << chunk;
    EXPECT_LE(relErr(k.grad(), gk), Tol::kFusedKernel) << "S " << S << " chunk " << chunk;
    EXPECT_LE(relErr(v.grad(), gv), Tol::kFusedKernel) << "S " << S << " chunk " << chunk;
  }
}

}  // namespace
