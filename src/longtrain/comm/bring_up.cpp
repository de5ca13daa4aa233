// A rank's bring-up (see bring_up.h). Gloo binds the interface toward MASTER_ADDR, which the
// local launcher sets to 127.0.0.1, so a one-node job stays on loopback.
#include "longtrain/comm/bring_up.h"

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "longtrain/comm/binding.h"
#include "longtrain/comm/identity.h"
#include "longtrain/core/cpu.h"

namespace lt::comm {

namespace {

RankIdentity identityOf(const BringUpOptions& o, int world, const std::string& bindAddress) {
  RankIdentity id;
  id.agreed = o.agreed;
  id.agreed["world_size"] = std::to_string(world);
  id.agreed["binary"] = binaryDigest();
  for (const char* k : {"LONGTRAIN_RUN_ID", "TORCHELASTIC_RUN_ID"})
    if (const char* v = std::getenv(k); v && *v) id.agreed[std::string("job_id (") + k + ")"] = v;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  id.host = std::string(host) + (bindAddress.empty() ? "" : " " + bindAddress);
  return id;
}

Groups groupsOf(const BringUpOptions& o, const EnvRendezvous& rv) {
  Options co;
  co.timeout = o.timeout;
  if (rv.size == 1) return makeGroups(c10::make_intrusive<c10d::HashStore>(), 0, 1, o.sequenceParallel, co);
  const char* master = std::getenv("MASTER_ADDR");
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const auto b = glooBindingFor(master ? master : "", ifname ? ifname : "");
  co.hostname = b.hostname;
  co.interfaces = b.interfaces;
  if (rv.rank == 0 && (!b.interfaces.empty() || b.hostname != "127.0.0.1"))
    std::printf("longtrain: %s\n", b.describe().c_str());
  const auto hosts =
      exchangeIdentity(*rv.store, rv.rank, rv.size, identityOf(o, rv.size, co.hostname), co.timeout, rv.storeWhere);
  auto groups = makeGroups(rv.store, rv.rank, rv.size, o.sequenceParallel, co, rv.heartbeatStore, o.ringDegree);
  groups.liveness->setHosts(hosts);
  groups.liveness->setStoreWhere(rv.storeWhere);
  return groups;
}

}  // namespace

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

std::vector<int> setUpThreads(int threads, int localRank, int localSize) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int n = threadsPerRank(threads, localSize);
  at::set_num_threads(n);
  at::set_num_interop_threads(1);
  std::vector<int> cpus;
  if (std::getenv("LOCAL_RANK") != nullptr)
    for (int c = localRank * n; c < (localRank + 1) * n && c < cores; ++c) cpus.push_back(c);
  return cpus;
}

RankSetup bringUp(const BringUpOptions& opts) {
  RankSetup s;
  s.rendezvous = rendezvousFromEnv(opts.timeout);
  s.cpus = setUpThreads(opts.threads, s.rendezvous.localRank, s.rendezvous.localSize);
  s.groups = groupsOf(opts, s.rendezvous);
  return s;
}

}  // namespace lt::comm
