// train/ + data/: data parallelism equals one rank with accumulation; config errors; the
// DeepSpeed schedules; sampling covers every sample once per epoch whatever the rank count.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "longtrain/core/check.h"
#include "longtrain/data/data.h"
#include "longtrain/config/parse.h"
#include "longtrain/train/engine.h"
#include "longtrain/train/lr_schedule.h"
#include "testing.h"

namespace {

using json = nlohmann::json;
using lt::testing::relErr;
using lt::testing::runRanks;
using lt::testing::Tol;

json smallConfig() {
  json j = lt::testing::tinyTrainConfig();
  j["gradient_clipping"] = 0.5;
  return j;
}

class DataParallel : public ::testing::TestWithParam<int> {};

TEST_P(DataParallel, EqualsOneRankWithAccumulation) {
  at::set_num_threads(1);
  const int n = GetParam();
  json ref = smallConfig();
  ref["gradient_accumulation_steps"] = n;
  const auto expect = lt::testing::trainOnRanks(ref, 1, 1, 3)[0].params;
  json dp = smallConfig();  // same global batch: micro 2 x accum 1 x dp n
  const auto got = lt::testing::trainOnRanks(dp, n, 1, 3);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < expect.size(); ++i) {
      EXPECT_LE(relErr(got[r].params[i], expect[i]), Tol::kDataParallel) << "rank " << r << " parameter " << i;
      EXPECT_TRUE(at::equal(got[r].params[i], got[0].params[i])) << "ranks disagree on parameter " << i;
    }
  // The step must actually have moved the parameters (a test that cannot fail is no test).
  lt::model::Model init(lt::config::parseConfig(ref, 1).model, 1234);
  EXPECT_GT(relErr(expect[0], init.parameters()[0]), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DataParallel, ::testing::Values(2, 4));

std::string errorOf(const json& j, int world = 1) {
  try {
    lt::config::parseConfig(j, world);
  } catch (const lt::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, UnknownKeyNamesPathAndClosest) {
  json j = smallConfig();
  j["optimizer"]["params"]["weight_decy"] = 0.1;
  auto e = errorOf(j);
  EXPECT_NE(e.find("unknown config key 'optimizer.params.weight_decy'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optimizer.params.weight_decay'"), std::string::npos) << e;
  json k = smallConfig();
  k["train_batch"] = 4;
  EXPECT_NE(errorOf(k).find("did you mean 'train_batch_size'"), std::string::npos) << errorOf(k);
}

TEST(Config, WrongTypeAndRange) {
  json j = smallConfig();
  j["model"]["num_layers"] = "two";
  auto e = errorOf(j);
  EXPECT_NE(e.find("'model.num_layers' must be an integer, got string \"two\""), std::string::npos) << e;
  json k = smallConfig();
  k["optimizer"]["params"]["lr"] = -1;
  e = errorOf(k);
  EXPECT_NE(e.find("'optimizer.params.lr' = -1 is out of range"), std::string::npos) << e;
  json b = smallConfig();
  b["optimizer"]["params"]["betas"] = {0.9};
  EXPECT_NE(errorOf(b).find("betas' must be a list of two numbers"), std::string::npos);
  json t = smallConfig();
  t["optimizer"]["type"] = "Adagrad";
  EXPECT_NE(errorOf(t).find("\"Adagrad\" is not one of \"AdamW\", \"Adam\""), std::string::npos) << errorOf(t);
}

// The kv_recall task's own rules are config rules: refused by parseConfig (before any rank is
// launched), not by the dataset on every rank.
TEST(Config, KvRecallTooShortOrTooManyPairsIsRefusedBeforeLaunch) {
  json j = smallConfig();
  j["model"]["vocab_size"] = 128;
  j["data"]["seq_len"] = 64;
  j["data"]["kv"] = {{"num_pairs", 16}, {"num_queries", 32}};
  auto e = errorOf(j);
  EXPECT_NE(e.find("data.seq_len=64 is too short for 16 pairs and 32 queries (needs at least 97)"), std::string::npos)
      << e;
  json k = smallConfig();
  k["model"]["vocab_size"] = 128;
  k["data"]["kv"] = {{"num_pairs", 40}, {"num_keys", 32}};
  e = errorOf(k);
  EXPECT_NE(e.find("data.kv.num_pairs=40 must be in [1, data.kv.num_keys=32]"), std::string::npos) << e;
}

// DeepSpeed's activation_checkpointing object changes memory, not results: it is accepted, and the
// start-up notice says what corresponds to it here (a DeepSpeed user's JSON carries one).
TEST(Config, DeepSpeedActivationCheckpointingObjectSaysWhatCorrespondsToIt) {
  json j = smallConfig();
  j["activation_checkpointing"] = {{"partition_activations", false}, {"cpu_checkpointing", true}};
  const auto c = lt::config::parseConfig(j, 1);
  EXPECT_EQ(c.activationCheckpointing, lt::config::Recompute::Auto);
  ASSERT_FALSE(c.notices.empty());
  EXPECT_NE(c.notices.back().find("cpu_checkpointing's counterpart is train.offload_dir"), std::string::npos)
      << c.notices.back();
  json k = smallConfig();
  k["activation_checkpointing"] = "none";
  EXPECT_EQ(lt::config::parseConfig(k, 1).activationCheckpointing, lt::config::Recompute::None);
}

TEST(Config, InconsistentBatchSizes) {
  json j = smallConfig();
  j["train_batch_size"] = 10;
  j["gradient_accumulation_steps"] = 2;  // 2 x 2 x dp 2 = 8 != 10
  auto e = errorOf(j, 2);
  EXPECT_NE(e.find("inconsistent batch sizes: train_batch_size=10"), std::string::npos) << e;
  // DeepSpeed's derivations: tb and micro give accumulation.
  json k = smallConfig();
  k["train_batch_size"] = 16;
  auto c = lt::config::parseConfig(k, 2);
  EXPECT_EQ(c.gradAccum, 4);
  json none = smallConfig();
  none.erase("train_micro_batch_size_per_gpu");
  EXPECT_NE(errorOf(none).find("set train_batch_size or train_micro_batch_size_per_gpu"), std::string::npos);
}

TEST(Config, SetOverrides) {
  json j = smallConfig();
  lt::config::applyOverride(j, "zero_optimization.stage=3");
  lt::config::applyOverride(j, "optimizer.type=Adam");
  lt::config::applyOverride(j, "optimizer.params.betas=[0.8,0.9]");
  EXPECT_EQ(j["zero_optimization"]["stage"], 3);
  EXPECT_EQ(j["optimizer"]["type"], "Adam");
  EXPECT_EQ(j["optimizer"]["params"]["betas"][1], 0.9);
  EXPECT_THROW(lt::config::applyOverride(j, "noequals"), lt::Error);
  EXPECT_THROW(lt::config::applyOverride(j, "optimizer.type.x=1"), lt::Error);  // type is a string
}

TEST(Schedule, WarmupLrAndCosineMatchDeepSpeedFormulas) {
  lt::config::SchedulerConfig s;
  s.type = lt::config::SchedulerType::WarmupLR;
  s.warmupMinLr = 0.0;
  s.warmupMaxLr = 0.1;
  s.warmupNumSteps = 10;
  s.warmupType = lt::config::WarmupType::Linear;
  EXPECT_DOUBLE_EQ(lt::train::lrAt(s, 1.0, -1), 0.0);  // the first step runs at the start value
  EXPECT_DOUBLE_EQ(lt::train::lrAt(s, 1.0, 5), 0.05);
  EXPECT_DOUBLE_EQ(lt::train::lrAt(s, 1.0, 50), 0.1);
  s.warmupType = lt::config::WarmupType::Log;
  EXPECT_NEAR(lt::train::lrAt(s, 1.0, 4), 0.1 * std::log(5.0) / std::log(10.0), 1e-15);
  lt::config::SchedulerConfig c;
  c.type = lt::config::SchedulerType::WarmupCosineLR;
  c.totalNumSteps = 110;
  c.warmupNumSteps = 10;
  c.warmupType = lt::config::WarmupType::Linear;
  c.cosMinRatio = 0.1;
  EXPECT_DOUBLE_EQ(lt::train::lrAt(c, 2.0, 5), 1.0);
  // Half-way through the decay: ratio = 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55.
  EXPECT_NEAR(lt::train::lrAt(c, 2.0, 59), 2.0 * 0.55, 1e-12);
  EXPECT_NEAR(lt::train::lrAt(c, 2.0, 1000), 2.0 * 0.1, 1e-12);
}

TEST(Data, EpochCoversEverySampleOnceForAnyRankCount) {
  lt::data::KvRecallOptions o;
  o.seqLen = 32;
  o.numSamples = 97;  // not a multiple of the global batch: the remainder is dropped per epoch
  o.numPairs = 2;
  o.numQueries = 2;
  auto ds = std::make_shared<lt::data::KvRecallDataset>(o);
  for (int dp : {1, 2, 4}) {
    std::vector<int64_t> order;
    // global batch 8 = micro 2 x accum (4/dp) x dp; collect samples in (step, accum, rank) order.
    const int64_t accum = 4 / dp;
    std::vector<std::unique_ptr<lt::data::Loader>> loaders;
    for (int r = 0; r < dp; ++r) {
      lt::data::LoaderOptions lo;
      lo.microBatch = 2;
      lo.gradAccum = accum;
      lo.dpRank = r;
      lo.dpSize = dp;
      loaders.push_back(std::make_unique<lt::data::Loader>(ds, lo));
    }
    std::set<int64_t> seen;
    for (int64_t step = 0; step < loaders[0]->stepsPerEpoch(); ++step)
      for (int64_t j = 0; j < accum; ++j)
        for (int r = 0; r < dp; ++r) {
          auto idx = loaders[r]->peekIndices();
          loaders[r]->next();
          for (auto i : idx) {
            EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " duplicated (dp " << dp << ")";
            order.push_back(i);
          }
        }
    EXPECT_EQ(seen.size(), 96u);  // 12 steps x 8
    static std::vector<int64_t> first;
    std::vector<int64_t> sortedOrder = order;
    if (dp == 1) first = order;
    // The set of samples in each global batch is the same whatever the rank count.
    for (size_t s = 0; s < 12; ++s) {
      std::set<int64_t> a(first.begin() + 8 * s, first.begin() + 8 * (s + 1)),
          b(order.begin() + 8 * s, order.begin() + 8 * (s + 1));
      EXPECT_EQ(a, b) << "global batch " << s << " differs at dp " << dp;
    }
  }
}

TEST(Data, KvRecallSampleShape) {
  lt::data::KvRecallOptions o;
  o.seqLen = 64;
  o.numPairs = 4;
  o.numQueries = 3;
  lt::data::KvRecallDataset ds(o);
  auto s = ds.get(11);
  EXPECT_EQ(s.ids.size(), 64u);
  int scored = 0;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (s.labels[i] != lt::data::kIgnoreIndex) {
      ++scored;
      // The answer to a query equals the value stored right after the same key earlier on.
      int64_t key = s.ids[i - 1];
      bool found = false;
      for (size_t p = 1; p + 1 < 1 + 2 * 4 + 1; p += 2)
        if (s.ids[p] == key) found = s.ids[p + 1] == s.labels[i];
      EXPECT_TRUE(found) << "position " << i;
    }
  EXPECT_EQ(scored, 3);
  EXPECT_EQ(ds.get(11).ids, s.ids);  // deterministic
}

}  // namespace

namespace {

std::string writeFile(const std::string& name, const void* data, size_t bytes) {
  auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  return path.string();
}

TEST(Data, TokenFilesAndBytes) {
  std::vector<uint16_t> toks(40);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i * 3);
  auto p16 = writeFile("lt_tokens.u16", toks.data(), toks.size() * 2);
  lt::data::TokenFileDataset ds(p16, 2, 8, 200);
  EXPECT_EQ(ds.size(), 5);
  auto s = ds.get(2);
  EXPECT_EQ(s.ids, (std::vector<int64_t>{48, 51, 54, 57, 60, 63, 66, 69}));
  EXPECT_EQ(s.labels, s.ids);
  // A token outside the vocabulary names the file, the token and its index.
  lt::data::TokenFileDataset small(p16, 2, 8, 50);
  try {
    small.get(2);
    FAIL();
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 51 at index 17 is outside model.vocab_size=50"), std::string::npos)
        << e.what();
  }
  std::vector<uint32_t> t32{1, 2, 3, 70000, 5, 6};
  auto p32 = writeFile("lt_tokens.u32", t32.data(), t32.size() * 4);
  EXPECT_EQ(lt::data::TokenFileDataset(p32, 4, 3, 100000).get(1).ids, (std::vector<int64_t>{70000, 5, 6}));
  auto odd = writeFile("lt_tokens.odd", t32.data(), 7);
  EXPECT_THROW(lt::data::TokenFileDataset(odd, 2, 2, 100), lt::Error);  // 7 bytes: not uint16s
  EXPECT_THROW(lt::data::TokenFileDataset("/nonexistent/x.bin", 2, 2, 100), lt::Error);
  const char text[] = "hello, long sequences";
  auto pb = writeFile("lt_text.txt", text, sizeof text - 1);
  EXPECT_EQ(lt::data::TokenFileDataset(pb, 1, 5, 256).get(0).ids, (std::vector<int64_t>{'h', 'e', 'l', 'l', 'o'}));
}

TEST(Data, TrainsOnATokenFile) {
  at::set_num_threads(1);
  std::vector<uint16_t> toks(4096);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7) % 64);
  auto path = writeFile("lt_train.u16", toks.data(), toks.size() * 2);
  json j = smallConfig();
  j["data"] = {{"type", "uint16"}, {"path", path}, {"seq_len", 32}, {"eval_samples", 4}};
  runRanks(1, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(j, 1), g);
    double first = e.step().loss, last = first;
    for (int s = 0; s < 20; ++s) last = e.step().loss;
    EXPECT_LT(last, first * 0.8);  // a periodic sequence is learnable
    EXPECT_GT(e.evaluate().tokens, 0);
  });
}

// data.eval_samples caps a token file's eval windows, held out (eval_fraction) or not: 4096
// tokens are 128 windows of 32, of which evaluation reads 4.
TEST(Data, EvalSamplesCapTokenFileEvaluation) {
  std::vector<uint16_t> toks(4096);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7) % 64);
  auto path = writeFile("lt_eval_cap.u16", toks.data(), toks.size() * 2);
  json j = smallConfig();
  j["data"] = {{"type", "uint16"}, {"path", path}, {"seq_len", 32}, {"eval_samples", 4}};
  const auto whole = lt::train::makeDataset(lt::config::parseConfig(j, 1), /*eval=*/true);
  EXPECT_EQ(whole->size(), 4);
  EXPECT_NE(whole->describe().find("windows [0, 4)"), std::string::npos) << whole->describe();
  j["data"]["eval_fraction"] = 0.25;  // 32 windows held out: the first 4 of them
  const auto held = lt::train::makeDataset(lt::config::parseConfig(j, 1), /*eval=*/true);
  EXPECT_EQ(held->size(), 4);
  EXPECT_NE(held->describe().find("windows [96, 100)"), std::string::npos) << held->describe();
  EXPECT_EQ(lt::train::makeDataset(lt::config::parseConfig(j, 1), /*eval=*/false)->size(), 96);
}

}  // namespace

TEST(Config, DuplicateKeysAndADirectoryAreRefusedInLongtrainsWords) {
  auto dir = lt::testing::freshTempDir("longtrain_config_strict");
  std::ofstream(dir / "dup.json") << R"({"train": {"steps": 3, "eval_every": 1, "steps": 5}, "seed": 1})";
  std::string e = lt::testing::errorOf([&] { lt::config::loadConfigJson((dir / "dup.json").string(), {}); });
  EXPECT_NE(e.find("key 'train.steps' appears twice"), std::string::npos) << e;
  std::ofstream(dir / "top.json") << R"({"seed": 1, "model": {"hidden_size": 8}, "seed": 2})";
  e = lt::testing::errorOf([&] { lt::config::loadConfigJson((dir / "top.json").string(), {}); });
  EXPECT_NE(e.find("key 'seed' appears twice"), std::string::npos) << e;
  // The same key in two different objects is fine.
  std::ofstream(dir / "ok.json") << R"({"a": {"steps": 1}, "train": {"steps": 2}})";
  EXPECT_EQ(lt::testing::errorOf([&] { lt::config::loadConfigJson((dir / "ok.json").string(), {}); }), "");
  e = lt::testing::errorOf([&] { lt::config::loadConfigJson(dir.string(), {}); });
  EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
}

// Sizes whose products would overflow 64-bit arithmetic are refused naming the keys (each key
// alone is in range); the attention-score product only counts where scores are held whole.
TEST(Config, SizesWhoseProductOverflowsAreRefusedNamingTheKeys) {
  json j = smallConfig();
  j["model"]["vocab_size"] = int64_t{1} << 40;
  j["model"]["hidden_size"] = int64_t{1} << 24;
  j["model"]["num_heads"] = 1;
  j["model"]["num_kv_heads"] = 1;
  std::string e = errorOf(j);
  EXPECT_NE(e.find("embedding weights (model.vocab_size = 1099511627776 x model.hidden_size = 16777216) overflow"),
            std::string::npos)
      << e;
  json naive = smallConfig();
  naive["data"]["seq_len"] = int64_t{1000000000000};
  naive["model"]["attention"] = "naive";
  e = errorOf(naive);
  EXPECT_NE(e.find("attention scores of one micro-batch (data.seq_len = 1000000000000 x data.seq_len"),
            std::string::npos)
      << e;
  json fused = naive;
  fused["model"]["attention"] = "fused";
  EXPECT_EQ(errorOf(fused).find("overflow"), std::string::npos) << errorOf(fused);
}

// The run plan: resolved once, agreed by every rank, and kept out of the config as given.
TEST(RunPlan, RanksThatResolveDifferentlyAreRefusedNamingTheField) {
  std::vector<std::string> errors(2);
  runRanks(2, 1, [&](int r, lt::comm::Groups& g) {
    lt::config::RunPlan plan;
    plan.graphBlocks = 2;
    plan.memoryBudget = r == 0 ? 1 : 2;  // a rank's own: never compared
    lt::train::agreeOnPlan(plan, *g.world);  // agrees
    plan.kernels.oneDnnGemm = r == 1;
    errors[r] = lt::testing::errorOf([&] { lt::train::agreeOnPlan(plan, *g.world); });
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("model.gemm"), std::string::npos) << e;
    EXPECT_NE(e.find("is 0 on some ranks and 1 on others"), std::string::npos) << e;
  }
}

TEST(RunPlan, TheEngineLeavesTheConfigAsGivenAndThePlanReachesTheModel) {
  nlohmann::json j = lt::testing::tinyTrainConfig();
  j["model"]["gemm"] = "onednn";
  const lt::config::Config cfg = lt::config::parseConfig(j, 1);
  runRanks(1, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(cfg, g);
    EXPECT_FALSE(e.config().model.resolved.oneDnnGemm);  // as parsed
    EXPECT_TRUE(e.plan().kernels.oneDnnGemm);
    EXPECT_TRUE(e.model().config().resolved.oneDnnGemm);
    EXPECT_EQ(e.plan().graphBlocks, e.graphBlocks());
    EXPECT_GT(e.plan().memoryBudget, 0);
  });
}
