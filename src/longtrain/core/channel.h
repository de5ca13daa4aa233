// Channel<T>: a single-producer/single-consumer queue between two threads, over a Fifo.
// Blocking and try variants of push and pop; close() wakes both sides: after close, push
// fails (returns false) and pop drains what is left, then returns nullopt. A capacity of 0
// means unbounded. A mutex is enough here: the channel carries whole optimizer sub-groups
// (milliseconds of work each), not individual elements.
#pragma once
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "longtrain/core/fifo.h"

namespace lt {

template <class T>
class Channel {
 public:
  explicit Channel(size_t capacity = 0) : capacity_(capacity) {
    if (capacity) q_.reserve(capacity);
  }

  // Blocks while full. Returns false (and drops nothing: v is untouched) if closed.
  bool push(T&& v) {
    std::unique_lock<std::mutex> lk(mu_);
    notFull_.wait(lk, [&] { return closed_ || !full(); });
    if (closed_) return false;
    q_.push(std::move(v));
    notEmpty_.notify_one();
    return true;
  }
  bool tryPush(T&& v) {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_ || full()) return false;
    q_.push(std::move(v));
    notEmpty_.notify_one();
    return true;
  }
  // Blocks until an element arrives or the channel is closed and drained.
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lk(mu_);
    notEmpty_.wait(lk, [&] { return closed_ || !q_.empty(); });
    return takeLocked();
  }
  // Like pop, but gives up after `timeout` (returns nullopt; check closed() to tell apart).
  template <class Rep, class Period>
  std::optional<T> popFor(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    notEmpty_.wait_for(lk, timeout, [&] { return closed_ || !q_.empty(); });
    return takeLocked();
  }
  std::optional<T> tryPop() {
    std::lock_guard<std::mutex> lk(mu_);
    return takeLocked();
  }
  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    notEmpty_.notify_all();
    notFull_.notify_all();
  }
  bool closed() const {
    std::lock_guard<std::mutex> lk(mu_);
    return closed_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return q_.size();
  }

 private:
  bool full() const { return capacity_ && q_.size() >= capacity_; }
  std::optional<T> takeLocked() {
    if (q_.empty()) return std::nullopt;
    std::optional<T> v(q_.pop());
    notFull_.notify_one();
    return v;
  }

  mutable std::mutex mu_;
  std::condition_variable notEmpty_, notFull_;
  Fifo<T> q_;
  size_t capacity_;
  bool closed_ = false;
};

}  // namespace lt
