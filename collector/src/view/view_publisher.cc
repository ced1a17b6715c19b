#include "view/view_publisher.h"

#include <cerrno>
#include <chrono>
#include <exception>

#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "lockstep/common/thread_name.h"

namespace lockstep::collector {

struct ViewPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::xpub};
};

StatusOr<std::unique_ptr<ViewPublisher>> ViewPublisher::Create(ViewPublisherOptions options, SnapshotFn fn) {
  auto s = std::make_unique<Sockets>();
  std::string bound;
  try {
    s->pub.set(zmq::sockopt::sndhwm, options.send_hwm);
    s->pub.set(zmq::sockopt::linger, 0);
    s->pub.set(zmq::sockopt::xpub_verbose, 1);
    s->pub.bind(options.endpoint);
    bound = s->pub.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    if (e.num() == EADDRINUSE) {
      return Status::Unavailable("cannot serve the view feed on '" + options.endpoint +
                                 "': the address is in use (another collector?); pick another with --view-listen");
    }
    return Status::InvalidArgument("cannot serve the view feed on '" + options.endpoint + "': " + e.what() +
                                   " (--view-listen expects e.g. tcp://127.0.0.1:6201)");
  }
  return std::unique_ptr<ViewPublisher>(new ViewPublisher(std::move(options), std::move(fn), std::move(s), bound));
}

ViewPublisher::ViewPublisher(ViewPublisherOptions options, SnapshotFn fn, std::unique_ptr<Sockets> s,
                             std::string endpoint)
    : opt_(std::move(options)), fn_(std::move(fn)), sockets_(std::move(s)), endpoint_(std::move(endpoint)) {}

ViewPublisher::~ViewPublisher() { Shutdown(); }

void ViewPublisher::Start() {
  if (thread_.joinable() || stop_.load()) return;
  thread_ = std::thread([this] {
    SetCurrentThreadName("ls-view");
    Loop();
  });
}

void ViewPublisher::Shutdown() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (sockets_) {
    try {
      sockets_->pub.close();
    } catch (const zmq::error_t&) {
    }
  }
}

ViewPublisherCounters ViewPublisher::counters() const {
  ViewPublisherCounters c;
  c.published = published_.load(std::memory_order_relaxed);
  c.subscriptions = subscriptions_.load(std::memory_order_relaxed);
  c.errors = errors_.load(std::memory_order_relaxed);
  c.last_bytes = last_bytes_.load(std::memory_order_relaxed);
  return c;
}

void ViewPublisher::Loop() {
  using Clock = std::chrono::steady_clock;
  // Polling at most 100 ms at a time bounds how long Shutdown waits for the flag.
  constexpr auto kMaxWait = std::chrono::milliseconds(100);
  const auto interval = std::chrono::milliseconds(opt_.interval_ms > 0 ? opt_.interval_ms : 500);
  auto next = Clock::now();
  zmq::socket_t& pub = sockets_->pub;
  while (!stop_.load()) {
    try {
      auto now = Clock::now();
      if (now >= next) {
        std::string snap;
        try {
          snap = fn_();
        } catch (const std::exception& e) {
          if (errors_.fetch_add(1, std::memory_order_relaxed) == 0) spdlog::error("view feed: {}", e.what());
        }
        if (!snap.empty()) {
          // PUB never blocks on a full subscriber queue (it drops for that one);
          // dontwait also covers the socket being busy at all.
          auto sent = pub.send(zmq::buffer(snap), zmq::send_flags::dontwait);
          if (sent) {
            published_.fetch_add(1, std::memory_order_relaxed);
            last_bytes_.store(snap.size(), std::memory_order_relaxed);
          }
        }
        next = now + interval;
        continue;
      }
      auto wait = std::min<Clock::duration>(next - now, kMaxWait);
      zmq::pollitem_t item{pub.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(wait) + std::chrono::milliseconds(1));
      if (item.revents & ZMQ_POLLIN) {
        zmq::message_t msg;
        while (pub.recv(msg, zmq::recv_flags::dontwait)) {
          // A subscription is 0x01 + topic; an unsubscription 0x00 + topic.
          if (msg.size() >= 1 && static_cast<const uint8_t*>(msg.data())[0] == 1) {
            subscriptions_.fetch_add(1, std::memory_order_relaxed);
            next = Clock::now();  // a new viewer gets a snapshot at once
          }
        }
      }
    } catch (const zmq::error_t& e) {
      if (errors_.fetch_add(1, std::memory_order_relaxed) == 0) spdlog::error("view feed: {}", e.what());
      next = Clock::now() + interval;
    }
  }
}

}  // namespace lockstep::collector
