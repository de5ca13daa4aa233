// Tests that keep the user's manual (docs/) true to the binary: every key `longtrain config
// --print` shows is in docs/configuration.md and every key documented there exists; every flag
// of every subcommand's --help is in its section of docs/cli.md; the command lines tagged
// "```bash test" in docs/getting-started.md run. Non-obvious decision: the getting-started
// commands run as written, in a scratch directory whose build/, examples/, docs/ and README.md
// are links to the checkout's, so relative paths in the manual (runs/..., examples/...) mean
// what they mean to a user at the repository root; only `longtrain train` lines get
// --set train.steps=3 appended, to keep the test short.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kBin = LONGTRAIN_BIN;
const fs::path kRoot = LONGTRAIN_SOURCE_DIR;

std::string readText(const fs::path& p) {
  std::ifstream f(p);
  EXPECT_TRUE(f.good()) << "cannot read " << p;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

// Stdout alone (the "auto" and no-op notices go to stderr; runCommand merges the two).
lt::testing::CommandResult stdoutOf(const std::string& cmd) {
  return lt::testing::runCommand("bash -c '" + cmd + " 2>/dev/null'");
}

// Dotted paths of a printed config's leaves; an array or null is a leaf (compile.schedule,
// optimizer.params.betas, model.rope_scaling when absent).
void flatten(const json& j, const std::string& prefix, std::set<std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out.insert(prefix);
  }
}

// The configs whose printed keys together cover every section: the quick start (WarmupCosineLR,
// no rope scaling), and two written here: WarmupDecayLR, YaRN with its optional keys, a pass
// schedule, ZeRO-3 with SuperOffload, DeepSpeed's "auto" and a no-op key; WarmupLR with Llama 3's
// rope scaling. The printer shows a scheduler's params for its type only and rope_scaling's
// keys only when it is given.
std::vector<std::pair<std::string, std::string>> printedConfigs() {
  const fs::path dir = lt::testing::freshTempDir("longtrain_docs_test_configs");
  const json rich = json::parse(R"({
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "adam", "params": {"lr": 1e-3, "adam_w_mode": false}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                  "warmup_num_steps": 10, "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": true, "pin_memory": true}},
    "wall_clock_breakdown": false,
    "compile": {"deepcompile": true, "schedule": [[0, ["zero3"]], [5, ["zero3", "prefetch"]]]},
    "model": {"vocab_size": 128, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
              "beta_fast": 32, "beta_slow": 1, "attention_factor": 1.1, "mscale": 1.0, "mscale_all_dim": 1.0, "truncate": false}},
    "train": {"steps": 10, "checkpoint": {"dir": "ck", "every_steps": 5}}
  })");
  const json llama3 = json::parse(R"({
    "train_micro_batch_size_per_gpu": 1,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    "model": {"vocab_size": 128, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
              "high_freq_factor": 4, "original_max_position_embeddings": 64}}
  })");
  std::ofstream(dir / "rich.json") << rich.dump();
  std::ofstream(dir / "llama3.json") << llama3.dump();
  return {{(kRoot / "examples/quickstart.json").string(), ""},
          {(dir / "rich.json").string(), " --nproc 4"},
          {(dir / "llama3.json").string(), ""}};
}

std::set<std::string> printedKeys() {
  std::set<std::string> keys;
  for (const auto& [cfg, args] : printedConfigs()) {
    const auto r = stdoutOf(kBin + " config " + cfg + args + " --print");
    EXPECT_EQ(r.code, 0) << cfg << "\n" << r.out;
    if (r.code != 0) continue;
    flatten(json::parse(r.out), "", keys);
  }
  return keys;
}

// Keys of docs/configuration.md: the first cell's backticked names in the rows of every table
// whose header's first cell is "key" (the reference tables; the DeepSpeed-only tables are
// headed otherwise).
std::set<std::string> documentedKeys(const std::string& doc) {
  std::set<std::string> keys;
  bool inKeyTable = false;
  const std::regex tick("`([^`]+)`");
  for (const auto& line : lines(doc)) {
    if (line.rfind("|", 0) != 0) {
      inKeyTable = false;
      continue;
    }
    const std::string first = line.substr(1, line.find('|', 1) - 1);
    std::string trimmed = first;
    trimmed.erase(0, trimmed.find_first_not_of(' '));
    trimmed.erase(trimmed.find_last_not_of(' ') + 1);
    if (trimmed == "key") {
      inKeyTable = true;
      continue;
    }
    if (!inKeyTable || trimmed.rfind("---", 0) == 0) continue;
    for (std::sregex_iterator it(first.begin(), first.end(), tick), end; it != end; ++it) keys.insert((*it)[1]);
  }
  return keys;
}

// Keys documented in configuration.md that none of the configs above makes the printer show.
// Empty today: every key the parser reads is printed by some config (the printer records every
// key read). Add a key here, with the reason, only when the printer cannot show it.
const std::set<std::string> kDocumentedButNotPrinted = {};

TEST(DocsConfig, EveryPrintedKeyIsDocumentedAndEveryDocumentedKeyExists) {
  const std::set<std::string> printed = printedKeys();
  ASSERT_GT(printed.size(), 100u) << "the printer showed too few keys";
  const std::set<std::string> documented = documentedKeys(readText(kRoot / "docs/configuration.md"));
  for (const auto& k : printed)
    EXPECT_TRUE(documented.count(k)) << "`longtrain config --print` prints '" << k
                                     << "', which docs/configuration.md does not document (a `key` table row)";
  for (const auto& k : documented)
    EXPECT_TRUE(printed.count(k) || kDocumentedButNotPrinted.count(k))
        << "docs/configuration.md documents '" << k << "', which no printed config has";
}

// The subcommands `longtrain --help` lists.
std::vector<std::string> subcommands() {
  const auto r = lt::testing::runCommand(kBin + " --help");
  EXPECT_EQ(r.code, 0) << r.out;
  std::vector<std::string> out;
  bool in = false;
  for (const auto& line : lines(r.out)) {
    if (line.rfind("Subcommands:", 0) == 0) {
      in = true;
      continue;
    }
    std::smatch m;
    if (in && std::regex_search(line, m, std::regex("^  ([a-z]+) "))) out.push_back(m[1]);
  }
  return out;
}

// The long flags a subcommand's --help lists (--help itself aside).
std::set<std::string> flagsOf(const std::string& sub) {
  const auto r = lt::testing::runCommand(kBin + " " + sub + " --help");
  EXPECT_EQ(r.code, 0) << sub << "\n" << r.out;
  std::set<std::string> flags;
  bool in = false;
  const std::regex flag("(^|[ ,])(--[a-z0-9][a-z0-9-]*)");
  for (const auto& line : lines(r.out)) {
    if (line.rfind("Options:", 0) == 0) in = true;
    if (!in || line.rfind("   ", 0) == 0) continue;  // descriptions are indented further
    const std::string head = line.substr(0, line.find("  ", 2));
    for (std::sregex_iterator it(head.begin(), head.end(), flag), end; it != end; ++it)
      if ((*it)[2] != "--help") flags.insert((*it)[2]);
  }
  return flags;
}

// docs/cli.md's section of a subcommand: from its "## `longtrain SUB`" heading to the next "## ".
std::string cliSection(const std::string& doc, const std::string& sub) {
  const std::string heading = "## `longtrain " + sub;
  const size_t at = doc.find(heading);
  if (at == std::string::npos) return "";
  const size_t end = doc.find("\n## ", at + heading.size());
  return doc.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

TEST(DocsCli, EveryFlagOfEverySubcommandIsInItsSection) {
  const std::string doc = readText(kRoot / "docs/cli.md");
  const auto subs = subcommands();
  ASSERT_GE(subs.size(), 9u) << "the top-level --help listed too few subcommands";
  size_t checked = 0;
  for (const auto& sub : subs) {
    const std::string section = cliSection(doc, sub);
    ASSERT_FALSE(section.empty()) << "docs/cli.md has no \"## `longtrain " << sub << "`\" section";
    const auto flags = flagsOf(sub);
    for (const auto& f : flags) {
      EXPECT_NE(section.find("`" + f), std::string::npos)
          << "`longtrain " << sub << " --help` lists " << f << ", which its section of docs/cli.md does not name in backticks";
      ++checked;
    }
  }
  EXPECT_GE(checked, 50u) << "too few flags found in the --help texts";
}

// The commands of the "```bash test" blocks of docs/getting-started.md, continuation lines
// joined, comments and blank lines dropped.
std::vector<std::string> taggedCommands(const std::string& doc) {
  std::vector<std::string> out;
  bool in = false;
  std::string pending;
  for (const auto& line : lines(doc)) {
    if (!in) {
      in = line == "```bash test";
      continue;
    }
    if (line.rfind("```", 0) == 0) {
      in = false;
      continue;
    }
    std::string l = line;
    l.erase(0, l.find_first_not_of(' '));
    if (pending.empty() && (l.empty() || l[0] == '#')) continue;
    if (!l.empty() && l.back() == '\\') {
      pending += l.substr(0, l.size() - 1);
      continue;
    }
    out.push_back(pending + l);
    pending.clear();
  }
  return out;
}

TEST(DocsGettingStarted, TaggedCommandsRun) {
  const std::string doc = readText(kRoot / "docs/getting-started.md");
  const auto cmds = taggedCommands(doc);
  // The fine-tuning recipe's four steps are among them, so the test cannot pass on an empty page.
  for (const std::string step : {"longtrain tokenize", "model.init_from=", "longtrain eval", "longtrain export"})
    EXPECT_TRUE(std::any_of(cmds.begin(), cmds.end(), [&](const std::string& c) { return c.find(step) != std::string::npos; }))
        << "docs/getting-started.md's tagged commands lack '" << step << "'";
  ASSERT_GE(cmds.size(), 8u);
  const fs::path dir = lt::testing::freshTempDir("longtrain_docs_test_getting_started");
  fs::create_directory_symlink(fs::path(kBin).parent_path(), dir / "build");
  for (const char* p : {"examples", "docs"}) fs::create_directory_symlink(kRoot / p, dir / p);
  fs::create_symlink(kRoot / "README.md", dir / "README.md");
  for (const auto& cmd : cmds) {
    std::string run = cmd;
    if (run.find("longtrain train ") != std::string::npos) run += " --set train.steps=3";
    std::ofstream(dir / "cmd.sh") << "set -euo pipefail\ncd '" << dir.string() << "'\n" << run << "\n";
    const auto r = lt::testing::runCommand("bash '" + (dir / "cmd.sh").string() + "'");
    EXPECT_EQ(r.code, 0) << "docs/getting-started.md: `" << run << "` failed:\n" << r.out;
    if (r.code != 0) break;  // the commands build on each other
  }
}

}  // namespace
