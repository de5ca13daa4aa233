// bench/alltoall: achieved bandwidth of Comm::allToAll (Gloo over loopback TCP) between
// thread ranks, as nccl-tests reports it: algbw = bytes per rank / time, busbw = algbw x
// (P-1)/P (the share of each rank's buffer that actually crosses a link). It also checks
// the result. Usage: bench_alltoall [max_ranks=4]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

#include "longtrain/comm/comm.h"
#include "longtrain/core/check.h"

int main(int argc, char** argv) {
  at::set_num_threads(1);
  int maxRanks = argc > 1 ? std::atoi(argv[1]) : 4;
  std::printf("%-6s %-12s %-12s %-12s %-12s\n", "ranks", "bytes/rank", "time_ms", "algbw_GB/s", "busbw_GB/s");
  for (int p = 2; p <= maxRanks; p *= 2) {
    for (int64_t bytes : {int64_t(1) << 20, int64_t(1) << 24, int64_t(1) << 26}) {
      auto store = c10::make_intrusive<c10d::HashStore>();
      std::vector<double> ms(p);
      std::vector<std::thread> ts;
      for (int r = 0; r < p; ++r)
        ts.emplace_back([&, r] {
          lt::comm::Comm c(store, r, p, {}, "a2a");
          int64_t n = bytes / 4 / p * p;
          auto in = at::arange(n, at::kFloat) + r * 1e7, out = at::empty({n});
          for (int w = 0; w < 2; ++w) c.allToAll(out, in).wait();  // warm-up
          const int iters = bytes >= (int64_t(1) << 26) ? 5 : 20;
          c.barrier();
          auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < iters; ++i) c.allToAll(out, in).wait();
          ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
          // chunk j of `out` came from rank j: its first element is j*1e7 + r*(n/p).
          for (int j = 0; j < p; ++j)
            LT_CHECK(out[j * (n / p)].item<float>() == static_cast<float>(j * 1e7 + r * (n / p)), "wrong result");
        });
      for (auto& t : ts) t.join();
      double t = *std::max_element(ms.begin(), ms.end());
      double alg = bytes / (t / 1e3) / 1e9;
      std::printf("%-6d %-12lld %-12.3f %-12.3f %-12.3f\n", p, (long long)bytes, t, alg, alg * (p - 1) / p);
    }
  }
}
