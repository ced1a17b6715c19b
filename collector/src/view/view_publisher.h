// ViewPublisher: the collector's view feed. One thread owns a ZeroMQ XPUB socket and
// publishes a full snapshot (one frame of JSON, docs/top.md "Feed format") every
// interval and at once when a viewer subscribes (XPUB_VERBOSE shows every
// subscription, so a second viewer does not wait for the next tick either).
//
// A slow or dead viewer never slows the collector: the socket's send high-water mark
// is small and sends are dontwait (PUB drops for a subscriber whose queue is full),
// and the snapshot is built on this thread, not on the ingest or analyzer threads.
//
//   auto p = ViewPublisher::Create(options, [&] { return model.SnapshotJson(...); });
//   (*p)->Start();  ...  (*p)->Shutdown();   // or the destructor
//
// Threads: Create/Start/Shutdown from one controlling thread (the socket is bound on
// it and handed to the publisher thread at Start); endpoint()/counters() from any
// thread. The SnapshotFn runs on the publisher thread; an exception from it is caught
// and counted, and the feed goes on.
#ifndef LOCKSTEP_COLLECTOR_VIEW_VIEW_PUBLISHER_H_
#define LOCKSTEP_COLLECTOR_VIEW_VIEW_PUBLISHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "lockstep/common/status.h"

namespace lockstep::collector {

struct ViewPublisherOptions {
  std::string endpoint = "tcp://127.0.0.1:6201";  // "tcp://127.0.0.1:*" picks a free port
  int64_t interval_ms = 500;
  int send_hwm = 4;  // snapshots queued per viewer; an older one is useless anyway
};

struct ViewPublisherCounters {
  uint64_t published = 0;      // snapshots handed to the socket
  uint64_t subscriptions = 0;  // viewer subscriptions seen
  uint64_t errors = 0;         // snapshot builds that threw, sends that failed
  uint64_t last_bytes = 0;     // size of the latest snapshot
};

class ViewPublisher {
 public:
  using SnapshotFn = std::function<std::string()>;

  // InvalidArgument for a malformed endpoint, Unavailable when it is in use; one
  // sentence naming the endpoint and the flag (--view-listen).
  static StatusOr<std::unique_ptr<ViewPublisher>> Create(ViewPublisherOptions options, SnapshotFn fn);
  ~ViewPublisher();  // Shutdown
  ViewPublisher(const ViewPublisher&) = delete;
  ViewPublisher& operator=(const ViewPublisher&) = delete;

  void Start();
  void Shutdown();  // idempotent; returns within ~100 ms
  const std::string& endpoint() const { return endpoint_; }  // ephemeral port resolved
  ViewPublisherCounters counters() const;

 private:
  struct Sockets;
  ViewPublisher(ViewPublisherOptions options, SnapshotFn fn, std::unique_ptr<Sockets> s, std::string endpoint);
  void Loop();

  ViewPublisherOptions opt_;
  SnapshotFn fn_;
  std::unique_ptr<Sockets> sockets_;
  std::string endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> published_{0}, subscriptions_{0}, errors_{0}, last_bytes_{0};
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_VIEW_VIEW_PUBLISHER_H_
