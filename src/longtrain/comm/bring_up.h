// A rank's bring-up inside a job: rendezvous from the launcher's environment, intra-op threads
// and the CPUs this rank owns, the job identity every rank must share, then the groups.
// Non-obvious: comm knows no config; the caller passes what the ranks must agree on as
// key -> value text (train passes every key of the effective config), and the world size,
// the binary's digest and the job id are added here, so every entry point checks them.
#pragma once
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "longtrain/comm/comm.h"

namespace lt::comm {

struct BringUpOptions {
  int sequenceParallel = 1;  // SP group size (every rank of a job in `eval --nproc`)
  int ringDegree = 1;        // ring attention degree inside the SP group
  Millis timeout{60000};     // every collective, and each wait for a peer
  int threads = 0;           // intra-op threads; 0: this rank's share of the cores
  std::map<std::string, std::string> agreed;  // key -> value every rank must hold the same
};

struct RankSetup {
  EnvRendezvous rendezvous;
  Groups groups;
  std::vector<int> cpus;  // the CPUs this rank owns under a local launcher; empty: none in particular
};

// From the torchrun-style environment; a job of one rank gets a private store and no exchange.
RankSetup bringUp(const BringUpOptions& opts);

// Intra-op threads (`threads`, else the cores / localSize) and, under a launcher (LOCAL_RANK set),
// the CPUs local rank l owns: [l x threads, (l + 1) x threads).
std::vector<int> setUpThreads(int threads, int localRank, int localSize);

// An integer environment variable, or `fallback` when it is unset or empty.
int envInt(const char* name, int fallback);

}  // namespace lt::comm
