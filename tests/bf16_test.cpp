// bf16 mixed precision (bf16.enabled): GEMMs in bf16 with fp32 weights, gradients and Adam.
// Losses track fp32 over 50 steps of a quick-start-like run (forced with bf16.only_if_faster =
// false, so the test runs on CPUs where bf16 is slower too), with and without bf16 attention
// (bf16.attention), the parameters stay fp32, and fp16 is refused by name.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "longtrain/kernels/fused_attention.h"
#include "testing.h"

namespace {

using lt::testing::Tol;

nlohmann::json quickLike() {
  auto j = lt::testing::tinyTrainConfig();
  j["train"]["steps"] = 50;
  j["data"]["eval_samples"] = 8;
  return j;
}

TEST(Bf16, LossesTrackFp32OverFiftySteps) {
  at::set_num_threads(1);
  auto fp32 = lt::testing::trainOnRanks(quickLike(), 1, 1, 50)[0];
  auto j = quickLike();
  j["bf16"] = {{"enabled", true}, {"only_if_faster", false}};
  auto bf16 = lt::testing::trainOnRanks(j, 1, 1, 50)[0];
  double worst = 0;
  for (int s = 0; s < 50; ++s) worst = std::max(worst, std::abs(bf16.losses[s] - fp32.losses[s]) / fp32.losses[s]);
  std::printf("bf16 vs fp32: worst relative loss difference over 50 steps %.3g (first %.3g, last %.4f vs %.4f)\n",
              worst, std::abs(bf16.losses[0] - fp32.losses[0]) / fp32.losses[0], bf16.losses[49], fp32.losses[49]);
  EXPECT_LE(worst, Tol::kBf16Loss);
  // Not fp32 in disguise: bf16 rounding shows at the first step already.
  EXPECT_GT(std::abs(bf16.losses[0] - fp32.losses[0]), 0.0);
  for (const auto& p : bf16.params) EXPECT_EQ(p.scalar_type(), at::kFloat);
  EXPECT_LT(bf16.losses[49], 0.8 * bf16.losses[0]);  // and it learns
  // bf16.attention=false keeps the attention kernel fp32: still within the tolerance, and where
  // the CPU runs bf16 attention (AVX512_BF16) the losses differ, so the key reaches the kernel.
  j["bf16"]["attention"] = false;
  EXPECT_FALSE(lt::config::parseConfig(j, 1).precision.attention);
  auto fp32Attention = lt::testing::trainOnRanks(j, 1, 1, 50)[0];
  for (int s = 0; s < 50; ++s)
    EXPECT_LE(std::abs(fp32Attention.losses[s] - fp32.losses[s]) / fp32.losses[s], Tol::kBf16Loss) << "step " << s;
  if (lt::kernels::fusedAttentionBf16Supported()) {
    EXPECT_NE(fp32Attention.losses[5], bf16.losses[5]);
  }
}

// Under bf16.only_if_faster (the default) bf16.attention is measured at start-up like the GEMMs:
// the run says which it took, and the start-up line shows the attention the model then runs.
// Timings decide, so the test checks that the two lines agree, not which way they went.
TEST(Bf16, AttentionTakesBf16OnlyWhereItMeasuresFaster) {
  if (!lt::kernels::fusedAttentionBf16Supported()) GTEST_SKIP() << "no AVX512_BF16: bf16 attention never runs here";
  const auto dir = lt::testing::freshTempDir("longtrain_bf16_attention");
  auto j = quickLike();
  j["train"]["steps"] = 2;
  j["bf16"] = {{"enabled", true}};
  std::ofstream(dir / "cfg.json") << j.dump();
  const auto r = lt::testing::runCommand(std::string(LONGTRAIN_BIN) + " train " + (dir / "cfg.json").string());
  ASSERT_EQ(r.code, 0) << r.out;
  if (r.out.find("GEMMs run in bf16") == std::string::npos) GTEST_SKIP() << "bf16 GEMMs were not faster here: " << r.out;
  const bool said = r.out.find("attention runs its products in bf16") != std::string::npos;
  EXPECT_TRUE(said || r.out.find("attention stays fp32") != std::string::npos) << r.out;
  EXPECT_NE(r.out.find(said ? "bf16 (attention's products too)" : "bf16 (attention in fp32)"), std::string::npos) << r.out;
}

TEST(Bf16, Fp16IsRefusedByName) {
  auto j = quickLike();
  j["fp16"] = {{"enabled", true}};
  auto msg = lt::testing::errorOf([&] { lt::config::parseConfig(j, 1); });
  EXPECT_NE(msg.find("fp16.enabled"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bf16.enabled"), std::string::npos) << msg;
}

}  // namespace
