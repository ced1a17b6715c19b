// FeedClient: the viewer's end of the view feed. A ZeroMQ SUB socket connected to
// the collector's --view-listen endpoint, with ZMQ_CONFLATE so only the newest
// snapshot waits in it: a viewer that was busy (or suspended) reads the current
// state, never a backlog. ZeroMQ reconnects by itself when the collector comes back.
//
// Threads: single-threaded; the owner thread only (it owns the socket).
#ifndef LOCKSTEP_COLLECTOR_TOP_TOP_CLIENT_H_
#define LOCKSTEP_COLLECTOR_TOP_TOP_CLIENT_H_

#include <memory>
#include <string>

#include "lockstep/common/status.h"

namespace lockstep::collector::view {

class FeedClient {
 public:
  // InvalidArgument (naming --connect) for a malformed endpoint. Connecting to an
  // endpoint where nothing listens yet is not an error.
  static StatusOr<std::unique_ptr<FeedClient>> Create(const std::string& endpoint);
  ~FeedClient();
  FeedClient(const FeedClient&) = delete;
  FeedClient& operator=(const FeedClient&) = delete;

  // Waits up to timeout_ms for a snapshot; true with the newest one in *out.
  bool Receive(int timeout_ms, std::string* out);
  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Sockets;
  FeedClient(std::unique_ptr<Sockets> s, std::string endpoint);
  std::unique_ptr<Sockets> s_;
  std::string endpoint_;
};

}  // namespace lockstep::collector::view

#endif  // LOCKSTEP_COLLECTOR_TOP_TOP_CLIENT_H_
