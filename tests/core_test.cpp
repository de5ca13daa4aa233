// core/: Fifo (wrap-around, growth, move-only types), Channel (blocking, try, close), checks.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "longtrain/core/channel.h"
#include "longtrain/core/check.h"
#include "longtrain/core/fifo.h"

namespace {

TEST(Fifo, OrderAcrossWrapAroundAndGrowth) {
  lt::Fifo<int> q;
  int pushed = 0, popped = 0;
  // Interleave pushes and pops so head wraps many times while the buffer also grows.
  for (int round = 0; round < 200; ++round) {
    for (int i = 0; i < round % 13 + 1; ++i) q.push(pushed++);
    for (int i = 0; i < round % 7 && !q.empty(); ++i) EXPECT_EQ(q.pop(), popped++);
  }
  while (!q.empty()) EXPECT_EQ(q.pop(), popped++);
  EXPECT_EQ(pushed, popped);
}

TEST(Fifo, NoAllocationInSteadyState) {
  lt::Fifo<int> q;
  for (int i = 0; i < 100; ++i) q.push(i);
  size_t cap = q.capacity();
  for (int i = 0; i < 100000; ++i) {
    q.push(i);
    q.pop();
  }
  EXPECT_EQ(q.capacity(), cap);
  EXPECT_EQ(q.size(), 100u);
}

TEST(Fifo, MoveOnlyAndIndexing) {
  lt::Fifo<std::unique_ptr<int>> q;
  for (int i = 0; i < 20; ++i) q.push(std::make_unique<int>(i));
  EXPECT_EQ(*q[0], 0);
  EXPECT_EQ(*q[19], 19);
  EXPECT_EQ(*q.back(), 19);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(*q.pop(), i);
  EXPECT_THROW(q.pop(), lt::Error);
  lt::Fifo<std::unique_ptr<int>> r(std::move(q));
  r.push(std::make_unique<int>(7));
  EXPECT_EQ(*r.front(), 7);
}

TEST(Fifo, DestroysElements) {
  auto token = std::make_shared<int>(1);
  {
    lt::Fifo<std::shared_ptr<int>> q;
    for (int i = 0; i < 50; ++i) q.push(token);
    for (int i = 0; i < 10; ++i) q.pop();
    EXPECT_EQ(token.use_count(), 41);
  }
  EXPECT_EQ(token.use_count(), 1);
}

TEST(Channel, BlockingProducerConsumer) {
  lt::Channel<std::unique_ptr<int>> ch(4);  // bounded: the producer blocks when 4 are queued
  std::thread prod([&] {
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(ch.push(std::make_unique<int>(i)));
    ch.close();
  });
  int expect = 0;
  while (auto v = ch.pop()) EXPECT_EQ(**v, expect++);
  prod.join();
  EXPECT_EQ(expect, 1000);
}

TEST(Channel, TryAndClose) {
  lt::Channel<int> ch(2);
  EXPECT_FALSE(ch.tryPop().has_value());
  EXPECT_TRUE(ch.tryPush(1));
  EXPECT_TRUE(ch.tryPush(2));
  EXPECT_FALSE(ch.tryPush(3));  // full
  EXPECT_FALSE(ch.popFor(std::chrono::milliseconds(1)) == std::nullopt);
  ch.close();
  EXPECT_FALSE(ch.push(4));           // closed: push refused
  EXPECT_EQ(ch.pop().value(), 2);     // ... but what was queued drains
  EXPECT_FALSE(ch.pop().has_value());  // then end of stream
}

TEST(Channel, CloseWakesBlockedConsumer) {
  lt::Channel<int> ch;
  std::thread t([&] { EXPECT_FALSE(ch.pop().has_value()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ch.close();
  t.join();
}

TEST(Check, MessagesName) {
  try {
    int x = 3;
    LT_CHECK(x == 4, "key 'a.b' = ", x, ", expected 4");
    FAIL();
  } catch (const lt::Error& e) {
    EXPECT_STREQ(e.what(), "key 'a.b' = 3, expected 4");
  }
  EXPECT_THROW(LT_ASSERT(1 == 2), lt::Error);
}

}  // namespace
