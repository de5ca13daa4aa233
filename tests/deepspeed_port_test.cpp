// A DeepSpeed / Hugging Face Trainer config ported as it is: "auto" values, DeepSpeed's no-op
// keys, its unimplemented features refused with the reason, every problem of a config in one
// error, names matched without regard to case, and DeepSpeed's own meaning of "Adam". The
// Trainer's ZeRO-3 config below is the shape its documentation gives (all knobs "auto").
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "longtrain/config/parse.h"
#include "longtrain/core/strings.h"
#include "longtrain/train/lr_schedule.h"
#include "testing.h"

namespace {

using json = nlohmann::json;
using lt::testing::errorOf;

json trainerZero3() {
  json j = json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                       "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {
      "stage": 3,
      "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "offload_param": {"device": "cpu", "pin_memory": true},
      "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true
    },
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false
  })");
  const json tiny = lt::testing::tinyTrainConfig();
  for (const char* section : {"model", "data", "train"}) j[section] = tiny[section];
  return j;
}

TEST(DeepSpeedPort, TrainerZero3ConfigParsesAsItIs) {
  const auto c = lt::config::parseConfig(trainerZero3(), 2);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offloadOptimizer.device, lt::config::OffloadDevice::Cpu);
  EXPECT_EQ(c.microBatch, 1);  // every batch key "auto": longtrain's micro batch of 1 ...
  EXPECT_EQ(c.gradAccum, 1);
  EXPECT_EQ(c.trainBatchSize, 2);  // ... and the rest derived on 2 ranks
  EXPECT_EQ(c.optimizer.lr, lt::config::OptimizerConfig{}.lr);
  EXPECT_EQ(c.gradientClipping, 0.0);
  EXPECT_FALSE(c.precision.bf16);
  EXPECT_EQ(c.scheduler.type, lt::config::SchedulerType::WarmupDecayLR);
  EXPECT_EQ(c.scheduler.totalNumSteps, c.train.steps);  // derived: the run's length
  ASSERT_EQ(c.notices.size(), 2u);
  const std::string& autos = c.notices[0];
  EXPECT_NE(autos.find("optimizer.params.lr=0.001"), std::string::npos) << autos;
  EXPECT_NE(autos.find("train_batch_size=2"), std::string::npos) << autos;
  EXPECT_NE(autos.find("scheduler.params.total_num_steps=3"), std::string::npos) << autos;
  const std::string& ignored = c.notices[1];
  for (const char* key : {"wall_clock_breakdown", "zero_optimization.offload_param", "fp16.loss_scale",
                          "zero_optimization.stage3_max_reuse_distance", "offload_optimizer.pin_memory"})
    EXPECT_NE(ignored.find(key), std::string::npos) << key << ": " << ignored;
}

TEST(DeepSpeedPort, EveryProblemIsReportedInOnePass) {
  json j = trainerZero3();
  j["zero_optimization"]["stage3_prefetch_bucket"] = 5;  // unknown
  j["optimizer"]["params"]["eps"] = "tiny";              // wrong type
  j["scheduler"]["params"]["warmup_type"] = "cubic";     // not one of the choices
  j["model"]["num_layers"] = 0;                          // out of range
  j["zero_optimization"]["zero_quantized_weights"] = true;  // a feature that changes the results
  const std::string e = errorOf([&] { lt::config::parseConfig(j, 2); });
  EXPECT_NE(e.find("the config has 5 problems"), std::string::npos) << e;
  for (const char* part : {"stage3_prefetch_bucket'; did you mean 'zero_optimization.stage3_prefetch_bucket_size'",
                           "'optimizer.params.eps' must be a number", "\"cubic\" is not one of",
                           "'model.num_layers' = 0 is out of range", "ZeRO++ quantized weights"})
    EXPECT_NE(e.find(part), std::string::npos) << part << "\n" << e;
  // The rules that span keys are collected the same way.
  json k = lt::testing::tinyTrainConfig();
  k["train"]["checkpoint"] = {{"every_steps", 5}};
  k["data"]["packing"] = "documents";
  const std::string rules = errorOf([&] { lt::config::parseConfig(k, 1); });
  EXPECT_NE(rules.find("the config has 2 problems"), std::string::npos) << rules;
}

TEST(DeepSpeedPort, ResultChangingFeaturesAreRefusedWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"zero_optimization.offload_param.device=\"nvme\"", "NVMe parameter offload is not implemented"},
      {"prescale_gradients=true", "changes its rounding"},
      {"optimizer.params.amsgrad=true", "AMSGrad is not implemented"},
      {"sparse_attention={\"mode\":\"fixed\"}", "block-sparse attention"},
      {"zero_optimization.zero_hpz_partition_size=8", "hierarchical partitioning"},
      {"scheduler.params.last_batch_iteration=100", "takes its step from the checkpoint"},
  };
  for (const auto& [set, reason] : cases) {
    json j = trainerZero3();
    lt::config::applyOverride(j, set);
    const std::string e = errorOf([&] { lt::config::parseConfig(j, 2); });
    EXPECT_NE(e.find(reason), std::string::npos) << set << ": " << e;
  }
}

TEST(DeepSpeedPort, OptimizerAndSchedulerNamesIgnoreCase) {
  json j = trainerZero3();
  j["optimizer"]["type"] = "adamw";
  j["scheduler"]["type"] = "warmupcosinelr";
  const auto c = lt::config::parseConfig(j, 2);
  EXPECT_EQ(c.optimizer.type, lt::config::OptimizerType::AdamW);
  EXPECT_EQ(c.scheduler.type, lt::config::SchedulerType::WarmupCosineLR);
  j["optimizer"]["type"] = "LAMB";  // DeepSpeed's, not longtrain's: refused naming what there is
  const std::string e = errorOf([&] { lt::config::parseConfig(j, 2); });
  EXPECT_NE(e.find("\"Lamb\" is not one of \"AdamW\", \"Adam\""), std::string::npos) << e;
}

// A real DeepSpeed key is never offered for an unrelated one; a near miss still is.
TEST(DeepSpeedPort, DidYouMeanOnlyForNearMisses) {
  EXPECT_EQ(lt::closestName("offload_parm", {"offload_optimizer", "stage"}), "");
  EXPECT_EQ(lt::closestName("wall_clock_breakdown", {"zero_optimization", "train"}), "");
  EXPECT_EQ(lt::closestName("zero_optimzation", {"zero_optimization", "train"}), "zero_optimization");
  EXPECT_EQ(lt::closestName("train_batch", {"train_batch_size", "seed"}), "train_batch_size");
}

// DeepSpeed's "Adam" decays weights as AdamW does unless params.adam_w_mode is false.
TEST(DeepSpeedPort, AdamMeansWhatDeepSpeedMeans) {
  json j = lt::testing::tinyTrainConfig();
  j["optimizer"]["type"] = "Adam";
  EXPECT_TRUE(lt::config::parseConfig(j, 1).optimizer.decoupledDecay());
  j["optimizer"]["params"]["adam_w_mode"] = false;
  EXPECT_FALSE(lt::config::parseConfig(j, 1).optimizer.decoupledDecay());
  j["optimizer"]["type"] = "AdamW";  // AdamW decouples whatever adam_w_mode says
  EXPECT_TRUE(lt::config::parseConfig(j, 1).optimizer.decoupledDecay());
}

// WarmupDecayLR as DeepSpeed defines it: WarmupLR's warmup, then a linear decay from the
// maximum to 0 at total_num_steps (written out here, not taken from lr_schedule.cpp).
TEST(DeepSpeedPort, WarmupDecayLrFollowsDeepSpeedsDefinition) {
  lt::config::SchedulerConfig s;
  s.type = lt::config::SchedulerType::WarmupDecayLR;
  s.warmupMinLr = 0.01, s.warmupMaxLr = 0.1, s.warmupNumSteps = 10, s.totalNumSteps = 110;
  s.warmupType = lt::config::WarmupType::Linear;
  EXPECT_DOUBLE_EQ(lt::train::lrAt(s, 1.0, 5), 0.01 + 0.09 * 0.5);
  EXPECT_DOUBLE_EQ(lt::train::lrAt(s, 1.0, 10), 0.01 + 0.09 * 1.0);
  EXPECT_DOUBLE_EQ(lt::train::lrAt(s, 1.0, 60), 0.01 + 0.09 * 0.5);
  EXPECT_DOUBLE_EQ(lt::train::lrAt(s, 1.0, 110), 0.01);
  EXPECT_DOUBLE_EQ(lt::train::lrAt(s, 1.0, 500), 0.01);  // never below the minimum
  s.warmupType = lt::config::WarmupType::Log;
  EXPECT_NEAR(lt::train::lrAt(s, 1.0, 4), 0.01 + 0.09 * std::log(5.0) / std::log(10.0), 1e-15);
}

}  // namespace
