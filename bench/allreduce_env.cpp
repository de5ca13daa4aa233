// bench/allreduce_env: Comm::allReduce between processes started with torchrun's environment
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; Gloo binds by comm/binding.h's rules), 1 MiB to
// 256 MiB, as nccl-tests reports it: busbw = bytes / time x 2(P-1)/P, for one Gloo all-reduce
// (busbw_1, Options::allReducePieces = 1, no exchange) and for Comm as training uses it (busbw_n:
// 2-rank sums below 4 MiB as one exchange, from 4 MiB in concurrent pieces). Checks the sums. With 2 ranks it also times, at each size
// and in the same processes, a raw TCP stream between them (rank 0 listens at MASTER_ADDR): one
// way (rank 1 sends the bytes), and both ways at once (each rank sends the bytes and receives
// the other's, as a 2-rank all-reduce does: its busbw is the bytes that cross the link each way
// per second). bench/two_hosts.sh runs it across two network namespaces.
// LT_BENCH_SIZES=a,b,...: sizes in MiB instead; LT_BENCH_RAW=0: no raw stream;
// LT_BENCH_N_FIRST=1: time busbw_n before busbw_1 (bench/two_hosts.sh alternates, as the second
// of two timings at a size can gain from the first).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "longtrain/comm/binding.h"
#include "longtrain/comm/comm.h"
#include "longtrain/core/check.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds (user + system) of each of this process's live threads so far; key -1: the
// whole process's, exited threads included.
std::map<int, double> threadCpu() {
  std::map<int, double> m;
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  m[-1] = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return m;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string line;
    std::getline(f, line);
    const auto r = line.rfind(')');
    if (r == std::string::npos) continue;
    std::istringstream ss(line.substr(r + 2));
    std::string x;
    unsigned long long ut = 0, st = 0;
    for (int i = 3; i <= 13; ++i) ss >> x;  // fields 3..13
    ss >> ut >> st;
    m[std::atoi(e->d_name)] = (ut + st) / tick;
  }
  ::closedir(d);
  return m;
}

// "1.62 (0.95 0.41 0.20)": CPU seconds per wall second between two threadCpu() readings, the
// process's and its three busiest live threads'.
std::string cpuShare(const std::map<int, double>& a, const std::map<int, double>& b, double wall) {
  std::vector<double> d;
  const double sum = b.at(-1) - a.at(-1);
  for (const auto& [tid, s] : b) {
    if (tid < 0) continue;
    const auto it = a.find(tid);
    d.push_back(s - (it == a.end() ? 0 : it->second));
  }
  std::sort(d.rbegin(), d.rend());
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.2f (%.2f %.2f %.2f)", sum / wall, d.size() > 0 ? d[0] / wall : 0,
                d.size() > 1 ? d[1] / wall : 0, d.size() > 2 ? d[2] / wall : 0);
  return buf;
}

// Bytes per send()/recv() call on the raw stream (LT_BENCH_RAW_CHUNK, default 1 MiB, Gloo's
// segment size; 64 KiB to 1 GiB measured alike here).
size_t rawChunk = size_t(1) << 20;

// The raw stream sends from and receives into buffers of at most LT_BENCH_RAW_BUF bytes
// (4 MiB), over and over, as iperf does: the link's speed with the data in cache. With
// buffers as large as the tensor, the copies run at DRAM speed (set LT_BENCH_RAW_BUF=0).
size_t rawBuf = size_t(4) << 20;

void sendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, std::min(n, rawChunk), MSG_NOSIGNAL);
    LT_CHECK(k > 0 || errno == EINTR, "raw send: ", std::strerror(errno));
    if (k > 0) p += k, n -= static_cast<size_t>(k);
  }
}

void recvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, std::min(n, rawChunk), 0);
    LT_CHECK(k > 0 || (k < 0 && errno == EINTR), "raw recv: ", k == 0 ? "closed by peer" : std::strerror(errno));
    if (k > 0) p += k, n -= static_cast<size_t>(k);
  }
}

// `bytes` through the raw stream, the buffer (rawBuf or smaller) sent or filled again and again.
void sendBytes(int fd, const std::vector<char>& buf, size_t bytes) {
  for (size_t k; bytes > 0; bytes -= k) sendAll(fd, buf.data(), k = std::min(bytes, buf.size()));
}
void recvBytes(int fd, std::vector<char>& buf, size_t bytes) {
  for (size_t k; bytes > 0; bytes -= k) recvAll(fd, buf.data(), k = std::min(bytes, buf.size()));
}

// One TCP connection between ranks 0 and 1, options as Gloo's pairs have them (TCP_NODELAY).
int rawConnect(c10d::Store& store, int rank, const std::string& masterAddr) {
  int fd = -1;
  if (rank == 0) {
    const int l = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    LT_CHECK(::inet_pton(AF_INET, masterAddr.c_str(), &a.sin_addr) == 1, "MASTER_ADDR must be an IPv4 address here");
    LT_CHECK(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(l, 1) == 0, "raw listen: ",
             std::strerror(errno));
    socklen_t len = sizeof a;
    ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
    const std::string port = std::to_string(ntohs(a.sin_port));
    store.set("bench/raw_port", std::vector<uint8_t>(port.begin(), port.end()));
    fd = ::accept(l, nullptr, nullptr);
    ::close(l);
  } else {
    const auto v = store.get("bench/raw_port");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(std::string(v.begin(), v.end()))));
    ::inet_pton(AF_INET, masterAddr.c_str(), &a.sin_addr);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    LT_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, "raw connect: ", std::strerror(errno));
  }
  LT_CHECK(fd >= 0, "raw accept: ", std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Seconds per transfer of `bytes` from rank 1 to rank 0, as rank 1 sees it (to rank 0's ack).
double rawOneWay(int fd, int rank, std::vector<char>& out, std::vector<char>& in, size_t bytes, int iters) {
  char ack = 0;
  double s = 0;
  if (rank == 1) {
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      sendBytes(fd, out, bytes);
      recvAll(fd, &ack, 1);
    }
    s = since(t0) / iters;
    sendAll(fd, reinterpret_cast<const char*>(&s), sizeof s);
  } else {
    for (int i = 0; i < iters; ++i) {
      recvBytes(fd, in, bytes);
      sendAll(fd, &ack, 1);
    }
    recvAll(fd, reinterpret_cast<char*>(&s), sizeof s);
  }
  return s;
}

// Seconds per exchange of `bytes` each way at once (a sending thread beside the receiving
// one), the slower rank's.
double rawBothWays(int fd, std::vector<char>& out, std::vector<char>& in, size_t bytes, int iters) {
  auto t0 = Clock::now();
  std::thread tx([&] {
    for (int i = 0; i < iters; ++i) sendBytes(fd, out, bytes);
  });
  for (int i = 0; i < iters; ++i) recvBytes(fd, in, bytes);
  tx.join();
  double s = since(t0) / iters, other = 0;
  sendAll(fd, reinterpret_cast<const char*>(&s), sizeof s);
  recvAll(fd, reinterpret_cast<char*>(&other), sizeof other);
  return std::max(s, other);
}

}  // namespace

// Seconds per all-reduce of `bytes` (after a warm-up one), and this rank's CPU share
// meanwhile; checks the sum on a fresh tensor after.
double timeAllReduce(lt::comm::Comm& c, int64_t bytes, int iters, std::string* cpu) {
  const int P = c.size();
  auto t = at::full({bytes / 4}, static_cast<float>(c.rank() + 1));
  c.allReduce(t).wait();
  c.barrier();
  const auto cpu0 = threadCpu();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) c.allReduce(t).wait();
  const double s = since(t0) / iters;
  *cpu = cpuShare(cpu0, threadCpu(), s * iters);
  // The sum of ranks' (r + 1) is exact in fp32 (t above holds sums of sums).
  t.fill_(static_cast<float>(c.rank() + 1));
  c.allReduce(t).wait();
  LT_CHECK(at::equal(t, at::full({bytes / 4}, static_cast<float>(P * (P + 1) / 2))), "wrong all-reduce result");
  return s;
}

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
  lt::comm::Comm c(rv.store, rv.rank, rv.size, o, "bench");  // as training has it
  lt::comm::Options o1 = o;
  o1.allReducePieces = 1;
  o1.allReduceExchange = false;
  lt::comm::Comm c1(rv.store, rv.rank, rv.size, o1, "bench1");  // one Gloo all-reduce, as before
  const int P = rv.size;
  std::vector<int64_t> sizes;
  if (const char* s = std::getenv("LT_BENCH_SIZES"); s && *s) {
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');) sizes.push_back(static_cast<int64_t>(std::stod(x) * (1 << 20)) / 4 * 4);
  } else {
    for (int64_t bytes = int64_t(1) << 20; bytes <= (int64_t(1) << 28); bytes *= 4) sizes.push_back(bytes);
  }
  if (const char* ch = std::getenv("LT_BENCH_RAW_CHUNK"); ch && *ch) rawChunk = std::stoull(ch);
  const char* first = std::getenv("LT_BENCH_N_FIRST");  // "1": time Comm's pieces before one all-reduce
  const bool nFirst = first && first[0] == '1';
  const char* rawEnv = std::getenv("LT_BENCH_RAW");  // "0": Gloo alone
  const bool raw = P == 2 && master && *master && std::string(master) != "localhost" && !(rawEnv && rawEnv[0] == '0');
  const int fd = raw ? rawConnect(*rv.store, rv.rank, master) : -1;
  std::vector<char> out, in;
  if (raw) {
    if (const char* rb = std::getenv("LT_BENCH_RAW_BUF"); rb && *rb) rawBuf = std::stoull(rb);
    int64_t most = *std::max_element(sizes.begin(), sizes.end());
    if (rawBuf > 0) most = std::min<int64_t>(most, rawBuf);
    out.assign(most, 1);  // touched, as a tensor's pages are
    in.assign(most, 0);
  }
  if (rv.rank == 0) {
    std::printf("%s; %d ranks; GB/s = 1e9 bytes/s; busbw_1: one Gloo all-reduce; busbw_n: Comm's %d pieces from %lld bytes%s\n",
                b.describe().c_str(), P, o.allReducePieces, (long long)o.allReduceSplitBytes,
                P == 2 ? "" : " (not split: only 2-rank sums are)");
    std::printf("%-10s %-8s %-8s", "bytes", "busbw_1", "busbw_n");
    if (raw) std::printf(" %-8s %-8s %-8s %-8s %-8s %-8s", "raw_1way", "raw_2way", "1/1way", "1/2way", "n/1way", "n/2way");
    std::printf(" | rank 0's cpu/wall, 1 and n (busiest threads)\n");
  }
  for (const int64_t bytes : sizes) {
    // ~0.1 s or more per timing: a few milliseconds of a descheduled thread swamp fewer.
    const int iters = bytes <= (int64_t(1) << 20) ? 40 : bytes <= (int64_t(4) << 20) ? 20 : bytes < (int64_t(64) << 20) ? 10 : 3;
    std::string cpu1, cpuN;
    double s1 = 0, sN = 0;
    if (nFirst) sN = timeAllReduce(c, bytes, iters, &cpuN);
    s1 = timeAllReduce(c1, bytes, iters, &cpu1);
    if (!nFirst) sN = timeAllReduce(c, bytes, iters, &cpuN);
    const double bus1 = bytes / s1 / 1e9 * 2 * (P - 1) / P, busN = bytes / sN / 1e9 * 2 * (P - 1) / P;
    double oneWay = 0, bothWays = 0;
    if (raw) {
      c.barrier();
      oneWay = bytes / rawOneWay(fd, rv.rank, out, in, bytes, iters) / 1e9;
      c.barrier();
      bothWays = bytes / rawBothWays(fd, out, in, bytes, iters) / 1e9;
    }
    if (rv.rank == 0) {
      std::printf("%-10lld %-8.3f %-8.3f", (long long)bytes, bus1, busN);
      if (raw)
        std::printf(" %-8.3f %-8.3f %-8.0f %-8.0f %-8.0f %-8.0f", oneWay, bothWays, 100 * bus1 / oneWay,
                    100 * bus1 / bothWays, 100 * busN / oneWay, 100 * busN / bothWays);
      std::printf(" | %s; %s\n", cpu1.c_str(), cpuN.c_str());
      std::fflush(stdout);
    }
  }
  if (fd >= 0) ::close(fd);
  c.barrier();
  return 0;
}
