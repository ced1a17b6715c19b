// BufferPool: reused, already-faulted message buffers for zero-copy sends.
//
// Why: a StepStats message is ~300 KiB. Copying it into a fresh ZeroMQ message costs a
// memcpy plus, because glibc hands such sizes back to the kernel on free, a page fault
// per 4 KiB on every message. Instead the sender builds each large message in a pooled
// block (PooledAllocator under the FlatBufferBuilder) and hands the block itself to
// ZeroMQ (zmq_msg_init_data); ZeroMQ's I/O thread returns it through ReleaseCallback
// once the bytes are on the socket.
//
// Threads: Acquire() is called by the sender thread (through the builder); Release()
// and ReleaseCallback() by any thread (ZeroMQ's I/O thread, or the sender when a send
// is refused). The pool must outlive every block it handed out: the sender destroys it
// after its transport (whose Close() frees all messages still queued).
// Memory: the sender asks WaitForRoom() before building a large message, so the blocks
// out at any time (messages ZeroMQ has not written yet, e.g. while no collector is
// listening) stay under a byte budget instead of HWM x message size.
// Allocation: Acquire() allocates only when no cached block is large enough (warm-up,
// bursts deeper than the cache); Release() never allocates (free_ is reserved).
#ifndef LOCKSTEP_AGENT_TRANSPORT_BUFFER_POOL_H_
#define LOCKSTEP_AGENT_TRANSPORT_BUFFER_POOL_H_

#include <flatbuffers/allocator.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

#include "lockstep/common/thread_annotations.h"
#include "transport/handoff_annotations.h"

namespace lockstep {

class BufferPool {
 public:
  // Keeps at most `max_cached` returned blocks; more are freed on return.
  // `max_outstanding_bytes` is what WaitForRoom() keeps the blocks handed out (and not
  // yet returned) under; Acquire() itself never refuses.
  explicit BufferPool(size_t max_cached, size_t max_outstanding_bytes = SIZE_MAX)
      : max_cached_(max_cached), max_outstanding_(max_outstanding_bytes) {
    free_.reserve(max_cached);
  }
  ~BufferPool() {
    for (Header* h : free_) Free(h);
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A block of at least `size` bytes (16-byte aligned). Throws std::bad_alloc like new.
  uint8_t* Acquire(size_t size) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i]->capacity >= size) {
          Header* h = free_[i];
          free_[i] = free_.back();
          free_.pop_back();
          outstanding_ += h->capacity;
          return Payload(h);
        }
      }
    }
    void* raw = ::operator new(kHeaderBytes + size, std::align_val_t(kAlign));
    Header* h = new (raw) Header{this, size};
    MutexLock lock(&mu_);
    outstanding_ += size;
    return Payload(h);
  }

  // Takes back a block from Acquire(). noexcept: called from ZeroMQ's I/O thread.
  void Release(uint8_t* payload) noexcept EXCLUDES(mu_) {
    Header* h = HeaderOf(payload);
    bool cached = false;
    {
      MutexLock lock(&mu_);
      outstanding_ -= h->capacity;
      if (free_.size() < max_cached_) {
        free_.push_back(h);  // within the reserved capacity: no allocation
        cached = true;
      }
      if (waiting_) room_.notify_one();
    }
    if (!cached) Free(h);
  }

  // Waits until `bytes` more fit under max_outstanding_bytes beside the blocks handed
  // out and not yet returned (true), or until `deadline` (false).
  bool WaitForRoom(size_t bytes, std::chrono::steady_clock::time_point deadline) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto fits = [&] {
      mu_.AssertHeld();  // called with `lock` held, here and by the wait
      return outstanding_ + bytes <= max_outstanding_ || outstanding_ == 0;
    };
    if (fits()) return true;
    ++waiting_;
    bool ok = room_.wait_until(lock.native(), deadline, fits);
    --waiting_;
    return ok;
  }

  // A zmq_free_fn: `hint` is the block (payload pointer) the message's data lies in.
  static void ReleaseCallback(void* /*data*/, void* hint) noexcept {
    TakeBackFromZmq(hint);
    auto* payload = static_cast<uint8_t*>(hint);
    HeaderOf(payload)->pool->Release(payload);
  }

  size_t cached() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return free_.size();
  }
  // Bytes of the blocks handed out and not yet returned.
  size_t outstanding_bytes() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return outstanding_;
  }

 private:
  struct Header {
    BufferPool* pool;
    size_t capacity;
  };
  static constexpr size_t kAlign = 64;
  static constexpr size_t kHeaderBytes = 64;  // keeps the payload kAlign-aligned
  static_assert(sizeof(Header) <= kHeaderBytes);

  static uint8_t* Payload(Header* h) { return reinterpret_cast<uint8_t*>(h) + kHeaderBytes; }
  static Header* HeaderOf(uint8_t* payload) {
    return reinterpret_cast<Header*>(payload - kHeaderBytes);
  }
  static void Free(Header* h) noexcept { ::operator delete(h, std::align_val_t(kAlign)); }

  const size_t max_cached_;
  const size_t max_outstanding_;
  Mutex mu_;
  std::condition_variable room_;
  std::vector<Header*> free_ GUARDED_BY(mu_);
  size_t outstanding_ GUARDED_BY(mu_) = 0;
  int waiting_ GUARDED_BY(mu_) = 0;
};

// FlatBufferBuilder allocator over a BufferPool, so the builder's block can be handed
// to the transport (FlatBufferBuilder::ReleaseRaw) and comes back for a later message.
class PooledAllocator final : public flatbuffers::Allocator {
 public:
  explicit PooledAllocator(BufferPool* pool) : pool_(pool) {}
  uint8_t* allocate(size_t size) override { return pool_->Acquire(size); }
  void deallocate(uint8_t* p, size_t /*size*/) override { pool_->Release(p); }

 private:
  BufferPool* pool_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_TRANSPORT_BUFFER_POOL_H_
