// Measured rates (measured_rates.h). GEMMs above kMeasuredRows rows, and attention above 2048
// tokens, are timed there and scaled: their rate has stopped changing with size by then.
// Non-obvious: `train --fit` measures in the process that then trains, whose peak RSS its budget
// bounds, and it prices candidates it will not run (a whole [2048, vocab] logits GEMM took 256 MiB
// there, over a 403 MiB budget the chosen run kept to). So beyond the weights every measurement
// holds at most kMeasurementBytes: GEMM rows, the stream, Adam's, the re-fault and the disk
// probes' buffers.
#include "longtrain/train/measured_rates.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "longtrain/kernels/cpu_adam.h"
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/model/model.h"

namespace lt::train {

namespace {

constexpr int64_t kMeasuredRows = 2048;
constexpr int64_t kMeasurementBytes = 32 << 20;
constexpr int kLargestStreamBucket = 25;  // log2 of kMeasurementBytes: streamAt's buckets stop there
static_assert(int64_t{1} << kLargestStreamBucket == kMeasurementBytes);

// The rows a GEMM of N outputs over K inputs is timed at: at most kMeasuredRows, and its
// row-sized operands (x, y, dy, dx) within kMeasurementBytes; whole micro-tile multiples, >= 64.
int64_t measuredRows(int64_t M, int64_t N, int64_t K) {
  const int64_t fit = kMeasurementBytes / (2 * 4 * (N + K)) / 64 * 64;
  return std::min({M, kMeasuredRows, std::max<int64_t>(64, fit)});
}

using Clock = std::chrono::steady_clock;

// Seconds of one call of `fn`: the second best of 5 rounds long enough to time (>= 5 ms each),
// after a warm-up. Not the median: on a VM, a GEMM of a few hundred microseconds sometimes waits
// ~4 ms for its second thread (a halted vCPU) for a whole round, which a run's steady stream of
// work does not see (quick start: the median over-predicted the step by 1.0-1.5x).
template <class F>
double medianSeconds(F&& fn) {
  fn();
  auto t0 = Clock::now();
  fn();
  const double once = std::chrono::duration<double>(Clock::now() - t0).count();
  const int reps = std::max(1, static_cast<int>(0.005 / std::max(once, 1e-7)));
  const int rounds = once > 0.2 ? 3 : 5;
  std::vector<double> s;
  for (int r = 0; r < rounds; ++r) {
    t0 = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  std::sort(s.begin(), s.end());
  return s[1];
}

// Seconds of a piece of work's forward and backward.
struct Times {
  double forward = 0, backward = 0;
};

// `forward` timed, and the backward as what `both` (forward then backward) takes beyond it.
template <class F, class G>
Times forwardAndBackward(F&& forward, G&& both) {
  Times t;
  t.forward = medianSeconds(forward);
  t.backward = std::max(0.0, medianSeconds(both) - t.forward);
  return t;
}

// y = x W^T over M rows, and backward's dX = dY W and dW = dY^T X, by `route`.
Times timeLinear(int64_t M, int64_t N, int64_t K, kernels::GemmRoute route) {
  const auto type = route == kernels::GemmRoute::Bf16 ? at::kBFloat16 : at::kFloat;
  auto x = at::randn({M, K}).to(type), w = at::randn({N, K}).to(type), dy = at::randn({M, N}).to(type);
  auto y = at::empty({M, N}), dx = at::empty({M, K}), dw = at::empty({N, K});
  Times t;
  t.forward = medianSeconds([&] { kernels::matmulInto(y, x, false, w, true, route); });
  t.backward = medianSeconds([&] {
    kernels::matmulInto(dx, dy, false, w, false, route);
    kernels::matmulInto(dw, dy, true, x, false, route);
  });
  return t;
}

Times timeAttention(int64_t B, int64_t S, int64_t heads, int64_t kvHeads, int64_t dim, bool bf16) {
  kernels::FusedAttentionOptions o;
  o.bf16 = bf16;
  auto q = at::randn({B, S, heads, dim}).set_requires_grad(true);
  auto k = at::randn({B, S, kvHeads, dim}).set_requires_grad(true);
  auto v = at::randn({B, S, kvHeads, dim}).set_requires_grad(true);
  auto g = at::randn({B, S, heads, dim});
  return forwardAndBackward(
      [&] {
        at::NoGradGuard ng;
        (void)kernels::fusedAttention(q, k, v, o);
      },
      [&] {
        kernels::fusedAttention(q, k, v, o).backward(g);
        for (auto* p : {&q, &k, &v}) p->mutable_grad().reset();
      });
}

// One decoder block of `m` over [B, S] tokens with its GEMMs on `route`, the model's code and
// attention core: forward (recording the graph, as training does) and backward (into the input
// and every weight). A one-block model with an 8-token vocabulary: only the block is run.
Times timeBlock(config::ModelConfig m, int64_t B, int64_t S, kernels::GemmRoute route) {
  m.layers = 1, m.vocabSize = 8, m.initFrom.clear();
  m.resolved.bf16Gemms = route == kernels::GemmRoute::Bf16;
  m.resolved.oneDnnGemm = route == kernels::GemmRoute::OneDnn;
  model::Model model(m, 1);
  const auto core = model::attentionCore(m);
  auto x = at::randn({B, S, m.hidden}).set_requires_grad(true), g = at::randn({B, S, m.hidden});
  auto pos = at::arange(S, at::kLong).unsqueeze(0).repeat({B, 1});
  auto params = model.group(0);
  return forwardAndBackward([&] { (void)model.block(0, x, pos, core); },
                            [&] {
                              model.block(0, x, pos, core).backward(g);
                              x.mutable_grad().reset();
                              for (auto& p : params) p.tensor.mutable_grad().reset();
                            });
}

// The block's inputs of `m` that change its time, with the measured B and S: a cache key.
std::string blockKey(const config::ModelConfig& m, int64_t B, int64_t S) {
  const int64_t fields[] = {m.hidden, m.heads, m.kvHeads, m.headDim(), m.intermediate, m.fusedKernels, m.tiledMlp,
                            static_cast<int64_t>(m.attention), m.attentionChunk, m.slidingWindow, m.attentionBias,
                            m.qkNorm, static_cast<int64_t>(m.modelType), m.resolved.bf16Attention,
                            m.resolved.packedDocuments, B, S};
  std::string key;
  for (int64_t f : fields) key += std::to_string(f) + ",";
  return key;
}

// Seconds per byte of x.mul_(c) over a tensor of `bytes` (each element read and written), at
// most kMeasurementBytes: beyond this Zen 2's 16 MiB L3, the size of a Zen 4's, so a larger
// tensor may stream somewhat slower than priced there.
double timeStream(double bytes) {
  const int64_t n = std::max<int64_t>(1024, static_cast<int64_t>(bytes / 4));
  auto x = at::ones({n});
  return medianSeconds([&] { x.mul_(1.0f); }) / (2.0 * 4.0 * static_cast<double>(n));
}

double timeSmallOp() {
  auto a = at::ones({256}), b = at::ones({256});
  return medianSeconds([&] { (void)at::add(a, b); });
}

double timeAdamPerElement() {
  constexpr int64_t n = kMeasurementBytes / (4 * 4);  // p, g, m, v
  std::vector<float> p(n, 1.0f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);
  int64_t step = 0;
  return medianSeconds([&] {
           kernels::adamStep(p.data(), g.data(), m.data(), v.data(), n, ++step, {}, at::get_num_threads());
         }) /
         static_cast<double>(n);
}

constexpr size_t kStreamTotal = 64u << 20, kStreamPiece = 1u << 20;

// Loopback TCP, one stream of 64 MiB: Gloo's transport between ranks of one host. 0 on failure.
double timeLoopbackPerByte() {
  const int server = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (server < 0 || ::bind(server, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(server, 1) != 0 ||
      ::getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (server >= 0) ::close(server);
    return 0;
  }
  std::thread sender([addr] {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    std::vector<char> buf(kStreamPiece, 1);
    if (s >= 0 && ::connect(s, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0)
      for (size_t sent = 0; sent < kStreamTotal;) {
        const ssize_t w = ::send(s, buf.data(), std::min(kStreamPiece, kStreamTotal - sent), MSG_NOSIGNAL);
        if (w <= 0) break;
        sent += static_cast<size_t>(w);
      }
    if (s >= 0) ::close(s);
  });
  const int c = ::accept(server, nullptr, nullptr);
  std::vector<char> buf(kStreamPiece);
  size_t got = 0;
  const auto t0 = Clock::now();
  while (c >= 0 && got < kStreamTotal) {
    const ssize_t r = ::recv(c, buf.data(), kStreamPiece, 0);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  sender.join();
  if (c >= 0) ::close(c);
  ::close(server);
  return got == kStreamTotal ? s / static_cast<double>(kStreamTotal) : 0;
}

// A byte the allocator gave back to the system (madvise DONTNEED: what tcmalloc's decommit under
// train.memory_budget does to every freed span) that the next tensor writes: the page fault, the
// kernel's zeroing and the madvise, beyond the write itself. On kMeasurementBytes / 2.
double timeRefaultPerByte() {
  constexpr size_t kBytes = kMeasurementBytes / 2;
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  auto* c = static_cast<volatile char*>(p);
  auto write = [&](int v) {
    std::memset(const_cast<char*>(c), v, kBytes);
    (void)c[kBytes - 1];  // the writes are used: not elided
  };
  write(1);
  const double resident = medianSeconds([&] { write(2); });
  const double refault = medianSeconds([&] {
    ::madvise(const_cast<char*>(c), kBytes, MADV_DONTNEED);
    write(3);
  });
  ::munmap(p, kBytes);
  return std::max(0.0, refault - resident) / static_cast<double>(kBytes);
}

// 64 MiB written to a file in `dir` and read back (the page cache's rate, as the offload sees it
// while memory lasts). 0 where the file cannot be made.
double timeDiskPerByte(const std::string& dir) {
  const std::string path = dir + "/.longtrain_rate_probe";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return 0;
  ::unlink(path.c_str());
  constexpr size_t kTotal = 64u << 20, kPiece = kMeasurementBytes / 2;
  std::vector<char> buf(kPiece, 1);
  const auto t0 = Clock::now();
  bool ok = true;
  for (size_t at = 0; ok && at < kTotal; at += kPiece) ok = ::pwrite(fd, buf.data(), kPiece, at) == static_cast<ssize_t>(kPiece);
  for (size_t at = 0; ok && at < kTotal; at += kPiece) ok = ::pread(fd, buf.data(), kPiece, at) == static_cast<ssize_t>(kPiece);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fd);
  return ok ? s / (2.0 * kTotal) : 0;
}

// Scales a time measured at min(n, cap) to n.
template <class F>
double scaledTo(int64_t n, int64_t cap, F&& timeAt) {
  const int64_t at = std::min(n, cap);
  return timeAt(at) * static_cast<double>(n) / static_cast<double>(at);
}

// The rank's intra-op thread count for the length of a measurement.
class ThreadsFor {
 public:
  explicit ThreadsFor(int threads) : before_(at::get_num_threads()) { at::set_num_threads(threads); }
  ~ThreadsFor() { at::set_num_threads(before_); }
  ThreadsFor(const ThreadsFor&) = delete;
  ThreadsFor& operator=(const ThreadsFor&) = delete;

 private:
  int before_;
};

// The measurement at `key` in `kept`, made on the first ask (on the rank's thread count) and kept.
template <class Map, class Measure>
const typename Map::mapped_type& measuredOnce(Map& kept, const typename Map::key_type& key, int threads,
                                              Measure&& measure) {
  auto it = kept.find(key);
  if (it == kept.end()) {
    ThreadsFor t(threads);
    it = kept.emplace(key, measure()).first;
  }
  return it->second;
}

struct Cache {
  kernels::GemmRoute route;
  bool bf16Attention = false;
  int threads = 1;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Times> linear;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, Times> attention;
  std::map<int, double> stream;  // by log2 of the tensor's bytes
  std::map<std::string, Times> block;
  const Times& linearAt(int64_t M, int64_t N, int64_t K) {
    return measuredOnce(linear, {M, N, K}, threads, [&] { return timeLinear(M, N, K, route); });
  }
  const Times& attentionAt(int64_t B, int64_t S, int64_t h, int64_t hk, int64_t d) {
    return measuredOnce(attention, {B, S, h, hk, d}, threads,
                        [&] { return timeAttention(B, S, h, hk, d, bf16Attention); });
  }
  const Times& blockAt(const config::ModelConfig& m, int64_t B, int64_t S) {
    return measuredOnce(block, blockKey(m, B, S), threads, [&] { return timeBlock(m, B, S, route); });
  }
  double streamAt(double bytes) {
    const int bucket = std::clamp(static_cast<int>(std::log2(std::max(bytes, 1.0))), 16, kLargestStreamBucket);
    return measuredOnce(stream, bucket, threads, [&] { return timeStream(std::ldexp(1.0, bucket)); });
  }
};

}  // namespace

plan::Rates measuredRates(kernels::GemmRoute route, bool bf16Attention, int threads, bool interRank,
                          const std::string& offloadDir) {
  auto cache = std::make_shared<Cache>();
  cache->route = route;
  cache->bf16Attention = bf16Attention;
  cache->threads = threads;
  ThreadsFor t(threads);
  (void)timeLinear(256, 256, 256, route);  // the thread pool and BLAS's buffers, before anything is timed
  plan::Rates r;
  r.linearForward = [cache](int64_t M, int64_t N, int64_t K) {
    return scaledTo(M, measuredRows(M, N, K), [&](int64_t m) { return cache->linearAt(m, N, K).forward; });
  };
  r.linearBackward = [cache](int64_t M, int64_t N, int64_t K) {
    return scaledTo(M, measuredRows(M, N, K), [&](int64_t m) { return cache->linearAt(m, N, K).backward; });
  };
  // The callers measure at <= 2048 tokens a sequence and scale by causal pairs themselves.
  r.attentionForward = [cache](int64_t B, int64_t S, int64_t h, int64_t hk, int64_t d) {
    return cache->attentionAt(B, S, h, hk, d).forward;
  };
  r.attentionBackward = [cache](int64_t B, int64_t S, int64_t h, int64_t hk, int64_t d) {
    return cache->attentionAt(B, S, h, hk, d).backward;
  };
  r.streamSecondsPerByte = [cache](double bytes) { return cache->streamAt(bytes); };
  r.block = [cache](const config::ModelConfig& m, int64_t B, int64_t S) {
    const auto& t = cache->blockAt(m, B, S);
    return std::make_pair(t.forward, t.backward);
  };
  r.opSeconds = timeSmallOp();
  r.adamSecondsPerElement = timeAdamPerElement();
  r.refaultSecondsPerByte = timeRefaultPerByte();
  if (interRank) r.commSecondsPerByte = timeLoopbackPerByte();
  if (!offloadDir.empty()) r.diskSecondsPerByte = timeDiskPerByte(offloadDir);
  return r;
}

}  // namespace lt::train
