// Fifo<T>: a growable ring-buffer queue. push/pop are amortized O(1); in steady state (the
// queue no longer growing) no operation allocates. Capacity is a power of two so the index
// wrap is a mask. Move-only element types are allowed; elements are constructed in place.
#pragma once
#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include "longtrain/core/check.h"

namespace lt {

template <class T>
class Fifo {
 public:
  Fifo() = default;
  explicit Fifo(size_t capacity) { reserve(capacity); }
  Fifo(const Fifo&) = delete;
  Fifo& operator=(const Fifo&) = delete;
  Fifo(Fifo&& o) noexcept { swap(o); }
  Fifo& operator=(Fifo&& o) noexcept {
    if (this != &o) {
      Fifo tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  ~Fifo() {
    clear();
    release(buf_, cap_);
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return cap_; }

  template <class... Args>
  T& emplace(Args&&... args) {
    if (size_ == cap_) grow(cap_ ? cap_ * 2 : kMinCapacity);
    T* slot = buf_ + ((head_ + size_) & (cap_ - 1));
    ::new (static_cast<void*>(slot)) T(std::forward<Args>(args)...);
    ++size_;
    return *slot;
  }
  void push(T&& v) { emplace(std::move(v)); }
  void push(const T& v) { emplace(v); }

  // Removes and returns the oldest element. Precondition: !empty().
  T pop() {
    LT_ASSERT(size_ > 0, "pop from an empty Fifo");
    T* slot = buf_ + head_;
    T v(std::move(*slot));
    slot->~T();
    head_ = (head_ + 1) & (cap_ - 1);
    --size_;
    return v;
  }

  T& front() {
    LT_ASSERT(size_ > 0);
    return buf_[head_];
  }
  T& back() {
    LT_ASSERT(size_ > 0);
    return buf_[(head_ + size_ - 1) & (cap_ - 1)];
  }
  // i-th oldest element (0 = front).
  T& operator[](size_t i) {
    LT_ASSERT(i < size_);
    return buf_[(head_ + i) & (cap_ - 1)];
  }
  const T& operator[](size_t i) const {
    LT_ASSERT(i < size_);
    return buf_[(head_ + i) & (cap_ - 1)];
  }

  void clear() {
    while (size_ > 0) {
      buf_[head_].~T();
      head_ = (head_ + 1) & (cap_ - 1);
      --size_;
    }
    head_ = 0;
  }

  // Ensures room for n elements without further allocation.
  void reserve(size_t n) {
    if (n <= cap_) return;
    size_t c = kMinCapacity;
    while (c < n) c *= 2;
    grow(c);
  }

 private:
  static constexpr size_t kMinCapacity = 8;

  static T* allocate(size_t n) { return std::allocator<T>().allocate(n); }
  static void release(T* p, size_t n) {
    if (p) std::allocator<T>().deallocate(p, n);
  }

  void grow(size_t newCap) {
    T* nb = allocate(newCap);
    for (size_t i = 0; i < size_; ++i) {
      T* src = buf_ + ((head_ + i) & (cap_ - 1));
      ::new (static_cast<void*>(nb + i)) T(std::move(*src));
      src->~T();
    }
    release(buf_, cap_);
    buf_ = nb;
    cap_ = newCap;
    head_ = 0;
  }

  void swap(Fifo& o) noexcept {
    std::swap(buf_, o.buf_);
    std::swap(cap_, o.cap_);
    std::swap(head_, o.head_);
    std::swap(size_, o.size_);
  }

  T* buf_ = nullptr;
  size_t cap_ = 0;   // 0 or a power of two
  size_t head_ = 0;  // index of the oldest element
  size_t size_ = 0;
};

}  // namespace lt
