// fork/exec launcher, and the node-level rendezvous of a several-node job. The first failure
// wins the report; the rest are its consequences. Non-obvious: ranks run in their own
// process group, so a terminal's Ctrl-C reaches the launcher alone and every rank sees
// exactly one (forwarded) SIGINT, and its "second signal exits at once" rule stays meaningful.
#include "longtrain/comm/launch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
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

// Node 0's store did not answer a call in time, or its connection broke.
struct StoreLost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs f() on a thread of its own and waits at most `limit`: TCPStore's calls have no timeout,
// and one sent into a network partition blocks until the link returns, or for good. A call
// not done in time is abandoned (its thread keeps what f captured alive) and StoreLost thrown;
// an exception f throws is rethrown as StoreLost with its first line.
template <class F>
auto withinLimit(F f, milliseconds limit, const std::string& what) -> decltype(f()) {
  using R = decltype(f());
  struct Pending {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::optional<R> value;
    std::string error;
  };
  auto p = std::make_shared<Pending>();
  std::thread([p, f = std::move(f)]() mutable {
    std::optional<R> v;
    std::string err;
    try {
      v.emplace(f());
    } catch (const std::exception& e) {
      err = firstLine(e.what());
      while (!err.empty() && (err.back() == '.' || err.back() == ' ')) err.pop_back();
    }
    std::lock_guard<std::mutex> g(p->m);
    p->value = std::move(v), p->error = err.empty() && !p->value ? "failed" : err, p->done = true;
    p->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> l(p->m);
  if (!p->cv.wait_for(l, limit, [&] { return p->done; }))
    throw StoreLost(what + " does not answer within " + std::to_string(limit.count() / 1000) + " s");
  if (!p->value) throw StoreLost(what + ": " + p->error);
  return std::move(*p->value);
}

// Why nothing accepts a TCP connection at host:port within `limit` ("" when something does: a
// plain connect, closed at once). The launcher asks before it builds a TCPStore client: libtorch
// 2.x's client retries a refused connection inside its constructor, longer than asked, and logs
// each try with a backtrace, so the launcher could neither say that it waits nor keep that text
// from the user.
std::string tcpUnreachable(const std::string& host, int port, milliseconds limit) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) return std::string("cannot resolve the address: ") + ::gai_strerror(rc);
  std::string why;
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = std::strerror(errno);
  } else if (::connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      why = std::strerror(errno);
    } else {
      pollfd pf{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (::poll(&pf, 1, static_cast<int>(limit.count())) <= 0) why = "no answer";
      else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) why = std::strerror(err);
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return why;
}

// The launcher's connection to node 0's store. Node 0 hosts it and never loses it; another
// node connects, and after a call that failed or did not answer, connects anew (a fresh
// client: the old one may be blocked for good), retrying until a deadline, as torchrun's agent
// retries its rendezvous until --rdzv-timeout.
class StoreLink {
 public:
  explicit StoreLink(const LaunchOptions& o) : o_(o) {}
  std::string where() const { return "node 0's store at " + o_.masterAddr + ":" + std::to_string(o_.masterPort); }
  bool connected() const { return static_cast<bool>(store_); }

  // Node 0: listens (lt::Error when the port is taken). Others: one try, at most `limit`.
  void tryConnect(milliseconds limit) {
    auto so = compat::tcpStoreOptions<c10d::TCPStoreOptions>();
    so.port = static_cast<uint16_t>(o_.masterPort);
    so.isServer = o_.nodeRank == 0;
    so.waitWorkers = false;
    so.timeout = limit;
    if (o_.nodeRank == 0) {
      try {
        store_ = c10::make_intrusive<c10d::TCPStore>(o_.masterAddr, so);
      } catch (const std::exception& e) {
        LT_CHECK(false, "node 0 cannot listen on port ", o_.masterPort, ": ", firstLine(e.what()), " (port ",
                 o_.masterPort, " is in use, by another job?); choose another --master-port");
      }
      return;
    }
    const std::string addr = o_.masterAddr;
    const std::string unreachable = tcpUnreachable(addr, o_.masterPort, std::min(limit, milliseconds(1000)));
    if (!unreachable.empty()) throw StoreLost(where() + ": " + unreachable);
    store_ = withinLimit([addr, so] { return c10::make_intrusive<c10d::TCPStore>(addr, so); },
                         limit + milliseconds(2000), where());
  }

  // Connects, retrying every second until `deadline`; says once that it waits, and when it
  // got through. lt::Error at the deadline, naming the flag that sets it.
  void connectBy(Clock::time_point deadline, const std::string& why) {
    const auto t0 = Clock::now();
    std::string lastError;
    while (!connected()) {
      try {
        tryConnect(std::min<milliseconds>(milliseconds(3000), remaining(deadline)));
      } catch (const StoreLost& e) {
        if (lastError.empty())
          std::fprintf(stderr, "longtrain launcher (node %d): %s: %s; retrying until --rdzv-timeout (%lld s)\n",
                       o_.nodeRank, why.c_str(), e.what(), static_cast<long long>(o_.rdzvTimeout.count() / 1000));
        lastError = e.what();
        LT_CHECK(Clock::now() < deadline, "node ", o_.nodeRank, " cannot reach ", where(), " within --rdzv-timeout ",
                 o_.rdzvTimeout.count() / 1000, " s: ", lastError, " (is node 0 started, and --master-addr its ",
                 "address on a network this host shares? a longer partition needs a longer --rdzv-timeout)");
        std::this_thread::sleep_for(std::min<milliseconds>(milliseconds(1000), remaining(deadline)));
      }
    }
    if (!lastError.empty())
      std::fprintf(stderr, "longtrain launcher (node %d): reached %s after %.0f s\n", o_.nodeRank, where().c_str(),
                   std::chrono::duration<double>(Clock::now() - t0).count());
  }

  // f(store) on the connection, within kCallLimit; StoreLost (and the connection dropped, so
  // the next call connects anew) when it fails or does not answer.
  template <class F>
  auto call(F f) -> decltype(f(std::declval<c10d::TCPStore&>())) {
    if (!connected()) throw StoreLost(where() + " is not connected");
    auto s = store_;
    try {
      return withinLimit([s, f] { return f(*s); }, kCallLimit, where());
    } catch (const StoreLost&) {
      if (o_.nodeRank != 0) store_.reset();  // node 0's is the store itself
      throw;
    }
  }

  static milliseconds remaining(Clock::time_point deadline) {
    return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  }

 private:
  static constexpr milliseconds kCallLimit{5000};
  const LaunchOptions& o_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

// ------------------------------------------------------------------ the nodes' rendezvous
// Node 0 hosts the store; keys under lt/launch/. A node that loses the store keeps its ranks
// running (they fail on their own if the partition outlasts their collectives' timeout) and
// reconnects at the next rendezvous, within --rdzv-timeout.
class NodeStore {
 public:
  explicit NodeStore(const LaunchOptions& o) : o_(o), link_(o) {
    const auto deadline = Clock::now() + o.rdzvTimeout;
    link_.connectBy(deadline, "starting");
    join(deadline);
  }
  const std::string& runId() const { return runId_; }

  // Every node's launcher arrives before any starts its ranks; each waits up to --rdzv-timeout,
  // reconnecting to node 0's store as often as it takes.
  void arrive(int attempt) {
    const std::string a = attemptKey(attempt), me = a + "node" + std::to_string(o_.nodeRank);
    const auto deadline = Clock::now() + o_.rdzvTimeout;
    std::vector<std::string> all;
    for (int n = 0; n < o_.nnodes; ++n) all.push_back(a + "node" + std::to_string(n));
    for (bool announced = false;;) {
      try {
        reconnect(deadline, "attempt " + std::to_string(attempt));
        if (!announced) link_.call([me](c10d::TCPStore& s) { return s.set(me, bytes("1")), true; });
        announced = true;
        if (link_.call([all](c10d::TCPStore& s) { return s.check(all); })) return;
      } catch (const StoreLost&) {
        announced = false;  // set again on the new connection (idempotent)
      }
      LT_CHECK(Clock::now() < deadline, "attempt ", attempt, ": node(s) ", missingNodes(all),
               " did not arrive within --rdzv-timeout ", o_.rdzvTimeout.count() / 1000,
               " s (not started, down, or cut off from node 0)");
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  // Each launcher counts up its own key while it runs; one that stops counting is gone. While
  // the store is lost, retried at most every 2 s (a try blocks up to its limit).
  void beat() {
    if (!link_.connected() && Clock::now() < nextRetry_) return;
    try {
      reconnectOnce();
      link_.call([k = beatKey(o_.nodeRank)](c10d::TCPStore& s) { return s.add(k, 1); });
    } catch (const StoreLost& e) {
      nextRetry_ = Clock::now() + milliseconds(2000);
      noteLost(e.what());
    }
  }
  void reportFailure(int attempt, const std::string& what) {
    try {
      reconnectOnce();
      link_.call([k = attemptKey(attempt) + "failed", what](c10d::TCPStore& s) {
        return s.compareSet(k, {}, bytes(what)), true;
      });
    } catch (const StoreLost& e) {
      noteLost(e.what());
    }
  }
  std::optional<std::string> failure(int attempt) {
    if (!link_.connected()) return std::nullopt;
    try {
      return link_.call([k = attemptKey(attempt) + "failed"](c10d::TCPStore& s) {
        return s.check({k}) ? std::optional<std::string>(text(s.get(k))) : std::nullopt;
      });
    } catch (const StoreLost& e) {
      noteLost(e.what());
      return std::nullopt;
    }
  }
  // The job's extra arguments (LaunchOptions::chooseOnNodeZero), within --rdzv-timeout: node 0
  // says whether it chooses and whether node 1 measures the link; every other node answers
  // whether it was started alike (a node that was not is refused by name, on both sides); node 1
  // measures if asked; node 0 chooses and every node takes its choice.
  std::vector<std::string> agree() {
    const auto deadline = Clock::now() + o_.rdzvTimeout;
    const std::string mode = !o_.chooseOnNodeZero ? "none" : o_.measureLink ? "measure" : "given";
    return o_.nodeRank == 0 ? chooseForTheJob(mode, deadline) : takeNodeZerosChoice(mode, deadline);
  }

  // Records this node's outcome ("ok", "fail", "stop<signal>") and returns every node's, in
  // node order; a node that does not report within `wait` counts as "fail (...)", and so does
  // every other node when node 0's store stays out of reach that long.
  std::vector<std::string> outcomes(int attempt, const std::string& mine, milliseconds wait) {
    std::vector<std::string> all(o_.nnodes, "fail (node did not report: down?)");
    const std::string a = attemptKey(attempt);
    const auto deadline = Clock::now() + wait;
    for (;;) {
      try {
        reconnect(deadline, "reporting attempt " + std::to_string(attempt) + "'s outcome");
        readOutcomes(a, mine, deadline, all);
        return all;
      } catch (const StoreLost& e) {
        noteLost(e.what());
      } catch (const lt::Error& e) {  // the deadline passed without the store
        for (int n = 0; n < o_.nnodes; ++n)
          if (n != o_.nodeRank) all[n] = "fail (" + link_.where() + " out of reach: " + firstLine(e.what()) + ")";
        all[o_.nodeRank] = mine;
        return all;
      }
    }
  }

 private:
  static std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
  static std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }
  static std::string attemptKey(int a) { return "lt/launch/a" + std::to_string(a) + "/"; }
  static std::string beatKey(int n) { return "lt/launch/hb" + std::to_string(n); }

  static std::string fitFlag(const std::string& mode) { return mode == "none" ? "without --fit" : "with --fit"; }
  // Each of `v` after `sep`: "\nA\nB" or " A B".
  static std::string joined(const std::vector<std::string>& v, char sep) {
    std::string out;
    for (const auto& a : v) out += sep + a;
    return out;
  }
  std::vector<std::string> chooseForTheJob(const std::string& mode, Clock::time_point deadline) {
    publish("lt/launch/fit", mode, deadline);
    for (int n = 1; n < o_.nnodes; ++n) {
      const std::string ack = waitFor("lt/launch/fit_ack" + std::to_string(n), deadline, "node " + std::to_string(n) + "'s answer");
      LT_CHECK(ack == "ok", ack);
    }
    if (mode == "none") return {};
    double link = 0;
    if (mode == "measure") {
      const std::string got = waitFor("lt/launch/link", deadline, "node 1's link measurement");
      LT_CHECK(got.rfind("error\n", 0) != 0, "node 1 could not measure the link: ", got.substr(6),
               "; give --link-bandwidth instead");
      link = std::stod(got);
    }
    std::vector<std::string> args;
    try {
      args = o_.chooseOnNodeZero(link);
    } catch (const std::exception& e) {
      publish("lt/launch/choice", "error\n" + firstLine(e.what()), deadline);
      throw;
    }
    publish("lt/launch/choice", "ok" + joined(args, '\n'), deadline);
    return args;
  }
  std::vector<std::string> takeNodeZerosChoice(const std::string& mode, Clock::time_point deadline) {
    const std::string zero = waitFor("lt/launch/fit", deadline, "node 0's --fit");
    if ((zero == "none") != (mode == "none")) {
      const std::string why = "node 0 was started " + fitFlag(zero) + ", node " + std::to_string(o_.nodeRank) + " " +
                              fitFlag(mode) + "; start every node with the same --fit";
      publish("lt/launch/fit_ack" + std::to_string(o_.nodeRank), why, deadline);
      LT_CHECK(false, why);
    }
    publish("lt/launch/fit_ack" + std::to_string(o_.nodeRank), "ok", deadline);
    if (zero == "none") return {};
    if (o_.nodeRank == 1 && zero == "measure") publish("lt/launch/link", measuredLink(), deadline);
    const std::string got = waitFor("lt/launch/choice", deadline, "node 0's choice");
    LT_CHECK(got.rfind("error\n", 0) != 0, "node 0 could not choose for the job: ", got.substr(6));
    std::vector<std::string> args;
    for (size_t at = 3; at < got.size();) {  // after "ok\n"
      const size_t end = std::min(got.find('\n', at), got.size());
      args.push_back(got.substr(at, end - at));
      at = end + 1;
    }
    std::printf("longtrain launcher (node %d): runs node 0's choice:%s\n", o_.nodeRank, joined(args, ' ').c_str());
    std::fflush(stdout);
    return args;
  }
  // The link's seconds per byte as text, or "error\n<why>" for node 0 to report.
  std::string measuredLink() {
    try {
      return fmt::format("{:.9e}", linkSecondsPerByte());
    } catch (const StoreLost& e) {
      return std::string("error\n") + e.what();
    }
  }
  // Node 1 to node 0's store: the best of 4 sends of 8 MiB, in seconds per byte. A set is not
  // answered (it returns once the socket buffer takes it), so each is timed to the answer of a
  // check behind it on the same connection, which the store sends after reading the whole set.
  double linkSecondsPerByte() {
    constexpr size_t kProbe = 8 << 20;
    const std::vector<uint8_t> blob(kProbe, 0x5a);
    double best = 1e30;
    for (int i = 0; i < 4; ++i) {
      const auto t0 = Clock::now();
      link_.call([&blob](c10d::TCPStore& s) { return s.set("lt/launch/link_probe", blob), s.check({"lt/launch/link_probe"}); });
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    link_.call([](c10d::TCPStore& s) { return s.deleteKey("lt/launch/link_probe"); });
    std::printf("longtrain launcher (node 1): the link to node 0 moves %.3g Gbit/s (8 MiB through its store)\n",
                8e-9 * kProbe / best);
    std::fflush(stdout);
    return best / kProbe;
  }
  void publish(const std::string& key, const std::string& value, Clock::time_point deadline) {
    for (;;) {
      try {
        reconnect(deadline, "publishing " + key);
        link_.call([&](c10d::TCPStore& s) { return s.set(key, bytes(value)), true; });
        return;
      } catch (const StoreLost& e) {
        noteLost(e.what());
      }
    }
  }
  std::string waitFor(const std::string& key, Clock::time_point deadline, const std::string& what) {
    for (;;) {
      try {
        reconnect(deadline, "waiting for " + what);
        const auto got = link_.call([&](c10d::TCPStore& s) {
          return s.check({key}) ? std::optional<std::string>(text(s.get(key))) : std::nullopt;
        });
        if (got) return *got;
      } catch (const StoreLost& e) {
        noteLost(e.what());
      }
      LT_CHECK(Clock::now() < deadline, "node ", o_.nodeRank, ": ", what, " did not arrive within --rdzv-timeout ",
               o_.rdzvTimeout.count() / 1000, " s");
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  void noteLost(const std::string& why) {
    if (!link_.connected() && !lostSaid_)
      std::fprintf(stderr, "longtrain launcher (node %d): lost %s (%s); its ranks go on, and it reconnects\n",
                   o_.nodeRank, link_.where().c_str(), why.c_str());
    lostSaid_ = !link_.connected();
  }
  // Connects within `deadline` if the link is down, and checks the store is still this job's.
  void reconnect(Clock::time_point deadline, const std::string& why) {
    if (link_.connected()) return;
    link_.connectBy(deadline, why);
    checkSameJob();
    lostSaid_ = false;
  }
  void reconnectOnce() {
    if (link_.connected()) return;
    link_.tryConnect(milliseconds(1500));
    checkSameJob();
    std::fprintf(stderr, "longtrain launcher (node %d): reconnected to %s\n", o_.nodeRank, link_.where().c_str());
    lostSaid_ = false;
  }
  void checkSameJob() {
    if (runId_.empty()) return;  // still joining: join() checks
    const std::string id = o_.rdzvId.empty() ? "none" : o_.rdzvId;
    const auto job = link_.call([](c10d::TCPStore& s) {
      return s.check({"lt/launch/run_id"}) ? text(s.get("lt/launch/job")) + "\n" + text(s.get("lt/launch/run_id"))
                                          : std::string("\n");
    });
    LT_CHECK(job == id + "\n" + runId_, "the store at ", link_.where(), " now serves another job ('",
             job.substr(0, job.find('\n')), "'): node 0 was restarted on its own; restart every node");
  }
  void readOutcomes(const std::string& a, const std::string& mine, Clock::time_point deadline,
                    std::vector<std::string>& all) {
    const int me = o_.nodeRank;
    link_.call([k = a + "outcome" + std::to_string(me), mine](c10d::TCPStore& s) { return s.set(k, bytes(mine)), true; });
    for (int n = 0; n < o_.nnodes; ++n) {
      const std::string k = a + "outcome" + std::to_string(n);
      int64_t lastBeat = -1;
      auto lastChange = Clock::now();
      for (;;) {
        const auto seen = link_.call([k, hb = beatKey(n), myBeat = beatKey(me)](c10d::TCPStore& s) {
          s.add(myBeat, 1);
          return std::make_pair(s.check({k}) ? std::optional<std::string>(text(s.get(k))) : std::nullopt,
                                s.add(hb, 0));
        });
        if (seen.first) {
          all[n] = *seen.first;
          break;
        }
        if (seen.second != lastBeat) lastBeat = seen.second, lastChange = Clock::now();
        if (Clock::now() - lastChange > milliseconds(3000)) {
          all[n] = "fail (node " + std::to_string(n) + "'s launcher stopped: its host is down, or the link to it)";
          break;
        }
        if (Clock::now() > deadline) break;
        std::this_thread::sleep_for(milliseconds(50));
      }
    }
    // Node 0's launcher (the store) outlives every node's reading of the outcomes.
    link_.call([k = a + "read"](c10d::TCPStore& s) { return s.add(k, 1); });
    int reporting = 0;
    for (int n = 0; n < o_.nnodes; ++n) reporting += all[n].rfind("fail (", 0) != 0;
    const auto until = Clock::now() + milliseconds(10000);
    while (me == 0 && link_.call([k = a + "read"](c10d::TCPStore& s) { return s.add(k, 0); }) < reporting &&
           Clock::now() < until)
      std::this_thread::sleep_for(milliseconds(20));
  }
  std::string missingNodes(const std::vector<std::string>& keys) {
    std::string m;
    for (int n = 0; n < o_.nnodes; ++n) {
      bool here = false;
      try {
        here = link_.connected() && link_.call([k = keys[n]](c10d::TCPStore& s) { return s.check({k}); });
      } catch (const StoreLost&) {
      }
      if (!here) m += (m.empty() ? "" : ", ") + std::to_string(n);
    }
    return m;
  }
  // The job id (node 0's --rdzv-id) must match; a node rank joins once; the run id is node 0's.
  void join(Clock::time_point deadline) {
    const std::string id = o_.rdzvId.empty() ? "none" : o_.rdzvId;
    if (o_.nodeRank == 0) {
      const auto held = link_.call([id](c10d::TCPStore& s) { return text(s.compareSet("lt/launch/job", {}, bytes(id))); });
      LT_CHECK(held == id, "port ", o_.masterPort, " already serves the store of job '", held,
               "'; choose another --master-port");
      const std::string run = o_.rdzvId.empty() ? randomId() : o_.rdzvId;
      link_.call([run, nn = std::to_string(o_.nnodes)](c10d::TCPStore& s) {
        s.set("lt/launch/nnodes", bytes(nn));
        return s.set("lt/launch/run_id", bytes(run)), true;
      });
    }
    std::vector<std::string> held;
    for (;;) {  // node 0 sets these when it starts; a node started first polls for them
      try {
        reconnect(deadline, "joining");
        held = link_.call([](c10d::TCPStore& s) {
          if (!s.check({"lt/launch/run_id"})) return std::vector<std::string>{};
          return std::vector<std::string>{text(s.get("lt/launch/job")), text(s.get("lt/launch/nnodes")),
                                           text(s.get("lt/launch/run_id"))};
        });
        if (!held.empty()) break;
      } catch (const StoreLost&) {
      }
      LT_CHECK(Clock::now() < deadline, "node ", o_.nodeRank, ": ", link_.where(), " did not start the job within ",
               "--rdzv-timeout ", o_.rdzvTimeout.count() / 1000, " s");
      std::this_thread::sleep_for(milliseconds(100));
    }
    LT_CHECK(held[0] == id, "the store at ", link_.where(), " belongs to another job (--rdzv-id '", held[0],
             "'; this node has '", id, "'); start every node with the same --rdzv-id, or use another --master-port");
    LT_CHECK(held[1] == std::to_string(o_.nnodes), "node 0 was started with --nnodes ", held[1],
             ", this node with --nnodes ", o_.nnodes, "; every node needs the same --nnodes");
    const auto joined = link_.call([k = "lt/launch/joined" + std::to_string(o_.nodeRank)](c10d::TCPStore& s) {
      return s.add(k, 1);
    });
    LT_CHECK(joined == 1, "node rank ", o_.nodeRank, " already joined this job: two nodes were given --node-rank ",
             o_.nodeRank, "; give each node its own rank in 0..", o_.nnodes - 1);
    runId_ = held[2];
  }

  const LaunchOptions& o_;
  StoreLink link_;
  std::string runId_;
  Clock::time_point nextRetry_{};
  bool lostSaid_ = false;
};

// ------------------------------------------------------------------ one attempt
struct Attempt {
  std::vector<pid_t> pids;  // by local rank; -1 once reaped
  int alive = 0;
  std::string firstFailure;  // this node's, or the one another node reported
  std::string laterDeaths;   // "; rank 0 (of 2) was killed by signal 11 (...)": not by us
  bool failed = false;
  bool killedByUs = false;
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
  at.killedByUs = true;
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
          // A rank that crashes after the first failure is named too: its own message is lost.
          if (!first && WIFSIGNALED(status) && !at.killedByUs)
            at.laterDeaths += "; " + rankName(o, r) + " then " + describeExitStatus(status);
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
      nodes->beat();
      if (auto f = nodes->failure(attempt); f && !at.failed) fail(*f);
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
    std::error_code ec;
    const fs::path tmp = fs::temp_directory_path(ec);
    LT_CHECK(!ec, "the temporary directory is not usable (", ec.message(), "); set TMPDIR to a directory this user ",
             "can write (the ranks rendezvous through a file there)");
    storeFile = (tmp / ("longtrain-" + runId + "-" + std::to_string(attempt) + ".store")).string();
    fs::remove(storeFile, ec);
  } else {
    nodes->arrive(attempt);
  }
  Attempt at = spawn(argv, o, attempt, runId, storeFile);
  supervise(at, o, nodes, attempt);
  std::error_code ec;
  if (!storeFile.empty()) fs::remove(storeFile, ec);
  at.firstFailure += at.laterDeaths;
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
  std::vector<std::string> args = argv;
  if (nodes && o.nnodes > 1) {
    const auto extra = nodes->agree();
    args.insert(args.end(), extra.begin(), extra.end());
  }
  ::signal(SIGTERM, onSignal);
  ::signal(SIGINT, onSignal);
  for (int attempt = 0;; ++attempt) {
    const int rc = runAttempt(args, o, nodes.get(), attempt, runId);
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
