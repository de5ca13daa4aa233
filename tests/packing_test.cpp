// Document packing: a window holding two documents must give the same loss and gradients as the
// two documents run separately, in every attention core and through Ulysses SP (where a
// document crosses the shard boundary).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <fstream>

#include "longtrain/compile/executor.h"
#include "longtrain/data/data.h"
#include "longtrain/model/attention.h"
#include "longtrain/model/model.h"
#include "longtrain/sp/ulysses.h"
#include "testing.h"

namespace {

using lt::testing::relErr;
using lt::testing::Tol;

constexpr int64_t kEos = 2;

lt::model::ModelConfig packingModel(const std::string& attention) {
  lt::model::ModelConfig mc;
  mc.vocabSize = 40;
  mc.hidden = 32;
  mc.layers = 2;
  mc.heads = 4;
  mc.kvHeads = 2;
  mc.intermediate = 40;
  mc.attention = *lt::config::optionFromName<lt::config::AttentionKernel>(attention);
  mc.attentionChunk = 3;  // tiles smaller than either document, not dividing them
  return mc;
}

// Two documents of 7 and 9 tokens, each ending with EOS.
std::pair<std::vector<int64_t>, std::vector<int64_t>> twoDocuments() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto draw = [&](int64_t n) {
    auto t = at::randint(3, 40, {n}, gen, at::kLong);
    std::vector<int64_t> v(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
    v.back() = kEos;
    return v;
  };
  auto a = draw(7);
  return {a, draw(9)};
}

lt::data::Batch batchOf(const lt::data::Sample& s) {
  auto b = lt::data::collate({s});
  b.shift_labels = lt::data::shiftLabels(b.labels);
  return b;
}

struct LossAndGrads {
  double lossSum = 0;
  std::vector<at::Tensor> grads;
};

// The reference: each document alone (plain causal attention, positions from 0), summed.
LossAndGrads separately(const lt::model::ModelConfig& mc) {
  auto [a, b] = twoDocuments();
  lt::model::ModelConfig plain = mc;
  plain.resolved.packedDocuments = false;
  lt::model::Model m(plain, 3);
  LossAndGrads out;
  for (const auto& doc : {a, b}) {
    auto batch = batchOf({doc, doc, {}});
    auto ls = lt::model::lossSum(m.forward(batch.input_ids, batch.position_ids, lt::model::attentionCore(plain)),
                                 batch.shift_labels);
    ls.sum.backward();
    out.lossSum += ls.sum.item<double>();
  }
  for (const auto& p : m.parameters()) out.grads.push_back(p.grad().clone());
  return out;
}

lt::data::Sample packedWindow() {
  auto [a, b] = twoDocuments();
  lt::data::Sample s;
  s.ids = a;
  s.ids.insert(s.ids.end(), b.begin(), b.end());
  s.labels = s.ids;
  lt::data::packDocuments(s, kEos);
  return s;
}

TEST(Packing, PositionsRestartAndTheCrossDocumentTargetIsIgnored) {
  lt::data::Sample s;
  s.ids = {5, 6, kEos, 7, 8, 9, kEos, 4};
  s.labels = s.ids;
  lt::data::packDocuments(s, kEos);
  EXPECT_EQ(s.positions, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(s.labels, (std::vector<int64_t>{5, 6, kEos, -100, 8, 9, kEos, -100}));
  auto b = lt::data::collate({s});
  EXPECT_EQ(b.position_ids[0][3].item<int64_t>(), 0);
  EXPECT_TRUE(at::equal(lt::model::documentStartFromPositions(b.position_ids),
                        at::tensor({0, 0, 0, 3, 3, 3, 3, 7}, at::kLong).view({1, 8})));
}

class PackedEqualsSeparate : public ::testing::TestWithParam<std::string> {};

TEST_P(PackedEqualsSeparate, LossAndEveryGradient) {
  at::set_num_threads(1);
  auto mc = packingModel(GetParam());
  const auto ref = separately(mc);
  mc.resolved.packedDocuments = true;
  lt::model::Model m(mc, 3);
  auto batch = batchOf(packedWindow());
  EXPECT_EQ(batch.shift_labels.ne(-100).sum().item<int64_t>(), 6 + 8);  // no EOS -> next-document target
  auto ls = lt::model::lossSum(m.forward(batch.input_ids, batch.position_ids, lt::model::attentionCore(mc)),
                               batch.shift_labels);
  ls.sum.backward();
  EXPECT_LE(std::abs(ls.sum.item<double>() - ref.lossSum) / ref.lossSum, Tol::kFusedKernel);
  auto params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(relErr(params[i].grad(), ref.grads[i]), Tol::kFusedKernel) << GetParam() << " parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(EveryCore, PackedEqualsSeparate, ::testing::Values("naive", "chunked", "fused"));

TEST(Packing, WithoutPackingTheDocumentsWouldSeeEachOther) {
  // The test above can fail: the same window unpacked gives another loss.
  at::set_num_threads(1);
  auto mc = packingModel("fused");
  const auto ref = separately(mc);
  lt::model::Model m(mc, 3);
  auto s = packedWindow();
  s.positions.clear();
  auto batch = batchOf(s);
  auto ls = lt::model::lossSum(m.forward(batch.input_ids, batch.position_ids, lt::model::attentionCore(mc)),
                               batch.shift_labels);
  EXPECT_GT(std::abs(ls.sum.item<double>() - ref.lossSum) / ref.lossSum, 1e-3);
}

// SP = 2: the 16-token window is cut at token 8, inside the second document.
TEST(Packing, UlyssesSpTwoEqualsSeparateDocuments) {
  at::set_num_threads(1);
  for (const std::string core : {"fused", "naive"}) {
    auto mc = packingModel(core);
    const auto ref = separately(mc);
    mc.resolved.packedDocuments = true;
    auto whole = batchOf(packedWindow());
    lt::compile::RunOptions ro;
    ro.lossDenominator = 1;
    lt::testing::runRanks(2, 2, [&](int r, lt::comm::Groups& g) {
      lt::model::Model m(mc, 3);
      lt::compile::Executor ex(m, lt::sp::ulyssesAttention(g.sp, lt::model::attentionCore(mc)), {});
      auto st = ex.run(lt::compile::baseProgram(m.numBlocks()), lt::sp::shardBatch(whole, r, lt::config::ParallelLayout::make(2, 2, mc.heads, mc.kvHeads, 1, lt::config::SpBalance::Contiguous)), ro);
      auto loss = at::tensor({st.lossSum}, at::kDouble);
      g.sp->allReduce(loss).wait();
      EXPECT_LE(std::abs(loss.item<double>() - ref.lossSum) / ref.lossSum, Tol::kSequenceParallel) << core;
      auto params = m.parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        auto grad = params[i].grad().clone();
        g.sp->allReduce(grad).wait();
        EXPECT_LE(relErr(grad, ref.grads[i]), Tol::kSequenceParallel) << core << " rank " << r << " parameter " << i;
      }
    });
  }
}

TEST(Packing, TokenFileWindowsArePackedAtTheEos) {
  auto dir = lt::testing::freshTempDir("longtrain_packing");
  const std::vector<uint16_t> tokens = {5, 6, kEos, 7, 8, 9, kEos, 4, 4, kEos, 3, 3};
  std::ofstream((dir / "t.bin").string(), std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  lt::data::TokenWindows w;
  w.packEos = kEos;
  lt::data::TokenFileDataset ds((dir / "t.bin").string(), 2, 4, 40, w);
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.get(1).positions, (std::vector<int64_t>{0, 1, 2, 0}));  // tokens 8 9 EOS 4
  EXPECT_EQ(ds.get(1).labels, (std::vector<int64_t>{8, 9, kEos, -100}));
  lt::data::TokenWindows held{kEos, 2, 1};  // the last window alone: a held-out split
  lt::data::TokenFileDataset last((dir / "t.bin").string(), 2, 4, 40, held);
  EXPECT_EQ(last.size(), 1);
  EXPECT_EQ(last.get(0).ids, (std::vector<int64_t>{4, kEos, 3, 3}));
  lt::data::TokenWindows tooMany{-1, 2, 2};
  EXPECT_NE(lt::testing::errorOf([&] { lt::data::TokenFileDataset((dir / "t.bin").string(), 2, 4, 40, tooMany); })
                .find("holds 3 windows"),
            std::string::npos);
}

}  // namespace

namespace {

// Through the engine: a packed token file (documents of random lengths, many crossing window
// and shard boundaries) trains the same at SP = 2 as on one rank.
TEST(Packing, EngineSpTwoMatchesOneRankOnAPackedTokenFile) {
  auto dir = lt::testing::freshTempDir("longtrain_packing_engine");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  std::vector<uint16_t> tokens;
  while (tokens.size() < 4096) {
    const int64_t len = at::randint(2, 40, {1}, gen, at::kLong).item<int64_t>();
    for (int64_t i = 0; i + 1 < len; ++i) tokens.push_back(static_cast<uint16_t>(3 + (tokens.size() * 7 + i) % 37));
    tokens.push_back(kEos);
  }
  std::ofstream((dir / "docs.bin").string(), std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  nlohmann::json j = lt::testing::tinyTrainConfig();
  j["data"] = {{"type", "uint16"}, {"path", (dir / "docs.bin").string()}, {"seq_len", 32}, {"packing", "documents"},
               {"eos_id", kEos}, {"eval_samples", 0}};
  const auto one = lt::testing::trainOnRanks(j, 1, 1, 3);
  auto sp = j;
  sp["sequence_parallel_size"] = 2;
  const auto two = lt::testing::trainOnRanks(sp, 2, 2, 3);
  for (size_t s = 0; s < one[0].losses.size(); ++s)
    EXPECT_LE(std::abs(two[0].losses[s] - one[0].losses[s]) / one[0].losses[s], Tol::kSequenceParallel) << s;
  for (size_t i = 0; i < one[0].params.size(); ++i)
    EXPECT_LE(relErr(two[0].params[i], one[0].params[i]), Tol::kAfterAdamSteps) << i;
  // Packing changes what is learned: the same file unpacked gives other losses.
  auto plain = j;
  plain["data"]["packing"] = "none";
  EXPECT_GT(std::abs(lt::testing::trainOnRanks(plain, 1, 1, 1)[0].losses[0] - one[0].losses[0]), 1e-4);
}

}  // namespace
