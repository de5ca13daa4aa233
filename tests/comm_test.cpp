// comm/: collectives on 2, 3 and 4 thread-ranks against closed-form expectations, and a
// lost peer turning into an error that names it, within the timeout.
#include <signal.h>

#include <chrono>
#include <thread>

#include "longtrain/comm/binding.h"
#include "longtrain/core/check.h"
#include "testing.h"

namespace {

using lt::testing::runRanks;

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, ClosedForm) {
  const int n = GetParam();
  runRanks(n, 1, [n](int r, lt::comm::Groups& g) {
    auto& c = *g.world;
    // allReduce: sum of `rank` over ranks is n(n-1)/2; max is n-1.
    auto t = at::full({5}, static_cast<float>(r));
    c.allReduce(t).wait();
    EXPECT_TRUE(at::equal(t, at::full({5}, n * (n - 1) / 2.0f)));
    auto m = at::full({3}, static_cast<float>(r));
    c.allReduce(m, lt::comm::ReduceOp::Max).wait();
    EXPECT_TRUE(at::equal(m, at::full({3}, n - 1.0f)));
    // allGather: rank i contributes [i, i+0.5].
    auto in = at::tensor({r * 1.0f, r + 0.5f});
    auto out = at::empty({n, 2});
    c.allGather(out, in).wait();
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(out[i][0].item<float>(), i);
      EXPECT_EQ(out[i][1].item<float>(), i + 0.5f);
    }
    // allGather of bf16 (Gloo has no bf16: sent as bytes), odd lengths, values that need all 16 bits.
    auto in16 = (at::arange(3, at::kFloat) * -1.37f + r * 1000.0f + 0.01f).to(at::kBFloat16);
    auto out16 = at::empty({3 * n}, at::kBFloat16);
    c.allGather(out16, in16).wait();
    for (int i = 0; i < n; ++i)
      EXPECT_TRUE(at::equal(out16.narrow(0, 3 * i, 3),
                            (at::arange(3, at::kFloat) * -1.37f + i * 1000.0f + 0.01f).to(at::kBFloat16)));
    // allGatherCoalesced: an fp32 and a bf16 pair of odd lengths in one collective, each out
    // equal to what its own allGather gives (the bf16 values need all 16 bits).
    {
      auto a = at::arange(5, at::kFloat) * 0.25f + r * 100.0f;
      auto b = (at::arange(3, at::kFloat) * -1.37f + r * 1000.0f + 0.01f).to(at::kBFloat16);
      auto outA = at::empty({5 * n}), outB = at::empty({3 * n}, at::kBFloat16);
      c.allGatherCoalesced({outA, outB}, {a, b}).wait();
      for (int i = 0; i < n; ++i) {
        EXPECT_TRUE(at::equal(outA.narrow(0, 5 * i, 5), at::arange(5, at::kFloat) * 0.25f + i * 100.0f));
        EXPECT_TRUE(at::equal(outB.narrow(0, 3 * i, 3),
                              (at::arange(3, at::kFloat) * -1.37f + i * 1000.0f + 0.01f).to(at::kBFloat16)));
      }
    }
    // reduceScatter on sizes not divisible by n: element e of every rank's input is e + rank.
    for (int64_t len : {7, 13, 1, 2 * n + 1}) {
      auto src = at::arange(len, at::kFloat) + r;
      auto sizes = c.chunkSizes(len);
      int64_t off = 0;
      for (int i = 0; i < r; ++i) off += sizes[i];
      auto dst = at::empty({sizes[r]});
      c.reduceScatter(dst, src).wait();
      auto expect = (at::arange(off, off + sizes[r], at::kFloat) * n) + n * (n - 1) / 2.0f;
      EXPECT_TRUE(at::equal(dst, expect)) << "len " << len;
    }
    // reduceScatter of bf16 into fp32: the bf16 values travel and are summed in fp32 (small
    // integers and halves are exact in bf16; 257 + rank is not, and rounds to even first).
    for (int64_t len : {7, 2 * n + 1}) {
      auto src = (at::arange(len, at::kFloat) * 0.5f + r + 257.0f).to(at::kBFloat16);
      auto sizes = c.chunkSizes(len);
      int64_t off = 0;
      for (int i = 0; i < r; ++i) off += sizes[i];
      auto dst = at::empty({sizes[r]});
      c.reduceScatter(dst, src).wait();
      auto expect = at::zeros({sizes[r]});
      for (int i = 0; i < n; ++i)
        expect += (at::arange(off, off + sizes[r], at::kFloat) * 0.5f + i + 257.0f).to(at::kBFloat16).to(at::kFloat);
      EXPECT_TRUE(at::equal(dst, expect)) << "bf16 len " << len;
    }
    // allToAll: chunk j of rank i holds 100*i + j; afterwards chunk i of rank j holds 100*i + j.
    auto a = at::empty({n, 2});
    for (int j = 0; j < n; ++j) a[j].fill_(100.0f * r + j);
    auto b = at::empty_like(a);
    c.allToAll(b, a).wait();
    for (int i = 0; i < n; ++i) EXPECT_EQ(b[i][0].item<float>(), 100.0f * i + r);
    // sendRecv round the ring, twice in flight at once (fp32 and bf16): each rank passes its
    // values to the previous rank and receives the next rank's.
    const int prev = (r + n - 1) % n, next = (r + 1) % n;
    auto mine = at::arange(6, at::kFloat) + 10.0f * r, theirs = at::empty({2, 3});
    auto mine16 = (at::arange(3, at::kFloat) * -1.37f + r * 1000.0f).to(at::kBFloat16);
    auto theirs16 = at::empty({3}, at::kBFloat16);
    auto w1 = c.sendRecv(mine, prev, theirs, next);
    auto w2 = c.sendRecv(mine16, prev, theirs16, next);
    w2.wait();
    w1.wait();
    EXPECT_TRUE(at::equal(theirs.view({-1}), at::arange(6, at::kFloat) + 10.0f * next));
    EXPECT_TRUE(at::equal(theirs16, (at::arange(3, at::kFloat) * -1.37f + next * 1000.0f).to(at::kBFloat16)));
    // broadcast from the last rank.
    auto bc = at::full({4}, static_cast<float>(r));
    c.broadcast(bc, n - 1).wait();
    EXPECT_TRUE(at::equal(bc, at::full({4}, n - 1.0f)));
    c.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(2, 3, 4));

// Element e of rank r's input: values over ~50 binary orders of magnitude, of both signs, so
// that any change in how the sum is formed would show in the bits.
at::Tensor spread(int64_t n, int r) {
  auto x = at::arange(n, at::kDouble);
  return (at::sin(x * 0.37 + r) * at::exp(at::cos(x * 0.11 + 2.0 * r) * 17.0)).to(at::kFloat);
}

// Bits equal, -0 apart from +0 (at::equal compares values).
bool sameBits(const at::Tensor& a, const at::Tensor& b) { return at::equal(a.view(at::kInt), b.view(at::kInt)); }

// Options::allReducePieces and allReduceExchange: a 2-rank sum split into concurrent pieces, or
// below the split size run as one exchange (each rank adds the other's tensor), gives the bits
// of one Gloo all-reduce, which are a + b element by element, on both ranks; anything else
// (more ranks, Max) is neither split nor exchanged and so unchanged.
TEST(Collectives, SplitAndExchangedAllReducesAreBitIdentical) {
  struct Case {
    int ranks;
    int64_t n;
    int pieces;
    int64_t splitBytes;
    lt::comm::ReduceOp op;
  };
  const std::vector<Case> cases = {
      {2, (int64_t(4) << 20) / 4 + 3, 2, int64_t(4) << 20, lt::comm::ReduceOp::Sum},  // the default: 4 MiB + 12 bytes
      {2, 7, 3, 4, lt::comm::ReduceOp::Sum},          // pieces of 2, 2 and 3 elements
      {2, 100003, 4, 1, lt::comm::ReduceOp::Sum},
      {2, 4096, 2, 4, lt::comm::ReduceOp::Max},       // not split
      {3, 100003, 2, 4, lt::comm::ReduceOp::Sum},     // not split: 3 ranks
      {2, 100003, 2, int64_t(4) << 20, lt::comm::ReduceOp::Sum},  // below 4 MiB: one exchange
      {2, 1, 2, int64_t(4) << 20, lt::comm::ReduceOp::Sum},       // one element (a barrier's)
      {2, 100003, 2, int64_t(4) << 20, lt::comm::ReduceOp::Max},  // not exchanged: Max
      {3, 5, 2, int64_t(4) << 20, lt::comm::ReduceOp::Sum},       // not exchanged: 3 ranks
  };
  for (const auto& k : cases) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::vector<at::Tensor> split(k.ranks), whole(k.ranks);
    std::vector<std::thread> ts;
    for (int r = 0; r < k.ranks; ++r)
      ts.emplace_back([&, r] {
        lt::comm::Options o;
        o.timeout = std::chrono::milliseconds(30000);
        o.allReducePieces = 1;
        o.allReduceExchange = false;
        lt::comm::Comm one(store, r, k.ranks, o, "one");
        o.allReducePieces = k.pieces;
        o.allReduceExchange = true;
        o.allReduceSplitBytes = k.splitBytes;
        lt::comm::Comm pieces(store, r, k.ranks, o, "pieces");
        whole[r] = spread(k.n, r);
        split[r] = spread(k.n, r);
        one.allReduce(whole[r], k.op).wait();
        pieces.allReduce(split[r], k.op).wait();
        one.barrier();
      });
    for (auto& t : ts) t.join();
    const std::string what = std::to_string(k.ranks) + " ranks, " + std::to_string(k.n) + " elements, " +
                             std::to_string(k.pieces) + " pieces";
    for (int r = 0; r < k.ranks; ++r) {
      EXPECT_TRUE(sameBits(split[r], whole[r])) << what << ", rank " << r;
      EXPECT_TRUE(sameBits(split[r], split[0])) << what << ", rank " << r;
    }
    if (k.ranks == 2) {
      auto a = spread(k.n, 0), b = spread(k.n, 1);
      EXPECT_TRUE(sameBits(split[0], k.op == lt::comm::ReduceOp::Sum ? a + b : at::maximum(a, b))) << what;
    }
  }
}

TEST(Groups, SpAndDpLayout) {
  // world 4 = sp 2 x dp 2: sp groups {0,1},{2,3}; dp groups {0,2},{1,3}.
  runRanks(4, 2, [](int r, lt::comm::Groups& g) {
    EXPECT_EQ(g.sp->size(), 2);
    EXPECT_EQ(g.dp->size(), 2);
    EXPECT_EQ(g.sp->rank(), r % 2);
    EXPECT_EQ(g.dp->rank(), r / 2);
    auto t = at::full({1}, static_cast<float>(r));
    g.sp->allReduce(t).wait();
    EXPECT_EQ(t.item<float>(), r < 2 ? 1.0f : 5.0f);
    auto u = at::full({1}, static_cast<float>(r));
    g.dp->allReduce(u).wait();
    EXPECT_EQ(u.item<float>(), r % 2 == 0 ? 2.0f : 4.0f);
  });
}

TEST(Fault, LostPeerIsAnErrorNamingIt) {
  // Rank 2 of 3 "dies": it leaves without joining the collective and its groups are torn
  // down. The others must fail within the timeout, naming rank 2, not hang.
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto timeout = std::chrono::milliseconds(3000);
  std::vector<std::string> errors(3);
  std::vector<double> seconds(3, 0);
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r) {
    ts.emplace_back([&, r] {
      lt::comm::Options o;
      o.timeout = timeout;
      auto g = lt::comm::makeGroups(store, r, 3, 1, o);
      auto t = at::ones({4});
      g.world->allReduce(t).wait();  // everyone alive for the first one
      if (r == 2) return;            // dies: destructors close its sockets and stop its heartbeat
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      auto t0 = std::chrono::steady_clock::now();
      try {
        g.world->allReduce(t).wait();
      } catch (const lt::Error& e) {
        errors[r] = e.what();
      }
      seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("allReduce on group 'world' failed"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("lost rank(s): 2"), std::string::npos) << errors[r];
    EXPECT_LT(seconds[r], timeout.count() / 1000.0 + 3.0);  // timeout plus the heartbeat verdict
  }
}


// A rank that writes to a peer that died gets an error, not SIGPIPE: Gloo writes with writev,
// which raises SIGPIPE on a socket whose peer reset it, and that would end the rank without a
// word. Rank 1 leaves; rank 0 sends 32 MiB more. Whether a write or a read meets the reset first
// is the kernel's timing (here the read, mostly), so the test also checks that SIGPIPE is ignored.
TEST(Fault, AWriteToADeadPeerIsAnErrorNotASignal) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::string error;
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      lt::comm::Options o;
      o.timeout = std::chrono::milliseconds(3000);
      auto g = lt::comm::makeGroups(store, r, 2, 1, o);
      auto t = at::ones({8 << 20});
      g.world->allReduce(t).wait();
      if (r == 1) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      for (int i = 0; i < 4 && error.empty(); ++i) {
        try {
          g.world->allReduce(t).wait();
        } catch (const lt::Error& e) {
          error = e.what();
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_NE(error.find("lost rank(s): 1"), std::string::npos) << error;
  struct sigaction now {};
  ::sigaction(SIGPIPE, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);  // so the next write to a dead peer is an error too
}
}  // namespace

// Gloo's binding (torchrun's rules): GLOO_SOCKET_IFNAME wins, else the route to MASTER_ADDR.
TEST(GlooBinding, InterfaceListRouteAndLoopback) {
  auto b = lt::comm::glooBindingFor("10.77.0.1", "lo,eth7");
  EXPECT_EQ(b.interfaces, (std::vector<std::string>{"lo", "eth7"}));
  EXPECT_EQ(lt::comm::glooBindingFor("", "").hostname, "127.0.0.1");
  EXPECT_EQ(lt::comm::glooBindingFor("localhost", "").hostname, "127.0.0.1");
  // 127.0.0.2 is routed over lo from 127.0.0.1: the route's source, not the target itself.
  EXPECT_EQ(lt::comm::localAddressToward("127.0.0.2"), "127.0.0.1");
  EXPECT_NE(lt::testing::errorOf([] { lt::comm::glooBindingFor("no-such-host.invalid", ""); }).find(
                "MASTER_ADDR 'no-such-host.invalid' does not resolve"),
            std::string::npos);
  EXPECT_NE(lt::testing::errorOf([] { lt::comm::glooBindingFor("x", ",,"); }).find("names no interface"),
            std::string::npos);
  // A group bound by interface name works like one bound by address.
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> ts;
  std::vector<double> sums(2);
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      lt::comm::Options o;
      o.interfaces = {"lo"};
      lt::comm::Comm c(store, r, 2, o, "bind");
      auto t = at::full({4}, double(r + 1), at::kDouble);
      c.allReduce(t).wait();
      sums[r] = t[0].item<double>();
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(sums[0], 3.0);
  EXPECT_EQ(sums[1], 3.0);
}
