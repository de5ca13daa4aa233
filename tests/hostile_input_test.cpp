// Issue 33's classes through the binary, as a user meets them: messages that name only what the
// user gave (never an option of another subcommand), input errors printed once before ranks are
// launched, and hostile input (non-regular files in every input slot, huge in-range counts, odd
// output paths, an unusable TMPDIR) refused with exit 1 and a message, never a signal, a hang or
// library text. Non-obvious: each case runs under `timeout -s KILL 30`, so a hang fails as exit 137
// instead of holding the suite.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kBin = LONGTRAIN_BIN;
const fs::path kModel = fs::path(LONGTRAIN_SOURCE_DIR) / "tests" / "fixtures" / "hf_llama" / "gqa_untied";

lt::testing::CommandResult run(const std::string& args) {
  return lt::testing::runCommand("timeout -s KILL 30 " + kBin + " " + args);
}

json tinyConfig() {
  json j = lt::testing::tinyTrainConfig();
  j["train_micro_batch_size_per_gpu"] = 2;
  j["train"] = {{"steps", 1}, {"threads", 1}, {"comm_timeout_s", 5}, {"eval_every", 0}};
  return j;
}

void writeTokens(const fs::path& p, size_t bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  for (size_t i = 0; i < bytes; ++i) f.put(static_cast<char>(i % 2 ? 0 : i % 7));
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// An error of the user's making: exit 1 with `expect` in the message, no library text.
void expectRefused(const lt::testing::CommandResult& r, const std::string& expect, const std::string& args) {
  EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
  EXPECT_NE(r.out.find(expect), std::string::npos) << args << "\n" << r.out;
  for (const char* library : {"filesystem error", "bad_alloc", "terminate called", "std::", "basic_string"})
    EXPECT_EQ(r.out.find(library), std::string::npos) << library << " in:\n" << args << "\n" << r.out;
}

// Every subcommand names its inputs by its own words: an option of another subcommand or a
// config key the user did not give never appears in its messages.
TEST(UserWords, MessagesNameOnlyWhatTheUserGave) {
  const fs::path d = lt::testing::freshTempDir("longtrain_userwords_" + std::to_string(::getpid()));
  fs::create_directories(d / "empty");
  writeTokens(d / "short.bin", 20);  // 10 uint16 tokens
  writeTokens(d / "odd.bin", 21);
  json sp = tinyConfig();
  sp["sequence_parallel_size"] = 2;
  const fs::path spCfg = lt::testing::writeJsonFile(d.filename().string(), "sp.json", sp);
  const std::string none = (d / "none").string(), empty = (d / "empty").string();
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"export " + none + " --out " + (d / "o").string(), "export CKPT '" + none + "' does not exist (absolute"},
      {"export " + empty + " --out " + (d / "o").string(), "export CKPT '" + empty + "' holds no complete checkpoint"},
      {"generate " + none + " --prompt-ids 1,2", "generate MODEL '" + none + "' does not exist"},
      {"generate " + empty + " --prompt-ids 1,2", "generate MODEL '" + empty + "' holds no complete checkpoint"},
      {"eval " + none + " --data " + (d / "short.bin").string() + " --seq-len 8 --dtype uint16", "eval MODEL"},
      {"eval " + kModel.string() + " --data " + (d / "short.bin").string() + " --seq-len 16 --dtype uint16",
       "fewer than one window of --seq-len=16"},
      {"eval " + kModel.string() + " --data " + (d / "odd.bin").string() + " --seq-len 4 --dtype uint16",
       "(wrong --dtype?)"},
      {"train " + spCfg.string() + " --nproc 1", "launch a multiple of 2 ranks, e.g. --nproc 2"},
      {"plan " + spCfg.string() + " --nproc 3", "e.g. --nproc 4"},
  };
  const std::vector<std::string> foreign = {"--resume", "data.path", "data.seq_len", "data.type", "model.init_from",
                                            "train.checkpoint.dir", "train.eval", "--data", "--seq-len", "--dtype"};
  for (const auto& c : cases) {
    const auto r = run(c.args);
    expectRefused(r, c.expect, c.args);
    for (const auto& name : foreign) {
      if (c.args.find(name) != std::string::npos) continue;  // the user's own word may come back
      EXPECT_EQ(r.out.find(name), std::string::npos) << "'" << name << "' named to a user who gave:\n"
                                                     << c.args << "\n" << r.out;
    }
  }
}

// What each rank would refuse is found by the launcher before any rank starts: one message.
TEST(UserWords, InputErrorsPrintOnceBeforeLaunch) {
  const fs::path d = lt::testing::freshTempDir("longtrain_once_" + std::to_string(::getpid()));
  writeTokens(d / "odd.bin", 4097);
  fs::create_directories(d / "noweights");
  fs::copy_file(kModel / "config.json", d / "noweights" / "config.json");
  json odd = tinyConfig();
  odd["data"] = {{"type", "uint16"}, {"path", (d / "odd.bin").string()}, {"seq_len", 32}};
  json weights = tinyConfig();
  weights["model"] = {{"init_from", (d / "noweights").string()}};
  json few = tinyConfig();
  few["data"]["num_samples"] = 2;  // fewer than one global batch of 4
  few["data"]["eval_samples"] = 0;
  struct Case {
    json config;
    std::string expect;
  };
  for (const auto& c : std::vector<Case>{{odd, "is not a multiple of the token width"},
                                         {weights, "has neither model.safetensors"},
                                         {few, "fewer than one global batch"}}) {
    const fs::path cfg = lt::testing::writeJsonFile(d.filename().string(), "c.json", c.config);
    const auto r = run("train " + cfg.string() + " --nproc 2");
    expectRefused(r, c.expect, c.config.dump());
    EXPECT_EQ(count(r.out, c.expect), 1u) << r.out;
    EXPECT_EQ(r.out.find("rank 1"), std::string::npos) << r.out;
  }
  const std::string eval = "eval " + kModel.string() + " --data " + (d / "odd.bin").string() +
                           " --seq-len 4 --dtype uint16 --nproc 2";
  const auto r = run(eval);
  expectRefused(r, "is not a multiple of the token width", eval);
  EXPECT_EQ(count(r.out, "is not a multiple of the token width"), 1u) << r.out;
}

// A FIFO (its open would block), a directory, a character device and a socket, in every slot
// that names an input file: refused at once with exit 1, naming the file.
TEST(HostileInput, NonRegularFilesInEveryInputSlot) {
  const fs::path d = lt::testing::freshTempDir("longtrain_irregular_" + std::to_string(::getpid()));
  writeTokens(d / "tokens.bin", 4096);
  const fs::path goodCfg = lt::testing::writeJsonFile(d.filename().string(), "good.json", tinyConfig());
  // Makes `p` the kind of file named; "" when this machine cannot.
  auto make = [&](const std::string& kind, const fs::path& p) {
    fs::remove_all(p);
    if (kind == "fifo") return ::mkfifo(p.c_str(), 0600) == 0;
    if (kind == "directory") return fs::create_directories(p);
    if (kind == "device") return ::symlink("/dev/zero", p.c_str()) == 0;
    return lt::testing::runCommand("python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('" + p.string() +
                                   "')\"").code == 0;
  };
  // Each slot: where the odd file goes, and the command that reads it.
  struct Slot {
    std::string name;
    fs::path file;
    std::function<std::string()> args;
  };
  auto trainWith = [&](const json& data) {
    json j = tinyConfig();
    j["data"] = data;
    return "train " + lt::testing::writeJsonFile(d.filename().string(), "slot.json", j).string();
  };
  const std::vector<Slot> slots = {
      {"config", d / "x.json", [&] { return "train " + (d / "x.json").string(); }},
      {"data.path", d / "x.bin",
       [&] { return trainWith({{"type", "uint16"}, {"path", (d / "x.bin").string()}, {"seq_len", 32}}); }},
      {"sidecar", d / "tokens.bin.json",
       [&] { return trainWith({{"type", "uint16"}, {"path", (d / "tokens.bin").string()}, {"seq_len", 32}}); }},
      {"data.tokenizer", d / "tok.json", [&] { return "train " + goodCfg.string() + " --set data.tokenizer='\"" +
                                                       (d / "tok.json").string() + "\"'"; }},
      {"init_from config.json", d / "m" / "config.json", [&] {
         return "train " + goodCfg.string() + " --set model.init_from='\"" + (d / "m").string() + "\"'"; }},
      {"eval --data", d / "e.bin",
       [&] { return "eval " + kModel.string() + " --data " + (d / "e.bin").string() + " --seq-len 8 --dtype uint16"; }},
      {"generate --tokenizer", d / "g.model",
       [&] { return "generate " + kModel.string() + " --prompt hi --tokenizer " + (d / "g.model").string(); }},
      {"tokenize input", d / "in.txt",
       [&] { return "tokenize --tokenizer " + (d / "none.model").string() + " --train-tokenizer 300 " +
                    (d / "in.txt").string(); }},
      {"--resume manifest", d / "ck" / "step-00000002" / "manifest.json",
       [&] { return "train " + goodCfg.string() + " --resume " + (d / "ck").string(); }},
      {"plot metrics", d / "m.jsonl", [&] { return "plot " + (d / "m.jsonl").string() + " --out " + (d / "p.svg").string(); }},
  };
  for (const char* kind : {"fifo", "directory", "device", "socket"}) {
    for (const auto& s : slots) {
      fs::create_directories(s.file.parent_path());
      if (!make(kind, s.file)) {
        ADD_FAILURE() << "cannot make a " << kind << " at " << s.file;
        continue;
      }
      const std::string args = s.args();
      const auto r = run(args);
      EXPECT_EQ(r.code, 1) << kind << " as " << s.name << ": " << args << "\n" << r.out;
      const bool named = r.out.find("is not a regular file") != std::string::npos ||
                         r.out.find("is a directory") != std::string::npos ||
                         r.out.find("holds neither tokenizer.json") != std::string::npos;  // a tokenizer directory
      EXPECT_TRUE(named) << kind << " as " << s.name << ": " << args << "\n" << r.out;
      fs::remove_all(s.file);
    }
  }
}

// Counts in range one by one that size an allocation or a loop: refused naming the key, or run.
TEST(HostileInput, HugeCountsAreRefusedNamingTheKey) {
  const fs::path cfg = lt::testing::writeJsonFile("longtrain_counts", "c.json", tinyConfig());
  const std::string big = std::to_string(int64_t{1} << 50);
  for (const char* key : {"data.num_samples", "data.eval_samples"}) {
    const std::string args = "train " + cfg.string() + " --set " + key + "=" + big;
    expectRefused(run(args), std::string("config key '") + key + "' = " + big, args);
  }
  const std::string needle = "eval " + kModel.string() + " --needle --lengths 64," + big;
  expectRefused(run(needle), "--lengths: a prompt of " + big + " tokens needs a", needle);
  // A tile longer than the sequence is one tile; sizes that only bound a buffer from above run.
  for (const char* key : {"model.attention_chunk", "model.loss_chunk", "zero_optimization.reduce_bucket_size",
                          "steps_per_print", "train.checkpoint.keep_last"}) {
    const std::string args = "train " + cfg.string() + " --set " + key + "=" + big;
    const auto r = run(args);
    EXPECT_EQ(r.code, 0) << args << "\n" << r.out;
  }
}

// export --out to a path it cannot write, and filesystem trouble elsewhere: a message naming the
// path and the fix, never libstdc++'s "filesystem error"; nothing written.
TEST(HostileInput, OddOutputPathsAndAnUnusableTmpdir) {
  const fs::path d = lt::testing::freshTempDir("longtrain_oddpaths_" + std::to_string(::getpid()));
  json j = tinyConfig();
  j["train"]["checkpoint"] = {{"dir", (d / "ck").string()}, {"every_steps", 1}};
  const fs::path cfg = lt::testing::writeJsonFile(d.filename().string(), "c.json", j);
  ASSERT_EQ(run("train " + cfg.string()).code, 0);
  std::ofstream(d / "file") << "x";
  const std::string ck = (d / "ck").string();
  struct Case {
    std::string out, expect;
  };
  for (const auto& c : std::vector<Case>{
           {(d / "file").string(), "exists and is not a directory"},
           {(d / "file" / "sub").string(), "cannot be created"},
           {(d / "file" / "w.safetensors").string(), "is not a directory"},
           {"/proc/longtrain_export", "cannot be created"},
       }) {
    const std::string args = "export " + ck + " --out " + c.out;
    expectRefused(run(args), c.expect, args);
  }
  fs::create_directories(d / "dir.safetensors");
  expectRefused(run("export " + ck + " --out " + (d / "dir.safetensors").string()), "is a directory", "dir.safetensors");
  EXPECT_TRUE(fs::is_empty(d / "dir.safetensors"));
  const auto r = lt::testing::runCommand("env TMPDIR=" + (d / "file").string() + " timeout -s KILL 30 " + kBin + " train " +
                                         cfg.string() + " --nproc 2 --set train.checkpoint.dir='\"" +
                                         (d / "ck2").string() + "\"'");
  expectRefused(r, "set TMPDIR to a directory", "TMPDIR=file");
}

}  // namespace
