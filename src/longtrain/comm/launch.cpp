// fork/exec launcher, and the node-level rendezvous of a several-node job. The first failure
// wins the report; the rest are its consequences. Non-obvious: ranks run in their own
// process group, so a terminal's Ctrl-C reaches the launcher alone and every rank sees
// exactly one (forwarded) SIGINT, and its "second signal exits at once" rule stays meaningful.
#include "longtrain/comm/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "longtrain/core/check.h"
#include "longtrain/core/strings.h"
#include "longtrain/core/torch_compat.h"

namespace lt::comm {

int findFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  LT_CHECK(fd >= 0, "cannot open a socket to find a free port: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  LT_CHECK(ok, "cannot bind a socket on 127.0.0.1 to find a free port");
  return ntohs(a.sin_port);
}

std::string describeExitStatus(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    return "was killed by signal " + std::to_string(s) + " (" + strsignal(s) + (s == SIGKILL ? "; out of memory?" : "") +
           ")";
  }
  return "ended with status " + std::to_string(status);
}

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::atomic<int> gFirstSignal{0}, gSignalCount{0};
void onSignal(int s) {
  int none = 0;
  gFirstSignal.compare_exchange_strong(none, s);
  gSignalCount.fetch_add(1);
}

std::string randomId() {
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  return id;
}

bool isStopCode(int status) {
  return WIFEXITED(status) && (WEXITSTATUS(status) == 128 + SIGTERM || WEXITSTATUS(status) == 128 + SIGINT);
}

// This node's running ranks, for the store watchdog (the main thread keeps Attempt::pids).
std::mutex gChildrenMutex;
std::vector<pid_t> gChildren;
void setChildren(const std::vector<pid_t>& pids) {
  std::lock_guard<std::mutex> g(gChildrenMutex);
  gChildren = pids;
}

// TCPStore's reads have no timeout: a store call to a node 0 that vanished blocks for good.
// The watchdog ends a launcher stuck in one for `limit`: its ranks get `grace` to fail on
// their own (their heartbeats see the same), then are killed, and the launcher exits 1.
class StoreWatchdog {
 public:
  StoreWatchdog(std::string what, milliseconds limit, milliseconds grace) : what_(std::move(what)) {
    std::thread([this, limit, grace] {
      for (;;) {
        std::this_thread::sleep_for(milliseconds(500));
        const int64_t t = since_.load();
        if (t != 0 && Clock::now().time_since_epoch().count() - t > std::chrono::nanoseconds(limit).count())
          giveUp(grace);
      }
    }).detach();
  }
  void begin() { since_.store(Clock::now().time_since_epoch().count()); }
  void end() { since_.store(0); }

 private:
  [[noreturn]] void giveUp(milliseconds grace) {
    std::fprintf(stderr, "longtrain launcher: %s does not answer (its host is down, or the link to it); stopping "
                 "this node's ranks\n", what_.c_str());
    const auto deadline = Clock::now() + grace;
    std::vector<pid_t> pids;
    {
      std::lock_guard<std::mutex> g(gChildrenMutex);
      pids = gChildren;
    }
    for (bool any = true; any && Clock::now() < deadline;) {
      any = false;
      for (pid_t p : pids) any |= p > 0 && ::waitpid(p, nullptr, WNOHANG) == 0;
      std::this_thread::sleep_for(milliseconds(50));
    }
    for (pid_t p : pids)
      if (p > 0) ::kill(p, SIGKILL);
    std::_Exit(1);
  }
  std::string what_;
  std::atomic<int64_t> since_{0};
};

// ------------------------------------------------------------------ the nodes' rendezvous
// Node 0 hosts the store; keys under lt/launch/. Every access that fails means node 0 (or
// the way to it) is gone, and says so.
class NodeStore {
 public:
  explicit NodeStore(const LaunchOptions& o) : o_(o) {
    auto so = compat::tcpStoreOptions<c10d::TCPStoreOptions>();
    so.port = static_cast<uint16_t>(o.masterPort);
    so.isServer = o.nodeRank == 0;
    so.waitWorkers = false;
    so.timeout = o.rdzvTimeout;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(o.masterAddr, so);
    } catch (const std::exception& e) {
      LT_CHECK(o.nodeRank != 0, "node 0 cannot listen on port ", o.masterPort, ": ", firstLine(e.what()), " (port ",
               o.masterPort, " is in use, by another job?); choose another --master-port");
      LT_CHECK(false, "node ", o.nodeRank, " cannot reach node 0's store at ", where(), " within ",
               o.rdzvTimeout.count() / 1000, " s: ", firstLine(e.what()), " (is node 0 started, and --master-addr ",
               "its address on a network this host shares?)");
    }
    watchdog_ = std::make_unique<StoreWatchdog>("node 0's store at " + where(), milliseconds(10000), o.grace);
    join();
  }
  const std::string& runId() const { return runId_; }

  // Every node's launcher arrives before any starts its ranks.
  void arrive(int attempt) {
    const std::string a = attemptKey(attempt);
    guarded([&] {
      store_->set(a + "node" + std::to_string(o_.nodeRank), bytes("1"));
      store_->add(a + "arrived", 1);
      const auto deadline = Clock::now() + o_.rdzvTimeout;
      while (store_->add(a + "arrived", 0) < o_.nnodes) {
        LT_CHECK(Clock::now() < deadline, "attempt ", attempt, ": node(s) ", missingNodes(a, "node"),
                 " did not arrive within ", o_.rdzvTimeout.count() / 1000, " s (not started, or down)");
        watchdog_->begin();  // each poll is a call of its own
        std::this_thread::sleep_for(milliseconds(50));
      }
    });
  }
  // Each launcher counts up its own key while it runs; one that stops counting is gone.
  void beat() {
    guarded([&] { store_->add("lt/launch/hb" + std::to_string(o_.nodeRank), 1); });
  }
  void reportFailure(int attempt, const std::string& what) {
    guarded([&] { store_->compareSet(attemptKey(attempt) + "failed", {}, bytes(what)); });
  }
  std::optional<std::string> failure(int attempt) {
    std::optional<std::string> f;
    guarded([&] {
      const std::string k = attemptKey(attempt) + "failed";
      if (store_->check({k})) f = text(store_->get(k));
    });
    return f;
  }
  // Records this node's outcome ("ok", "fail", "stop<signal>") and returns every node's, in
  // node order; a node that does not report within `wait` counts as "fail (no report)".
  std::vector<std::string> outcomes(int attempt, const std::string& mine, milliseconds wait) {
    std::vector<std::string> all(o_.nnodes, "fail (node did not report: down?)");
    const std::string a = attemptKey(attempt);
    guarded([&] {
      store_->set(a + "outcome" + std::to_string(o_.nodeRank), bytes(mine));
      const auto deadline = Clock::now() + wait;
      for (int n = 0; n < o_.nnodes; ++n) {
        const std::string k = a + "outcome" + std::to_string(n), hb = "lt/launch/hb" + std::to_string(n);
        int64_t lastBeat = -1;
        auto lastChange = Clock::now();
        while (!store_->check({k}) && Clock::now() < deadline) {
          store_->add("lt/launch/hb" + std::to_string(o_.nodeRank), 1);
          const int64_t b = store_->add(hb, 0);
          if (b != lastBeat) lastBeat = b, lastChange = Clock::now();
          if (Clock::now() - lastChange > milliseconds(3000)) {
            all[n] = "fail (node " + std::to_string(n) + "'s launcher stopped: its host is down, or the link to it)";
            break;
          }
          watchdog_->begin();
          std::this_thread::sleep_for(milliseconds(50));
        }
        if (store_->check({k})) all[n] = text(store_->get(k));
      }
      // Node 0's launcher (the store) outlives every node's reading of the outcomes.
      store_->add(a + "read", 1);
      int reporting = 0;
      for (int n = 0; n < o_.nnodes; ++n) reporting += all[n].rfind("fail (", 0) != 0;
      const auto until = Clock::now() + milliseconds(10000);
      while (o_.nodeRank == 0 && store_->add(a + "read", 0) < reporting && Clock::now() < until)
        watchdog_->begin(), std::this_thread::sleep_for(milliseconds(20));
    });
    return all;
  }

 private:
  static std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
  static std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }
  static std::string attemptKey(int a) { return "lt/launch/a" + std::to_string(a) + "/"; }
  std::string where() const { return o_.masterAddr + ":" + std::to_string(o_.masterPort); }

  template <class F>
  void guarded(F&& f) {
    try {
      watchdog_->begin();
      f();
      watchdog_->end();
    } catch (const lt::Error&) {
      watchdog_->end();
      throw;
    } catch (const std::exception& e) {
      watchdog_->end();
      LT_CHECK(false, "node 0's store at ", where(), " is unreachable from node ", o_.nodeRank, ": ",
               firstLine(e.what()), " (node 0 is down, or the link to it)");
    }
  }
  std::string missingNodes(const std::string& prefix, const std::string& what) {
    std::string m;
    for (int n = 0; n < o_.nnodes; ++n)
      if (!store_->check({prefix + what + std::to_string(n)})) m += (m.empty() ? "" : ", ") + std::to_string(n);
    return m;
  }
  // The job id (node 0's --rdzv-id) must match; a node rank joins once; the run id is node 0's.
  void join() {
    guarded([&] {
      const std::string id = o_.rdzvId.empty() ? "none" : o_.rdzvId;
      if (o_.nodeRank == 0) {
        const auto held = text(store_->compareSet("lt/launch/job", {}, bytes(id)));
        LT_CHECK(held == id, "port ", o_.masterPort, " already serves the store of job '", held,
                 "'; choose another --master-port");
        store_->set("lt/launch/run_id", bytes(o_.rdzvId.empty() ? randomId() : o_.rdzvId));
        store_->set("lt/launch/nnodes", bytes(std::to_string(o_.nnodes)));
      }
      store_->wait({"lt/launch/job", "lt/launch/run_id"});
      const auto job = text(store_->get("lt/launch/job"));
      LT_CHECK(job == id, "the store at ", where(), " belongs to another job (--rdzv-id '", job, "'; this node has '",
               id, "'); start every node with the same --rdzv-id, or use another --master-port");
      const auto nn = text(store_->get("lt/launch/nnodes"));
      LT_CHECK(nn == std::to_string(o_.nnodes), "node 0 was started with --nnodes ", nn, ", this node with --nnodes ",
               o_.nnodes, "; every node needs the same --nnodes");
      const auto joined = store_->add("lt/launch/joined" + std::to_string(o_.nodeRank), 1);
      LT_CHECK(joined == 1, "node rank ", o_.nodeRank, " already joined this job: two nodes were given --node-rank ",
               o_.nodeRank, "; give each node its own rank in 0..", o_.nnodes - 1);
      runId_ = text(store_->get("lt/launch/run_id"));
    });
  }

  const LaunchOptions& o_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::unique_ptr<StoreWatchdog> watchdog_;
  std::string runId_;
};

// ------------------------------------------------------------------ one attempt
struct Attempt {
  std::vector<pid_t> pids;  // by local rank; -1 once reaped
  int alive = 0;
  std::string firstFailure;  // this node's, or the one another node reported
  bool failed = false;
  int stopSignal = 0;  // a rank exited 128 + SIGTERM/SIGINT
};

void setChildEnv(const LaunchOptions& o, int local, int attempt, const std::string& runId,
                 const std::string& storeFile) {
  const int K = o.nprocPerNode;
  ::setenv("RANK", std::to_string(o.nodeRank * K + local).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(o.nnodes * K).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(K).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(o.nodeRank).c_str(), 1);
  ::setenv("LONGTRAIN_LAUNCHED", "1", 1);
  ::setenv("LONGTRAIN_RESTART_ATTEMPT", std::to_string(attempt).c_str(), 1);
  ::setenv("LONGTRAIN_RUN_ID", runId.c_str(), 1);
  if (storeFile.empty()) {
    ::setenv("MASTER_ADDR", o.masterAddr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(o.masterPort).c_str(), 1);
    ::setenv("LONGTRAIN_STORE_PREFIX", ("lt/job/a" + std::to_string(attempt) + "/").c_str(), 1);
  } else {
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::unsetenv("MASTER_PORT");
    ::setenv("LONGTRAIN_STORE_FILE", storeFile.c_str(), 1);
  }
}

Attempt spawn(const std::vector<std::string>& argv, const LaunchOptions& o, int attempt, const std::string& runId,
              const std::string& storeFile) {
  Attempt at;
  at.pids.assign(o.nprocPerNode, -1);
  const pid_t parent = ::getpid();
  for (int r = 0; r < o.nprocPerNode; ++r) {
    pid_t pid = ::fork();
    LT_CHECK(pid >= 0, "fork failed: ", std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::setpgid(0, 0);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      setChildEnv(o, r, attempt, runId, storeFile);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv("/proc/self/exe", args.data());
      std::fprintf(stderr, "longtrain launcher: exec failed: %s\n", std::strerror(errno));
      ::_exit(127);
    }
    at.pids[r] = pid;
  }
  at.alive = o.nprocPerNode;
  return at;
}

void killAll(Attempt& at, int sig) {
  for (pid_t p : at.pids)
    if (p > 0) ::kill(p, sig);
}

std::string rankName(const LaunchOptions& o, int local) {
  const int world = o.nnodes * o.nprocPerNode, rank = o.nodeRank * o.nprocPerNode + local;
  if (o.nnodes == 1) return "rank " + std::to_string(rank) + " (of " + std::to_string(world) + ")";
  return "rank " + std::to_string(rank) + " (of " + std::to_string(world) + ", node " + std::to_string(o.nodeRank) +
         ")";
}

// Waits for every local rank. A failure (here, or reported by another node) gives the rest
// `grace` to fail on their own; then they are killed.
void supervise(Attempt& at, const LaunchOptions& o, NodeStore* nodes, int attempt) {
  auto deadline = Clock::time_point::max(), nextPoll = Clock::now();
  bool forwarded = false;
  auto fail = [&](const std::string& why) {
    if (at.failed) return;
    at.failed = true;
    at.firstFailure = why;
    deadline = Clock::now() + o.grace;
  };
  while (at.alive > 0) {
    if (gFirstSignal.load() && !forwarded) {
      killAll(at, gFirstSignal.load());
      forwarded = true;
    }
    if (gSignalCount.load() >= 2) killAll(at, SIGKILL);  // the second signal: at once
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < o.nprocPerNode; ++r) {
        if (at.pids[r] != pid) continue;
        at.pids[r] = -1;
        --at.alive;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (isStopCode(status)) at.stopSignal = WEXITSTATUS(status) - 128;
        else if (!ok) {
          const bool first = !at.failed;
          fail(rankName(o, r) + " " + describeExitStatus(status));
          if (first && nodes) nodes->reportFailure(attempt, at.firstFailure);
        }
      }
      continue;
    }
    if (pid < 0) break;
    const auto now = Clock::now();
    if (nodes && now >= nextPoll) {
      nextPoll = now + milliseconds(200);
      try {
        nodes->beat();
        if (auto f = nodes->failure(attempt); f && !at.failed) fail(*f);
      } catch (const std::exception& e) {
        fail(e.what());
      }
    }
    if (now > deadline) {
      killAll(at, SIGKILL);
      deadline = Clock::time_point::max();
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
}

std::string outcomeOf(const Attempt& at) {
  if (at.failed) return "fail";
  if (at.stopSignal) return "stop" + std::to_string(at.stopSignal);
  return "ok";
}

// 0: done; 128 + signal: stopped; 1: failed (the caller may restart).
int runAttempt(const std::vector<std::string>& argv, const LaunchOptions& o, NodeStore* nodes, int attempt,
               const std::string& runId) {
  namespace fs = std::filesystem;
  std::string storeFile;
  if (!nodes) {
    storeFile = (fs::temp_directory_path() / ("longtrain-" + runId + "-" + std::to_string(attempt) + ".store")).string();
    fs::remove(storeFile);
  } else {
    nodes->arrive(attempt);
  }
  Attempt at = spawn(argv, o, attempt, runId, storeFile);
  setChildren(at.pids);
  supervise(at, o, nodes, attempt);
  setChildren({});
  if (!storeFile.empty()) fs::remove(storeFile);
  std::string outcome = outcomeOf(at);
  if (nodes) {  // the job's outcome is every node's: one failed node fails (or restarts) all
    std::string lostNodes;
    for (const auto& n : nodes->outcomes(attempt, outcome, o.grace + milliseconds(30000))) {
      if (n.rfind("fail (", 0) == 0) lostNodes += "; " + n.substr(6, n.size() - 7);
      if (outcome.rfind("fail", 0) != 0 && n != "ok") outcome = n;
    }
    if (outcome != "ok" && !at.failed) at.firstFailure = nodes->failure(attempt).value_or("a node " + outcome);
    at.firstFailure += lostNodes;
  }
  if (outcome.rfind("stop", 0) == 0) return 128 + std::stoi(outcome.substr(4));
  if (outcome == "ok") return 0;
  if (at.firstFailure.rfind("; ", 0) == 0) at.firstFailure.erase(0, 2);
  std::fprintf(stderr, "longtrain launcher%s: %s; the job failed\n",
               o.nnodes > 1 ? (" (node " + std::to_string(o.nodeRank) + ")").c_str() : "", at.firstFailure.c_str());
  return 1;
}

}  // namespace

int launch(const std::vector<std::string>& argv, const LaunchOptions& o) {
  LT_CHECK(o.nprocPerNode >= 1, "--nproc-per-node must be at least 1, got ", o.nprocPerNode);
  LT_CHECK(o.nnodes >= 1, "--nnodes must be at least 1, got ", o.nnodes);
  LT_CHECK(o.nodeRank >= 0 && o.nodeRank < o.nnodes, "--node-rank ", o.nodeRank, " must be in 0..", o.nnodes - 1,
           " (--nnodes ", o.nnodes, ")");
  LT_CHECK(o.maxRestarts >= 0, "--max-restarts must be at least 0, got ", o.maxRestarts);
  const bool several = o.nnodes > 1 || !o.masterAddr.empty();
  LT_CHECK(!several || (!o.masterAddr.empty() && o.masterPort > 0 && o.masterPort < 65536),
           "--nnodes ", o.nnodes, " needs --master-addr (node 0's address) and --master-port (1..65535)");
  std::unique_ptr<NodeStore> nodes;
  if (several) nodes = std::make_unique<NodeStore>(o);
  const char* envRun = std::getenv("LONGTRAIN_RUN_ID");
  const std::string runId = nodes ? nodes->runId() : envRun && *envRun ? envRun : randomId();
  ::signal(SIGTERM, onSignal);
  ::signal(SIGINT, onSignal);
  for (int attempt = 0;; ++attempt) {
    const int rc = runAttempt(argv, o, nodes.get(), attempt, runId);
    if (rc != 1) return rc;
    if (gFirstSignal.load()) return 128 + gFirstSignal.load();
    if (attempt >= o.maxRestarts) {
      if (o.maxRestarts > 0)
        std::fprintf(stderr, "longtrain launcher: giving up after %d restart(s) (--max-restarts %d)\n", attempt,
                     o.maxRestarts);
      return 1;
    }
    std::fprintf(stderr, "longtrain launcher: restarting the job (restart %d of %d) from its newest checkpoint\n",
                 attempt + 1, o.maxRestarts);
  }
}

}  // namespace lt::comm
