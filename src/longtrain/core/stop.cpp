// Signal handlers for preemption-safe stops (see stop.h); async-signal-safe calls only.
#include "longtrain/core/stop.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace lt {

namespace {

std::atomic<int> gSignal{0};
std::atomic<long long> gFirstNs{0};
const char* gSay = nullptr;  // what the first signal prints (set before the handlers), or nothing

constexpr char kWithCheckpoint[] =
    "longtrain: stop requested; finishing the step, then checkpointing (a second signal exits at once)\n";
constexpr char kWithout[] =
    "longtrain: stop requested; finishing the step, then exiting without a checkpoint (train.checkpoint.dir is not "
    "set; a second signal exits at once)\n";

long long nowNs() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

void onStop(int sig) {
  int none = 0;
  if (gSignal.compare_exchange_strong(none, sig)) {
    gFirstNs.store(nowNs());
    if (const char* say = gSay) (void)!::write(2, say, std::strlen(say));
    return;
  }
  if (nowNs() - gFirstNs.load() > 1000000000LL) ::_exit(128 + sig);
}

}  // namespace

void installStopHandlers(bool checkpointing, bool speak) {
  gSay = !speak ? nullptr : checkpointing ? kWithCheckpoint : kWithout;
  struct sigaction sa {};
  sa.sa_handler = onStop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
}

int stopSignal() { return gSignal.load(); }

}  // namespace lt
