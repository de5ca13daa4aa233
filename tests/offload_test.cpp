// Activation offload to disk (train.offload_dir): the file round-trips bytes and reuses its
// slots; losses and gradients are bit-identical with and without offload (1 rank, Ulysses SP,
// ZeRO-3, with schedules and kept graphs around it); the kept inputs in memory drop to the
// two the memory model counts while the file holds the others; the plan counts it; a bad
// directory or a full disk is refused at start-up in longtrain's words.
#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "longtrain/compile/activation_offload.h"
#include "longtrain/config/parse.h"
#include "longtrain/compile/executor.h"
#include "longtrain/compile/passes.h"
#include "longtrain/compile/program.h"
#include "longtrain/model/attention.h"
#include "longtrain/model/model.h"
#include "longtrain/offload/activation_file.h"
#include "longtrain/plan/memory_model.h"
#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using lt::testing::errorOf;
using lt::testing::runCommand;

const std::string kBin = LONGTRAIN_BIN;

std::vector<char> randomBytes(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = static_cast<char>(g());
  return v;
}

// Names of the entries of `dir` (the file is unlinked at creation: none should be there).
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

TEST(ActivationFile, RoundTripsBytesAndReusesItsSlots) {
  const auto dir = lt::testing::freshTempDir("longtrain_offload_file_" + std::to_string(::getpid()));
  lt::offload::ActivationFileOptions o;
  o.dir = (dir / "sub").string();  // created
  o.slotBytes = 10000;             // not a page multiple
  o.slots = 2;
  o.chunkBytes = 4096;             // several chunks per copy
  lt::offload::ActivationFile f(o);
  EXPECT_TRUE(entries(dir / "sub").empty()) << "the file must be unlinked at creation";
  const int64_t reserved = f.reservedBytes();
  EXPECT_EQ(reserved, 2 * 12288);
  EXPECT_GE(f.allocatedBytes(), reserved);  // posix_fallocate: the blocks exist

  std::vector<char> back(30000);
  for (unsigned round = 0; round < 3; ++round) {  // the same slots, new bytes each time
    auto a = randomBytes(10000, 2 * round), b = randomBytes(9000, 2 * round + 1);
    auto wa = f.write(0, a.data(), 10000, nullptr), wb = f.write(1, b.data(), 9000, nullptr);
    f.read(0, back.data(), 10000, nullptr).get();
    EXPECT_EQ(std::memcmp(back.data(), a.data(), 10000), 0) << round;
    f.read(1, back.data(), 9000, nullptr).get();
    EXPECT_EQ(std::memcmp(back.data(), b.data(), 9000), 0) << round;
    EXPECT_EQ(f.reservedBytes(), reserved) << "no allocation per step";
  }
  EXPECT_EQ(f.bytesWritten(), 3 * 19000);
  EXPECT_EQ(f.bytesRead(), 3 * 19000);

  // A larger tensor grows its slot at the end of the file; the other slot keeps its bytes.
  auto big = randomBytes(30000, 9);
  f.write(0, big.data(), 30000, nullptr);
  f.read(0, back.data(), 30000, nullptr).get();
  EXPECT_EQ(std::memcmp(back.data(), big.data(), 30000), 0);
  EXPECT_GT(f.reservedBytes(), reserved);
  auto b2 = randomBytes(9000, 5);  // round 2's slot-1 bytes
  f.read(1, back.data(), 9000, nullptr).get();
  EXPECT_EQ(std::memcmp(back.data(), b2.data(), 9000), 0);

  // The I/O thread holds `keep` until the copy is done, then drops it before completing.
  auto owner = std::make_shared<std::vector<char>>(randomBytes(5000, 11));
  std::weak_ptr<std::vector<char>> watch = owner;
  auto t = f.write(3, owner->data(), 5000, owner);  // a slot past the reserved ones
  owner.reset();
  t.get();
  EXPECT_TRUE(watch.expired());
  f.read(3, back.data(), 5000, nullptr).get();
  EXPECT_EQ(std::memcmp(back.data(), randomBytes(5000, 11).data(), 5000), 0);
}

TEST(ActivationFile, ABadDirectoryIsRefusedNamingTheKey) {
  const auto dir = lt::testing::freshTempDir("longtrain_offload_bad_" + std::to_string(::getpid()));
  std::ofstream(dir / "plain") << "x";
  lt::offload::ActivationFileOptions o;
  o.dir = (dir / "plain" / "sub").string();  // under a regular file: cannot be created
  o.slotBytes = 4096;
  o.slots = 1;
  auto e = errorOf([&] { lt::offload::ActivationFile f(o); });
  EXPECT_NE(e.find("train.offload_dir='" + o.dir + "' cannot be created"), std::string::npos) << e;
  e = errorOf([&] { lt::offload::checkOffloadDir((dir / "plain").string()); });
  EXPECT_NE(e.find("is not a directory"), std::string::npos) << e;
  EXPECT_EQ(lt::offload::checkOffloadDir(dir.string()), "");  // on a disk here (ext4)
  EXPECT_NE(lt::offload::checkOffloadDir("/dev/shm").find("tmpfs, which is memory"), std::string::npos);
}

// ---------------------------------------------------------------------------- the executor

lt::data::Batch makeBatch(int64_t b, int64_t s, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  lt::data::Batch out;
  out.input_ids = at::randint(vocab, {b, s}, gen, at::kLong);
  out.labels = out.input_ids.clone();
  out.position_ids = at::arange(s, at::kLong).unsqueeze(0).expand({b, s}).contiguous();
  out.shift_labels = lt::data::shiftLabels(out.labels);
  return out;
}

// The executor with the file against without: the same loss and every gradient element,
// two micro-batches (the slots are reused); the kept inputs in memory fall from every block's
// to the few the memory model counts, and the file takes the others.
TEST(ActivationOffload, GradientsBitIdenticalAndTheFileHoldsTheInputs) {
  at::set_num_threads(1);
  lt::model::ModelConfig mc;
  mc.vocabSize = 50;
  mc.hidden = 32;
  mc.layers = 4;
  mc.heads = 4;
  mc.kvHeads = 2;
  mc.intermediate = 48;
  const int64_t B = 2, S = 64, uD = B * S * mc.hidden * 4;
  const auto batch = makeBatch(B, S, mc.vocabSize);
  lt::compile::PassContext c;
  c.numBlocks = 4;
  const auto base = lt::compile::baseProgram(4);
  const auto dir = lt::testing::freshTempDir("longtrain_offload_exec_" + std::to_string(::getpid()));

  struct Result {
    std::vector<double> losses;
    std::vector<at::Tensor> grads;
    int64_t peak = 0, offloaded = 0;
  };
  auto runTwice = [&](lt::compile::ActivationOffload* off) {
    lt::model::Model m(mc, 7);
    const auto prog = lt::compile::applyPasses(
        base, off ? std::vector<std::string>{"free_activations", "offload_activations"}
                  : std::vector<std::string>{"free_activations"}, c);
    lt::compile::Executor ex(m, lt::model::attentionCore(mc), {}, off);
    Result r;
    for (int i = 0; i < 2; ++i) {
      lt::compile::RunOptions ro;
      ro.lossDenominator = 100;
      auto st = ex.run(prog, batch, ro);
      r.losses.push_back(st.lossSum);
      r.peak = std::max(r.peak, st.peakActivationBytes);
      r.offloaded = std::max(r.offloaded, st.offloadedBytes);
    }
    for (auto& p : m.parameters()) r.grads.push_back(p.grad().clone());
    return r;
  };
  const Result ref = runTwice(nullptr);
  lt::compile::ActivationOffload off(dir.string(), 0, uD, 3);
  const Result got = runTwice(&off);
  EXPECT_EQ(got.losses, ref.losses);
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i) EXPECT_TRUE(at::equal(got.grads[i], ref.grads[i])) << "parameter " << i;
  // Without: blocks 0-3's inputs and the final hidden state at the loss. With: blocks 0-2's
  // inputs go to the file; in memory at most block 3's input, the final hidden state and one
  // write in flight (in backward: one input and the one read ahead).
  EXPECT_EQ(ref.peak, 5 * uD);
  EXPECT_LE(got.peak, 3 * uD);
  EXPECT_EQ(got.offloaded, 3 * uD);
  EXPECT_EQ(off.file().bytesWritten(), 2 * 3 * uD);  // two micro-batches, three blocks each
  EXPECT_EQ(off.file().bytesRead(), 2 * 3 * uD);
  EXPECT_EQ(off.file().reservedBytes(), 3 * uD);     // reused: reserved once
  EXPECT_TRUE(entries(dir).empty());
}

// ---------------------------------------------------------------------------- the engine

struct Trace {
  std::vector<double> losses, gradNorms;
  std::vector<at::Tensor> params;
  std::string program;
  int64_t activationPeak = 0, written = 0;
};

Trace trainTrace(const json& j, int world, int sp, int steps) {
  std::vector<Trace> out(world);
  const auto cfg = lt::config::parseConfig(j, world);
  lt::testing::runRanks(world, sp, [&](int r, lt::comm::Groups& g) {
    lt::train::Engine e(cfg, g);
    for (int s = 0; s < steps; ++s) {
      auto m = e.step();
      out[r].losses.push_back(m.loss);
      out[r].gradNorms.push_back(m.gradNorm);  // a function of every gradient element
      out[r].activationPeak = std::max(out[r].activationPeak, m.activationPeakBytes);
    }
    out[r].params = e.fullParameters();
    out[r].program = e.program().listing();
    if (e.activationOffload()) out[r].written = e.activationOffload()->file().bytesWritten();
  }, std::chrono::milliseconds(30000), cfg.layout.R);
  return out[0];
}

json offloadConfig() {
  json j = lt::testing::tinyTrainConfig();
  j["model"]["num_layers"] = 4;
  j["gradient_clipping"] = 0.5;
  j["gradient_accumulation_steps"] = 2;
  j["activation_checkpointing"] = "all";
  return j;
}

void expectOffloadNeutral(json j, int world, int sp) {
  at::set_num_threads(1);
  const auto ref = trainTrace(j, world, sp, 3);
  const auto dir = lt::testing::freshTempDir("longtrain_offload_engine_" + std::to_string(::getpid()));
  j["train"]["offload_dir"] = dir.string();
  const auto got = trainTrace(j, world, sp, 3);
  EXPECT_NE(got.program.find("OffloadActivation(2)"), std::string::npos) << got.program;
  EXPECT_EQ(got.program.find("OffloadActivation(3)"), std::string::npos) << got.program;  // the last recomputed block
  EXPECT_EQ(got.losses, ref.losses);
  EXPECT_EQ(got.gradNorms, ref.gradNorms);
  ASSERT_EQ(got.params.size(), ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) EXPECT_TRUE(at::equal(got.params[i], ref.params[i])) << i;
  const auto cfg = lt::config::parseConfig(j, world);
  const int64_t uD = cfg.microBatch * cfg.layout.paddedLength(cfg.data.seqLen) / sp * cfg.model.hidden * 4;
  EXPECT_EQ(got.written, 3 * 2 * 3 * uD);  // 3 steps x 2 micro-batches x blocks 0-2
  EXPECT_LT(got.activationPeak, ref.activationPeak);
  EXPECT_TRUE(entries(dir).empty()) << "the rank files must be gone";
}

TEST(ActivationOffload, BitIdenticalOneRank) {
  json j = offloadConfig();
  expectOffloadNeutral(j, 1, 1);
  j["model"]["tiled_mlp"] = true;  // the custom autograd functions too
  j["model"]["loss_chunk"] = 8;
  j["model"]["attention"] = "chunked";
  j["model"]["attention_chunk"] = 8;
  expectOffloadNeutral(j, 1, 1);
}

TEST(ActivationOffload, BitIdenticalUnderUlyssesSp2) {
  json j = offloadConfig();
  j["sequence_parallel_size"] = 2;
  expectOffloadNeutral(j, 2, 2);
}

TEST(ActivationOffload, BitIdenticalUnderZero3WithItsScheduleAndSuperOffload) {
  json j = offloadConfig();
  j["zero_optimization"] = {{"stage", 3}, {"sub_group_size", 3000}, {"stage3_param_persistence_threshold", 0},
                            {"offload_optimizer", {{"device", "cpu"}, {"super_offload", true}}}};
  j["compile"] = {{"deepcompile", true},
                  {"schedule", json::parse(R"([[0, ["zero3"]], [1, ["zero3", "prefetch", "selective_gather", "free_activations"]]])")}};
  expectOffloadNeutral(j, 2, 1);
}

// Blocks that keep their graph are not offloaded; the recomputed ones before them are.
TEST(ActivationOffload, KeptGraphsStayAndTheRecomputedBlocksGo) {
  json j = offloadConfig();
  j["activation_checkpointing"] = "none";
  const auto dir = lt::testing::freshTempDir("longtrain_offload_graphs_" + std::to_string(::getpid()));
  j["train"]["offload_dir"] = dir.string();
  auto none = trainTrace(j, 1, 1, 1);
  EXPECT_EQ(none.program.find("OffloadActivation"), std::string::npos) << none.program;
  // Large enough that a kept graph shows above the start-up peak, which a tiny model's step stays
  // under when priced as the run below runs: under a budget (decommitted).
  j["model"]["hidden_size"] = 256;
  j["model"]["intermediate_size"] = 512;
  j["data"]["seq_len"] = 512;
  auto cfg = lt::config::parseConfig(j, 1);
  cfg.activationCheckpointing = lt::config::Recompute::Auto;
  cfg.train.memoryBudget = int64_t{1} << 20;  // tight: decommitted, as a budget that binds runs
  j["activation_checkpointing"] = "auto";
  // 2 graphs fit (their predicted peak within fitBytes of the budget), 3 do not.
  j["train"]["memory_budget"] = lt::plan::leastBudgetFitting(lt::plan::predictPeak(cfg, 1, 2).total());
  auto two = trainTrace(j, 1, 1, 1);
  EXPECT_NE(two.program.find("Forward(0)\nOffloadActivation(0)\nForward(1)\nForwardGraph(2)"), std::string::npos)
      << two.program;
  EXPECT_NE(two.program.find("ReloadActivation(0)\nRecomputeBackward(1)"), std::string::npos) << two.program;
}

TEST(ActivationOffload, ThePassWithoutADirectoryIsRefused) {
  json j = offloadConfig();
  j["compile"] = {{"deepcompile", true}, {"schedule", json::parse(R"([[0, ["offload_activations"]]])")}};
  auto e = errorOf([&] {
    lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) { lt::train::Engine(lt::config::parseConfig(j, 1), g); });
  });
  EXPECT_NE(e.find("compile.schedule: step 0: the 'offload_activations' pass needs train.offload_dir"),
            std::string::npos) << e;
}

// ---------------------------------------------------------------------------- the memory model

TEST(ActivationOffload, ThePlanCountsItAndTheLongestSequenceGrows) {
  json j = lt::testing::tinyTrainConfig();
  j["model"]["num_layers"] = 16;
  j["model"]["hidden_size"] = 64;
  j["model"]["attention_chunk"] = 64;
  j["model"]["loss_chunk"] = 64;
  j["model"]["tiled_mlp"] = true;
  j["data"]["seq_len"] = 8192;
  j["activation_checkpointing"] = "all";
  auto plain = lt::config::parseConfig(j, 1);
  j["train"]["offload_dir"] = "/nonexistent/the/plan/writes/nothing";
  auto off = lt::config::parseConfig(j, 1);
  const double uD = 2.0 * 8192 * 64 * 4;  // micro batch 2
  const auto a = lt::plan::predictPeak(plain, 1, 0), b = lt::plan::predictPeak(off, 1, 0);
  EXPECT_EQ(a.offloaded, 0);
  EXPECT_EQ(b.offloaded, static_cast<int64_t>(15 * uD));  // every recomputed block but the last
  // At the peak without: at least 16 block inputs (backward of block 15, or 17 at the loss); with:
  // at most 3 (at the loss: block 15's, the final hidden state, one write in flight), + the batch.
  EXPECT_GE(static_cast<double>(a.activations), 16 * uD) << a.phase;
  EXPECT_LE(static_cast<double>(b.activations), 3 * uD + 48.0 * 2 * 8192) << b.phase;
  EXPECT_LT(b.total(), a.total());
  // Kept graphs are not offloaded: with every block keeping its graph the two agree.
  EXPECT_EQ(lt::plan::predictPeak(plain, 1, 16).total(), lt::plan::predictPeak(off, 1, 16).total());
  const int64_t budget = int64_t{400} << 20;
  const int64_t sa = lt::plan::maxSeqLen(plain, 1, budget), sb = lt::plan::maxSeqLen(off, 1, budget);
  EXPECT_GT(sb, 3 * sa / 2) << sa << " -> " << sb;
}

// ---------------------------------------------------------------------------- through the CLI

fs::path writeConfig(const std::string& name, const json& j) {
  return lt::testing::writeJsonFile("longtrain_offload_cli_" + std::to_string(::getpid()), name, j);
}

TEST(ActivationOffloadCli, TrainsPrintsWhatItOffloadsAndLeavesNothingBehind) {
  const auto dir = lt::testing::freshTempDir("longtrain_offload_clidir_" + std::to_string(::getpid()));
  json j = offloadConfig();
  j["train"]["offload_dir"] = (dir / "acts").string();
  const auto metrics = dir / "m.jsonl";
  auto r = runCommand(kBin + " train " + writeConfig("ok.json", j).string() + " --nproc 2 --metrics " + metrics.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("activation offload: 3 of 4 block inputs to a file in " + (dir / "acts").string()),
            std::string::npos) << r.out;
  EXPECT_TRUE(entries(dir / "acts").empty());
  std::ifstream f(metrics);
  int lines = 0;
  for (std::string line; std::getline(f, line); ++lines) {  // the I/O thread worked; waits are reported
    const json m = json::parse(line);
    EXPECT_GT(m.at("offload_io_s").get<double>(), 0) << line;
    EXPECT_GE(m.at("offload_wait_s").get<double>(), 0) << line;
  }
  EXPECT_EQ(lines, 3);
  auto p = runCommand(kBin + " plan " + writeConfig("ok.json", j).string());
  EXPECT_NE(p.out.find("offloaded to disk"), std::string::npos) << p.out;
}

TEST(ActivationOffloadCli, AnUncreatableDirectoryIsRefusedOnceBeforeLaunching) {
  const auto dir = lt::testing::freshTempDir("longtrain_offload_clibad_" + std::to_string(::getpid()));
  std::ofstream(dir / "plain") << "x";
  json j = offloadConfig();
  j["train"]["offload_dir"] = (dir / "plain" / "acts").string();
  auto r = runCommand(kBin + " train " + writeConfig("bad.json", j).string() + " --nproc 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("train.offload_dir='" + (dir / "plain" / "acts").string() + "' cannot be created"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rank 0"), std::string::npos) << "refused before any rank started:\n" << r.out;
}

// A full disk and a read-only one, on a small tmpfs mounted in a mount namespace (root only).
TEST(ActivationOffloadCli, AFullOrReadOnlyDiskIsFoundAtStartUp) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (mounts a tmpfs in a mount namespace)";
  const auto dir = lt::testing::freshTempDir("longtrain_offload_disk_" + std::to_string(::getpid()));
  if (runCommand("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs " + dir.string() + "'").code != 0)
    GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace here";
  const std::string mnt = (dir / "mnt").string();
  fs::create_directories(mnt);
  json j = offloadConfig();
  j["data"]["seq_len"] = 512;  // 3 blocks x [2, 512, 32] fp32 = 384 KiB per rank
  j["train"]["offload_dir"] = mnt;
  const auto cfg = writeConfig("disk.json", j).string();
  auto inTmpfs = [&](const std::string& opts) {
    return runCommand("unshare -m bash -c 'mount -t tmpfs -o " + opts + " tmpfs " + mnt + " && " + kBin + " train " +
                      cfg + " --nproc 2'");
  };
  auto full = inTmpfs("size=256k");
  EXPECT_EQ(full.code, 1) << full.out;
  EXPECT_NE(full.out.find("train.offload_dir='" + mnt + "': reserving 0.4 MiB for rank"), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("No space left on device; the disk has"), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("(3 block inputs of [2, 512, 32] fp32)"), std::string::npos) << full.out;
  EXPECT_EQ(full.out.find("step 1/"), std::string::npos) << full.out;
  auto ro = inTmpfs("ro");
  EXPECT_EQ(ro.code, 1) << ro.out;
  EXPECT_NE(ro.out.find("train.offload_dir='" + mnt + "' is not writable: Read-only file system"), std::string::npos)
      << ro.out;
}

}  // namespace
