// fork/exec launcher. The first failure wins the report; the rest are its consequences.
#include "longtrain/comm/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "longtrain/core/check.h"

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

static std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    return "was killed by signal " + std::to_string(s) + " (" + strsignal(s) + ")";
  }
  return "ended with status " + std::to_string(status);
}

namespace {

// One attempt: starts every rank and waits for all of them. Returns 0 or 1 as launchLocal.
int runOnce(const std::vector<std::string>& argv, const LaunchOptions& opts, int attempt) {
  int port = findFreePort();
  std::vector<pid_t> pids(opts.nproc, -1);
  pid_t parent = ::getpid();
  for (int r = 0; r < opts.nproc; ++r) {
    pid_t pid = ::fork();
    LT_CHECK(pid >= 0, "fork failed: ", std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(opts.nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(opts.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("LONGTRAIN_LAUNCHED", "1", 1);
      ::setenv("LONGTRAIN_RESTART_ATTEMPT", std::to_string(attempt).c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv("/proc/self/exe", args.data());
      std::fprintf(stderr, "longtrain launcher: exec failed: %s\n", std::strerror(errno));
      ::_exit(127);
    }
    pids[r] = pid;
  }

  int alive = opts.nproc, firstFailed = -1;
  std::string firstWhy;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (alive > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (int r = 0; r < opts.nproc; ++r)
          if (pids[r] > 0) ::kill(pids[r], SIGKILL);
        deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) break;
    int rank = -1;
    for (int r = 0; r < opts.nproc; ++r)
      if (pids[r] == pid) rank = r;
    if (rank < 0) continue;
    pids[rank] = -1;
    --alive;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && firstFailed < 0) {
      firstFailed = rank;
      firstWhy = describeStatus(status);
      deadline = std::chrono::steady_clock::now() + opts.grace;
    }
  }
  if (firstFailed >= 0) {
    std::fprintf(stderr, "longtrain launcher: rank %d (of %d) %s; the job failed\n", firstFailed, opts.nproc,
                 firstWhy.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int launchLocal(const std::vector<std::string>& argv, const LaunchOptions& opts) {
  LT_CHECK(opts.nproc >= 1, "--nproc must be at least 1, got ", opts.nproc);
  LT_CHECK(opts.maxRestarts >= 0, "--max-restarts must be at least 0, got ", opts.maxRestarts);
  if (!std::getenv("LONGTRAIN_RUN_ID")) {  // one id for every attempt of this launch
    std::random_device rd;
    char id[17];
    std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
    ::setenv("LONGTRAIN_RUN_ID", id, 1);
  }
  for (int attempt = 0;; ++attempt) {
    if (runOnce(argv, opts, attempt) == 0) return 0;
    if (attempt >= opts.maxRestarts) {
      if (opts.maxRestarts > 0)
        std::fprintf(stderr, "longtrain launcher: giving up after %d restart(s) (--max-restarts %d)\n", attempt,
                     opts.maxRestarts);
      return 1;
    }
    std::fprintf(stderr, "longtrain launcher: restarting the job (restart %d of %d) from its newest checkpoint\n",
                 attempt + 1, opts.maxRestarts);
  }
}

}  // namespace lt::comm
