// bench/fifo: cost of one pop-front (plus the push-back that keeps the length fixed) at
// queue lengths 10 .. 10^7, for lt::Fifo, std::deque and std::vector erase-at-front (the
// O(n) pattern DeepSpeed's Python lists have). Fifo and deque must stay flat; vector grows
// linearly with the length. Each benchmark checks the FIFO order it observes.
#include <benchmark/benchmark.h>

#include <deque>
#include <vector>

#include "longtrain/core/fifo.h"

namespace {

template <class Q>
void popFront(Q& q);
template <>
void popFront(lt::Fifo<int64_t>& q) { benchmark::DoNotOptimize(q.pop()); }
template <>
void popFront(std::deque<int64_t>& q) {
  benchmark::DoNotOptimize(q.front());
  q.pop_front();
}
template <>
void popFront(std::vector<int64_t>& q) {
  benchmark::DoNotOptimize(q.front());
  q.erase(q.begin());
}

template <class Q>
int64_t front(Q& q) { return q.front(); }

template <class Q>
void push(Q& q, int64_t v) {
  if constexpr (requires { q.push_back(v); }) q.push_back(v);
  else q.push(v);
}

template <class Q>
void BM_PopFront(benchmark::State& state) {
  const int64_t n = state.range(0);
  Q q;
  for (int64_t i = 0; i < n; ++i) push(q, i);
  int64_t next = n, expect = 0;
  for (auto _ : state) {
    if (front(q) != expect) state.SkipWithError("FIFO order violated");
    popFront(q);
    push(q, next++);
    ++expect;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["ns_per_pop"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void lengths(benchmark::internal::Benchmark* b) {
  for (int64_t n = 10; n <= 10000000; n *= 10) b->Arg(n);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_PopFront, lt::Fifo<int64_t>)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_PopFront, std::deque<int64_t>)->Apply(lengths);
BENCHMARK_TEMPLATE(BM_PopFront, std::vector<int64_t>)->Apply(lengths);
