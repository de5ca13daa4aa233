// Several hosts and the faults between them, through the CLI as a user runs it. Two hosts are
// two network namespaces joined by a veth pair (scripts/netns_hosts.sh; root and iproute2's
// `ip`; `tc` for a partition); where they cannot be made the tests report SKIPPED with the
// reason, never passed.
// The rest (job identity, a port another job holds, preemption) needs no namespace.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "longtrain/comm/launch.h"

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using lt::testing::runCommand;

const std::string kBin = LONGTRAIN_BIN;
const std::string kHosts = std::string("bash ") + LONGTRAIN_SOURCE_DIR + "/scripts/netns_hosts.sh";

json smallConfig(int steps) {
  json j = lt::testing::tinyTrainConfig();
  j["train_micro_batch_size_per_gpu"] = 2;
  j["sequence_parallel_size"] = 2;
  j["train"] = {{"steps", steps}, {"threads", 1}, {"comm_timeout_s", 5}, {"eval_every", 0}};
  return j;
}

// A shell script (subshells, background jobs) under runCommand's timeout.
lt::testing::CommandResult runScript(const std::string& script) {
  static int n = 0;
  const fs::path f = fs::temp_directory_path() / ("longtrain_multihost_script_" + std::to_string(::getpid()) + "_" +
                                                  std::to_string(n++) + ".sh");
  std::ofstream(f) << script << "\n";
  auto r = runCommand("bash " + f.string());
  fs::remove(f);
  return r;
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> v;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) v.push_back(json::parse(line)["loss"].get<double>());
  return v;
}

// Two namespaces <name>a (10.<subnet>.1) and <name>b (10.<subnet>.2), removed on destruction.
class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    const int pid = static_cast<int>(::getpid());
    name_ = "lt" + std::to_string(pid % 100000);
    subnet_ = std::to_string(100 + pid % 150) + "." + std::to_string((pid / 150) % 250);
    if (::geteuid() != 0) GTEST_SKIP() << "two-host tests need root (network namespaces)";
    if (runScript("command -v ip").code != 0) GTEST_SKIP() << "two-host tests need `ip` (Debian iproute2)";
    auto up = runCommand(kHosts + " up " + name_ + " " + subnet_);
    if (up.code != 0) {
      runCommand(kHosts + " down " + name_);
      GTEST_SKIP() << "cannot create network namespaces here: " << up.out;
    }
    made_ = true;
    dir_ = lt::testing::freshTempDir("longtrain_multihost_" + std::to_string(pid));
  }
  void TearDown() override {
    if (made_) runCommand(kHosts + " down " + name_);
  }
  std::string addr(char host) const { return "10." + subnet_ + (host == 'a' ? ".1" : ".2"); }
  // The command line of node `node` (2 ranks per node), run inside its namespace.
  std::string node(int node, const fs::path& cfg, const std::string& extra, int rdzvTimeoutS = 30) const {
    return "ip netns exec " + name_ + (node == 0 ? "a " : "b ") + kBin + " train " + cfg.string() +
           " --nnodes 2 --nproc-per-node 2 --master-addr " + addr('a') + " --master-port 29400 --rdzv-id " + name_ +
           " --rdzv-timeout " + std::to_string(rdzvTimeoutS) + " --node-rank " + std::to_string(node) + " " + extra;
  }
  std::string name_, subnet_;
  fs::path dir_;
  bool made_ = false;
};

TEST_F(TwoHosts, SpTimesDpMatchesOneHostBitForBit) {
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", smallConfig(6));
  auto two = runScript("(" + node(1, cfg, "") + " > " + (dir_ / "n1.log").string() + " 2>&1 &) ; " +
                        node(0, cfg, "--metrics " + (dir_ / "two.jsonl").string()));
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("gloo binds " + addr('a')), std::string::npos) << two.out;
  auto one = runCommand(kBin + " train " + cfg.string() + " --nproc 4 --metrics " + (dir_ / "one.jsonl").string());
  ASSERT_EQ(one.code, 0) << one.out;
  const auto a = losses(dir_ / "two.jsonl"), b = losses(dir_ / "one.jsonl");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;  // bit-identical
}

// A host's ranks and launcher vanish (SIGKILL) mid-run: node 0's ranks name them and their
// host, its launcher names the lost node, and everything on node 0 ends within the bound.
TEST_F(TwoHosts, LostHostIsNamedWithinTheTimeout) {
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", smallConfig(100000));
  const std::string metrics = (dir_ / "m.jsonl").string();
  auto r = runScript("(" + node(1, cfg, "") + " > /dev/null 2>&1 &) ; (" + node(0, cfg, "--metrics " + metrics) +
                      "; echo \"node0 exit $? at $(date +%s.%N)\") & "
                      "for i in $(seq 1 300); do [ -s " + metrics + " ] && break; sleep 0.1; done; "
                      "pkill -KILL -f -- '" + cfg.string() + ".*--node-rank 1'; echo \"killed at $(date +%s.%N)\"; wait");
  auto at = [&](const std::string& tag) {
    auto p = r.out.find(tag);
    return p == std::string::npos ? -1.0 : std::stod(r.out.substr(p + tag.size()));
  };
  ASSERT_GT(at("killed at "), 0) << r.out;
  EXPECT_NE(r.out.find("node0 exit 1"), std::string::npos) << r.out;
  const double seconds = at("node0 exit 1 at ") - at("killed at ");
  EXPECT_LT(seconds, 5 + 10) << r.out;                   // train.comm_timeout_s + 10
  EXPECT_NE(r.out.find("lost rank(s): 2 (host"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(addr('b')), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node 1's launcher stopped"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("a slow rank"), std::string::npos) << r.out;
}

// One rank dies; --max-restarts makes both nodes' launchers tear down and re-rendezvous, and
// the resumed run's losses equal an uninterrupted one's.
TEST_F(TwoHosts, RestartOnEveryNodeResumesExactly) {
  json j = smallConfig(8);
  j["train"]["checkpoint"] = {{"dir", (dir_ / "ck").string()}, {"every_steps", 2}};
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", j);
  const std::string metrics = (dir_ / "m.jsonl").string();
  auto r = runScript("(LONGTRAIN_FAULT_KILL_RANK=3 LONGTRAIN_FAULT_KILL_STEP=5 " + node(1, cfg, "--max-restarts 1") +
                      " > " + (dir_ / "n1.log").string() + " 2>&1 &) ; LONGTRAIN_FAULT_KILL_RANK=3 " +
                      "LONGTRAIN_FAULT_KILL_STEP=5 " + node(0, cfg, "--max-restarts 1 --metrics " + metrics));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("restarting the job"), std::string::npos) << r.out;
  json plain = smallConfig(8);
  auto pcfg = lt::testing::writeJsonFile(dir_.filename().string(), "plain.json", plain);
  auto one = runCommand(kBin + " train " + pcfg.string() + " --nproc 4 --metrics " + (dir_ / "one.jsonl").string());
  ASSERT_EQ(one.code, 0) << one.out;
  auto a = losses(metrics), b = losses(dir_ / "one.jsonl");
  ASSERT_EQ(b.size(), 8u);
  ASSERT_GE(a.size(), 8u);  // steps 5.. of the first attempt, then the resumed 5..8
  std::vector<double> last(a.end() - 4, a.end());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(last[i], b[4 + i]) << "step " << 5 + i;
}

// A partition of three times train.comm_timeout_s mid-run (a zero-length tc queue on both
// ends drops every packet, so no connection is reset, as in a real partition), with node 1
// started well before node 0: both launchers wait out the partition (--rdzv-timeout), restart,
// every node exits 0, and the final loss equals an uninterrupted run's bit for bit.
TEST_F(TwoHosts, PartitionRestartsAndFinishesExactly) {
  json j = smallConfig(60);
  j["train"]["checkpoint"] = {{"dir", (dir_ / "ck").string()}, {"every_steps", 5}};
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", j);
  const std::string metrics = (dir_ / "m.jsonl").string(), n1 = (dir_ / "n1.log").string();
  auto queues = [&](const std::string& verb) {
    std::string cmd;
    for (const char* h : {"a", "b"})
      cmd += "ip netns exec " + name_ + h + " tc qdisc " + verb + " dev " + name_ + "v" + h + " root" +
             (verb == "replace" ? " pfifo limit 0" : "") + "; ";
    return cmd;
  };
  auto r = runScript("(" + node(1, cfg, "--max-restarts 2") + " > " + n1 + " 2>&1; echo \"node1 exit $?\" >> " + n1 +
                     ") & sleep 4; (" + node(0, cfg, "--max-restarts 2 --metrics " + metrics) +
                     "; echo \"node0 exit $?\") & for i in $(seq 1 600); do [ \"$(wc -l < " + metrics +
                     " 2>/dev/null || echo 0)\" -ge 8 ] && break; sleep 0.1; done; " + queues("replace") +
                     "echo partitioned; sleep 15; " + queues("del") + "echo healed; wait; cat " + n1);
  EXPECT_NE(r.out.find("partitioned"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node0 exit 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node1 exit 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("retrying until --rdzv-timeout"), std::string::npos) << r.out;  // node 1 came first
  EXPECT_NE(r.out.find("restarting the job"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resume: from " + (dir_ / "ck").string()), std::string::npos) << r.out;  // not from step 0
  json plain = smallConfig(60);
  auto pcfg = lt::testing::writeJsonFile(dir_.filename().string(), "plain.json", plain);
  auto one = runCommand(kBin + " train " + pcfg.string() + " --nproc 4 --metrics " + (dir_ / "one.jsonl").string());
  ASSERT_EQ(one.code, 0) << one.out;
  const auto a = losses(metrics), b = losses(dir_ / "one.jsonl");
  ASSERT_EQ(b.size(), 60u);
  ASSERT_GE(a.size(), 60u) << r.out;  // and the steps after the resumed checkpoint again, if any ran
  EXPECT_EQ(a.back(), b.back()) << r.out;  // bit-identical final loss
}

// `train --fit` across two hosts, the link shaped to 200 Mbit/s each way: node 1 measures it through
// node 0's store, node 0 chooses for the job (its report names the link), node 1's launcher runs
// node 0's choice, and both nodes' ranks train it to the end.
TEST_F(TwoHosts, FitAcrossNodesRunsNodeZerosChoiceOnEveryNode) {
  for (const char* h : {"a", "b"})
    ASSERT_EQ(runCommand("ip netns exec " + name_ + h + " tc qdisc replace dev " + name_ + "v" + h +
                         " root tbf rate 200mbit burst 1mb latency 50ms").code, 0);
  json j = smallConfig(2);
  j.erase("sequence_parallel_size");
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", j);
  const std::string n1 = (dir_ / "n1.log").string(), metrics = (dir_ / "m.jsonl").string();
  // --rdzv-timeout also bounds node 0's search (its calibration runs), slower on a loaded machine.
  auto r = runScript("(" + node(1, cfg, "--fit 2GiB", 300) + " > " + n1 + " 2>&1; echo \"node1 exit $?\" >> " + n1 +
                     ") & " + node(0, cfg, "--fit 2GiB --metrics " + metrics, 300) + "; echo \"node0 exit $?\"; wait; cat " + n1);
  EXPECT_NE(r.out.find("node0 exit 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node1 exit 0"), std::string::npos) << r.out;
  const auto measured = r.out.find("the link to node 0 moves ");
  ASSERT_NE(measured, std::string::npos) << r.out;
  const double gbit = std::stod(r.out.substr(measured + 25));
  EXPECT_GT(gbit, 0.1) << r.out;  // tbf passes its rate; TCP over it reaches most of it
  EXPECT_LT(gbit, 0.25) << r.out;  // and its 1 MB burst lets the first 8 MiB run ~14% over
  EXPECT_NE(r.out.find("fit: 2 nodes x 2 ranks, the link between nodes at"), std::string::npos) << r.out;
  const std::string how = "train runs it with: --nnodes 2 --nproc-per-node 2";
  const auto chosen = r.out.find(how);
  ASSERT_NE(chosen, std::string::npos) << r.out;
  // Node 1 runs exactly the --set flags node 0 printed.
  const size_t from = chosen + how.size();
  const std::string flags = r.out.substr(from, r.out.find('\n', from) - from);
  std::string unquoted;
  for (char ch : flags)
    if (ch != '\'') unquoted += ch;
  EXPECT_NE(r.out.find("runs node 0's choice:" + unquoted), std::string::npos) << unquoted << "\n" << r.out;
  EXPECT_EQ(losses(metrics).size(), 2u) << r.out;
}

// Node 0 started with --fit, node 1 without: both are refused at once, naming the flag, instead of
// waiting out --rdzv-timeout.
TEST_F(TwoHosts, FitOnOneNodeOnlyIsRefusedOnBoth) {
  json j = smallConfig(2);
  j.erase("sequence_parallel_size");
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", j);
  const std::string n1 = (dir_ / "n1.log").string();
  auto r = runScript("(" + node(1, cfg, "", 300) + " > " + n1 + " 2>&1; echo \"node1 exit $?\" >> " + n1 + ") & " +
                     "S=$(date +%s); " + node(0, cfg, "--fit 2GiB", 300) + "; echo \"node0 exit $? after $(( $(date +%s) - S )) s\"; " +
                     "wait; cat " + n1);
  EXPECT_NE(r.out.find("node0 exit 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node1 exit 1"), std::string::npos) << r.out;
  const std::string why = "node 0 was started with --fit, node 1 without --fit; start every node with the same --fit";
  int said = 0;
  for (size_t at = r.out.find(why); at != std::string::npos; at = r.out.find(why, at + 1)) ++said;
  EXPECT_GE(said, 2) << r.out;  // each node says it
  const auto after = r.out.find("node0 exit 1 after ");
  ASSERT_NE(after, std::string::npos) << r.out;
  EXPECT_LT(std::stoi(r.out.substr(after + 19)), 120) << r.out;  // not the 300 s timeout
}

// Two torchrun-style ranks, one with another --set: both stop before training, naming the key.
TEST(JobIdentity, RanksThatDisagreeStopNamingTheKey) {
  auto dir = lt::testing::freshTempDir("longtrain_identity_" + std::to_string(::getpid()));
  auto cfg = lt::testing::writeJsonFile(dir.filename().string(), "c.json", smallConfig(3));
  const std::string env = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(lt::comm::findFreePort());
  auto r = runScript("(" + env + " RANK=1 " + kBin + " train " + cfg.string() + " --set optimizer.params.lr=0.02; " +
                      "echo rank1 exit $?) & " + env + " RANK=0 " + kBin + " train " + cfg.string() +
                      "; echo rank0 exit $?; wait");
  EXPECT_NE(r.out.find("rank0 exit 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank1 exit 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer.params.lr: rank 0 = 0.01; rank 1 = 0.02"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << r.out;
}

// A second job started on the first one's MASTER_PORT fails at once and the first finishes.
TEST(JobIdentity, SecondJobOnAPortInUseIsRefused) {
  auto dir = lt::testing::freshTempDir("longtrain_port_" + std::to_string(::getpid()));
  auto longCfg = lt::testing::writeJsonFile(dir.filename().string(), "long.json", smallConfig(600));
  auto shortCfg = lt::testing::writeJsonFile(dir.filename().string(), "short.json", smallConfig(2));
  const std::string env = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(lt::comm::findFreePort());
  const std::string first = "(" + env + " RANK=0 " + kBin + " train " + longCfg.string() + " --metrics " +
                            (dir / "first.jsonl").string() + "; echo first0 exit $?) & (" + env + " RANK=1 " + kBin +
                            " train " + longCfg.string() + "; echo first1 exit $?) & ";
  const std::string wait = "for i in $(seq 1 300); do [ -s " + (dir / "first.jsonl").string() +
                           " ] && break; sleep 0.1; done; ";
  const std::string second = "(" + env + " RANK=0 " + kBin + " train " + shortCfg.string() + "; echo second0 exit $?)" +
                             "; (" + env + " RANK=1 " + kBin + " train " + shortCfg.string() + "; echo second1 exit $?)";
  auto r = runScript(first + wait + second + "; wait");
  EXPECT_NE(r.out.find("second0 exit 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is in use"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("second1 exit 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("another job uses that port"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first0 exit 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first1 exit 0"), std::string::npos) << r.out;
}

// A 2-rank DP run of up to 3000 steps in the background (its launcher's pid in $L, a rank's in
// $R), to be signalled by `signals` once its first step is recorded; a checkpoint dir when
// `checkpoint`.
struct PreemptedRun {
  fs::path dir;
  json config;
  fs::path configFile;
  std::string metrics;
  lt::testing::CommandResult result;
};

PreemptedRun preempt(const std::string& name, bool checkpoint, double commTimeoutS, const std::string& signals) {
  PreemptedRun p;
  p.dir = lt::testing::freshTempDir("longtrain_preempt_" + name + "_" + std::to_string(::getpid()));
  p.config = smallConfig(3000);
  p.config["sequence_parallel_size"] = 1;
  p.config["train"]["comm_timeout_s"] = commTimeoutS;
  if (checkpoint) p.config["train"]["checkpoint"] = {{"dir", (p.dir / "ck").string()}};
  p.configFile = lt::testing::writeJsonFile(p.dir.filename().string(), "c.json", p.config);
  p.metrics = (p.dir / "m.jsonl").string();
  p.result = runScript(kBin + " train " + p.configFile.string() + " --nproc 2 --metrics " + p.metrics + " & L=$!; " +
                       "for i in $(seq 1 300); do [ -s " + p.metrics + " ] && break; sleep 0.1; done; " +
                       "R=$(awk -v p=$L '$4 == p { print $1 }' /proc/[0-9]*/stat 2>/dev/null | tail -n 1); " +
                       signals);
  return p;
}

// The steps run before the stop, each checked to have a checkpoint of the last.
size_t stepsCheckpointed(const PreemptedRun& p) {
  const auto steps = losses(p.metrics).size();
  EXPECT_GT(steps, 0u);
  EXPECT_LT(steps, 3000u) << "the run ended before the signal";
  EXPECT_TRUE(fs::exists(p.dir / "ck" / fmt::format("step-{:08d}", steps))) << p.result.out;
  return steps;
}

// SIGTERM to the launcher: every rank finishes its step, one checkpoint is saved, the exit code
// is 143, and --resume continues to the same losses as an uninterrupted run.
TEST(Preemption, SigtermCheckpointsAndResumesExactly) {
  auto p = preempt("term", true, 5, "sleep 0.3; kill -TERM $L; wait $L; echo \"exit $?\"");
  EXPECT_NE(p.result.out.find("exit 143"), std::string::npos) << p.result.out;
  EXPECT_NE(p.result.out.find("stop: Terminated after step"), std::string::npos) << p.result.out;
  json j = p.config;
  j["train"]["steps"] = static_cast<int>(stepsCheckpointed(p)) + 5;
  auto cfg = lt::testing::writeJsonFile(p.dir.filename().string(), "c.json", j);
  auto resumed = runCommand(kBin + " train " + cfg.string() + " --nproc 2 --resume --metrics " + p.metrics);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  j["train"].erase("checkpoint");
  auto plain = lt::testing::writeJsonFile(p.dir.filename().string(), "plain.json", j);
  auto one = runCommand(kBin + " train " + plain.string() + " --nproc 2 --metrics " + (p.dir / "one.jsonl").string());
  ASSERT_EQ(one.code, 0) << one.out;
  const auto a = losses(p.metrics), b = losses(p.dir / "one.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

// SIGINT to one rank (not its launcher, as a scheduler signalling a process would): both ranks
// stop after the same step, that step is checkpointed, and rank and launcher exit 130.
TEST(Preemption, SigintToOneRankStopsEveryRankAfterACheckpoint) {
  auto p = preempt("int", true, 5, "kill -INT $R; wait $L; echo \"exit $?\"");
  EXPECT_NE(p.result.out.find("exit 130"), std::string::npos) << p.result.out;
  EXPECT_NE(p.result.out.find("stop: Interrupt after step"), std::string::npos) << p.result.out;
  stepsCheckpointed(p);
}

// SIGINT to the launcher of a run with no train.checkpoint.dir: one line says the stop will not
// checkpoint (never "then checkpointing" beside "no checkpoint"), however many ranks got it.
TEST(Preemption, SigintWithoutCheckpointDirSaysSoOnce) {
  auto p = preempt("nockpt", false, 5, "kill -INT $L; wait $L; echo \"exit $?\"");
  const std::string& out = p.result.out;
  EXPECT_NE(out.find("exit 130"), std::string::npos) << out;
  size_t said = 0;
  for (size_t at = out.find("stop requested"); at != std::string::npos; at = out.find("stop requested", at + 1)) ++said;
  EXPECT_EQ(said, 1u) << out;
  EXPECT_NE(out.find("then exiting without a checkpoint"), std::string::npos) << out;
  EXPECT_EQ(out.find("then checkpointing"), std::string::npos) << out;
  EXPECT_NE(out.find("no checkpoint (train.checkpoint.dir is not set)"), std::string::npos) << out;
}

// A second signal, more than a second after the first, ends the run at once. One rank is
// stopped (SIGSTOP) first, so the first signal alone could not end the run before
// train.comm_timeout_s (60 s): the other rank waits for it at the end of its step.
TEST(Preemption, ASecondSignalExitsAtOnce) {
  auto p = preempt("twice", false, 60,
                   "kill -STOP $R; kill -TERM $L; sleep 1.5; kill -0 $L && echo 'still running after the first signal'; "
                   "T0=$(date +%s%N); kill -TERM $L; wait $L; E=$?; "
                   "echo \"exit $E after $(( ($(date +%s%N) - T0) / 1000000 )) ms\"");
  const std::string& out = p.result.out;
  EXPECT_NE(out.find("still running after the first signal"), std::string::npos) << out;
  const auto at = out.find("exit ");
  ASSERT_NE(at, std::string::npos) << out;
  int code = -1, ms = -1;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "exit %d after %d ms", &code, &ms), 2) << out;
  EXPECT_NE(code, 0) << out;
  EXPECT_LT(ms, 5000) << out;
}

}  // namespace

// A small tmpfs, mounted inside `unshare -m` (so only this test's processes see it). Fits two
// checkpoints of smallConfig at 2 ranks (~0.35 MiB each with headers), not a third.
class SmallDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the full-disk tests need root (mount a tmpfs in a mount namespace)";
    dir_ = lt::testing::freshTempDir("longtrain_disk_" + std::to_string(::getpid()));
    auto probe = runScript("unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs " + dir_.string() + "'");
    if (probe.code != 0) GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace here: " << probe.out;
  }
  // Runs `body` in a mount namespace where <dir>/mnt is a tmpfs of `size`.
  lt::testing::CommandResult inSmallDisk(const std::string& size, const std::string& body) {
    const std::string mnt = (dir_ / "mnt").string();
    return runScript("mkdir -p " + mnt + "; unshare -m bash -c 'mount -t tmpfs -o " + size + " tmpfs " + mnt + " && " +
                     body + "'");
  }
  fs::path dir_;
};

TEST_F(SmallDisk, FullDiskStopsEveryRankAndThePreviousCheckpointResumes) {
  json j = smallConfig(12);
  j["sequence_parallel_size"] = 1;
  j["train"]["checkpoint"] = {{"dir", (dir_ / "mnt" / "ck").string()}, {"every_steps", 2}};
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", j);
  const std::string train = kBin + " train " + cfg.string() + " --nproc 2";
  // The full run fails at step 6; then, on the same disk, --resume takes step 4 (the newest
  // complete one) and runs to step 8 without saving.
  auto r = inSmallDisk("size=700k", train + " --metrics " + (dir_ / "m.jsonl").string() + "; echo \"exit $?\"; " +
                       "ls " + (dir_ / "mnt" / "ck").string() + "; " + train + " --resume --set train.steps=8 " +
                       "--set train.checkpoint.every_steps=0 --metrics " + (dir_ / "m.jsonl").string());
  EXPECT_NE(r.out.find("exit 1"), std::string::npos) << r.out;
  for (int rank : {0, 1})
    EXPECT_NE(r.out.find("error on rank " + std::to_string(rank) + ": checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MiB on this rank's disk, which has"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("did not finish writing"), std::string::npos) << r.out;  // no misleading timeout
  EXPECT_NE(r.out.find("\nstep-00000004\n"), std::string::npos) << r.out;  // `ls` of the checkpoint root
  EXPECT_EQ(r.out.find("\nstep-00000006\n"), std::string::npos) << "a partial step-6 directory was left:\n" << r.out;
  EXPECT_NE(r.out.find("resume: from " + (dir_ / "mnt" / "ck" / "step-00000004").string()), std::string::npos) << r.out;
  j["train"].erase("checkpoint");
  j["train"]["steps"] = 8;
  auto plain = lt::testing::writeJsonFile(dir_.filename().string(), "plain.json", j);
  auto one = runCommand(kBin + " train " + plain.string() + " --nproc 2 --metrics " + (dir_ / "one.jsonl").string());
  ASSERT_EQ(one.code, 0) << one.out;
  const auto a = losses(dir_ / "m.jsonl"), b = losses(dir_ / "one.jsonl");
  ASSERT_EQ(a.size(), 9u);  // steps 1-5 of the failed run, then the resumed 5-8
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[5 + i], b[4 + i]) << "step " << 5 + i;
}

TEST_F(SmallDisk, WarnTrainsOnAndRecordsEachFailedSave) {
  json j = smallConfig(12);
  j["sequence_parallel_size"] = 1;
  j["train"]["checkpoint"] = {{"dir", (dir_ / "mnt" / "ck").string()}, {"every_steps", 2}, {"on_error", "warn"},
                              {"async", true}};
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", j);
  auto r = inSmallDisk("size=700k", kBin + " train " + cfg.string() + " --nproc 2 --metrics " +
                                        (dir_ / "m.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.out;
  int failed = 0;
  std::ifstream f(dir_ / "m.jsonl");
  for (std::string line; std::getline(f, line);) failed += json::parse(line).contains("checkpoint_error");
  EXPECT_EQ(failed, 4) << r.out;  // steps 6, 8, 10, 12
  EXPECT_NE(r.out.find("step 6 FAILED"), std::string::npos) << r.out;
}

TEST_F(SmallDisk, ReadOnlyCheckpointDirIsFoundAtStartUp) {
  json j = smallConfig(4);
  j["sequence_parallel_size"] = 1;
  j["train"]["checkpoint"] = {{"dir", (dir_ / "mnt").string()}, {"every_steps", 2}};
  auto cfg = lt::testing::writeJsonFile(dir_.filename().string(), "c.json", j);
  auto r = inSmallDisk("ro", kBin + " train " + cfg.string() + " --nproc 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is not writable: Read-only file system"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << r.out;
}
