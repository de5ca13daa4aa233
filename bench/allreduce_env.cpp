// bench/allreduce_env: Comm::allReduce between processes started with torchrun's environment
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; Gloo binds by comm/binding.h's rules), 1 MiB to
// 256 MiB, as nccl-tests reports it: algbw = bytes / time, busbw = algbw x 2(P-1)/P. Checks
// the sum. bench/two_hosts.sh runs it across two network namespaces beside a raw TCP stream.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "longtrain/comm/binding.h"
#include "longtrain/comm/comm.h"
#include "longtrain/core/check.h"

int main() {
  at::set_num_threads(1);
  const auto timeout = std::chrono::milliseconds(60000);
  auto rv = lt::comm::rendezvousFromEnv(timeout);
  const char* master = std::getenv("MASTER_ADDR");
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const auto b = lt::comm::glooBindingFor(master ? master : "", ifname ? ifname : "");
  lt::comm::Options o;
  o.timeout = timeout;
  o.hostname = b.hostname;
  o.interfaces = b.interfaces;
  lt::comm::Comm c(rv.store, rv.rank, rv.size, o, "bench");
  const int P = rv.size;
  if (rv.rank == 0) std::printf("%-6s %-12s %-10s %-12s %-12s   (%s)\n", "ranks", "bytes", "time_ms", "algbw_GB/s",
                                "busbw_GB/s", b.describe().c_str());
  for (int64_t bytes = int64_t(1) << 20; bytes <= (int64_t(1) << 28); bytes *= 4) {
    const int64_t n = bytes / 4;
    auto t = at::full({n}, static_cast<float>(rv.rank + 1));
    c.allReduce(t).wait();  // warm-up
    const int iters = bytes >= (int64_t(1) << 26) ? 3 : 10;
    c.barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) c.allReduce(t).wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    // After 1 + iters all-reduces of ranks' (r + 1): sum^(1 + iters)... keep it exact instead:
    auto check = at::full({16}, 1.0f);
    c.allReduce(check).wait();
    LT_CHECK(check[0].item<float>() == static_cast<float>(P), "wrong all-reduce result");
    LT_CHECK(std::isfinite(t[0].item<float>()), "non-finite all-reduce result");
    const double algbw = bytes / s / 1e9;
    if (rv.rank == 0)
      std::printf("%-6d %-12lld %-10.2f %-12.3f %-12.3f\n", P, (long long)bytes, s * 1e3, algbw, algbw * 2 * (P - 1) / P);
  }
  c.barrier();
  return 0;
}
