#include "top/top_client.h"

#include <chrono>

#include <zmq.hpp>

namespace lockstep::collector::view {

struct FeedClient::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
};

StatusOr<std::unique_ptr<FeedClient>> FeedClient::Create(const std::string& endpoint) {
  auto s = std::make_unique<Sockets>();
  try {
    s->sub.set(zmq::sockopt::conflate, 1);
    s->sub.set(zmq::sockopt::linger, 0);
    // Cap reconnect back-off so a restarted collector is found within a second.
    s->sub.set(zmq::sockopt::reconnect_ivl, 100);
    s->sub.set(zmq::sockopt::reconnect_ivl_max, 1000);
    s->sub.set(zmq::sockopt::subscribe, "");
    s->sub.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return Status::InvalidArgument("cannot connect to '" + endpoint + "': " + e.what() +
                                   " (--connect expects the collector's --view-listen endpoint, e.g. "
                                   "tcp://127.0.0.1:6201)");
  }
  return std::unique_ptr<FeedClient>(new FeedClient(std::move(s), endpoint));
}

FeedClient::FeedClient(std::unique_ptr<Sockets> s, std::string endpoint)
    : s_(std::move(s)), endpoint_(std::move(endpoint)) {}

FeedClient::~FeedClient() = default;

bool FeedClient::Receive(int timeout_ms, std::string* out) {
  try {
    zmq::pollitem_t item{s_->sub.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) return false;
    zmq::message_t msg;
    if (!s_->sub.recv(msg, zmq::recv_flags::dontwait)) return false;
    out->assign(static_cast<const char*>(msg.data()), msg.size());
    return true;
  } catch (const zmq::error_t&) {
    return false;  // EINTR (a resize signal) and the like: the caller polls again
  }
}

}  // namespace lockstep::collector::view
