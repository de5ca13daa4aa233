// `longtrain config CONFIG --print` (Config::effective): every key the parser reads appears with
// the value it resolved to, so the printed config is complete and true: fed back as a config it
// prints itself again (a fixed point) and describes the same run.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "longtrain/config/parse.h"

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(ConfigPrint, EveryExampleIsAFixedPointWithItsDefaultsFilledIn) {
  int checked = 0;
  for (const char* dir : {"examples", "bench"})
    for (const auto& e : fs::directory_iterator(fs::path(LONGTRAIN_SOURCE_DIR) / dir)) {
      if (e.path().extension() != ".json" || e.path().filename().string().rfind("long_context_extend", 0) == 0) continue;
      const json given = lt::config::loadConfigJson(e.path().string(), {});
      const auto first = lt::config::parseConfig(given, given.value("train", json::object()).value("nproc", 1));
      const json printed = json::parse(first.effective);
      const auto second = lt::config::parseConfig(printed, printed["train"]["nproc"].get<int>());
      EXPECT_EQ(second.effective, first.effective) << e.path();
      EXPECT_EQ(second.model.numParams(), first.model.numParams()) << e.path();
      EXPECT_EQ(second.trainBatchSize, first.trainBatchSize) << e.path();
      // Defaults the file left out are there, with the parser's value.
      EXPECT_TRUE(printed["model"].contains("rope_theta")) << e.path();
      EXPECT_TRUE(printed["train"]["checkpoint"].contains("keep_last")) << e.path();
      EXPECT_EQ(printed["zero_optimization"]["stage"], first.zero.stage) << e.path();
      ++checked;
    }
  EXPECT_GE(checked, 10);
}

TEST(ConfigPrint, CommandPrintsJsonAndChecks) {
  const std::string bin = LONGTRAIN_BIN, cfg = std::string(LONGTRAIN_SOURCE_DIR) + "/examples/quickstart.json";
  auto r = lt::testing::runCommand(bin + " config " + cfg + " --print --set train.steps=7");
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["train"]["steps"], 7);
  EXPECT_EQ(j["data"]["kv"]["num_pairs"], 8);
  r = lt::testing::runCommand(bin + " config " + cfg);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("is valid"), std::string::npos) << r.out;
  r = lt::testing::runCommand(bin + " config " + cfg + " --set train.stepz=7");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("did you mean 'train.steps'"), std::string::npos) << r.out;
}

}  // namespace
