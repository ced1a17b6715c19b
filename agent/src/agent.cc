// Agent::Create / CreateWithTransport: option checks, then the engine.
#include "lockstep/agent/agent.h"

#include "engine/agent_impl.h"
#include "engine/queue_item.h"
#include "lockstep/schema/lockstep_generated.h"
#include "transport/zmq_transport.h"

namespace lockstep {
namespace {

Status Validate(const AgentOptions& o) {
  if (!IsValidRunId(o.run)) {
    return Status::InvalidArgument("the run id '" + o.run +
                                   "' is not valid; use 1-128 of [A-Za-z0-9._-], not starting with '.'");
  }
  if (o.experiment.size() > kMaxRunIdLength) {
    return Status::InvalidArgument("the experiment name is longer than 128 characters; shorten it");
  }
  if (o.queue_capacity < 1 || o.queue_capacity > engine::kMaxQueueCapacity) {
    return Status::InvalidArgument("queue_capacity must be between 1 and " +
                                   std::to_string(engine::kMaxQueueCapacity) + " records");
  }
  if (o.send_hwm < 0) return Status::InvalidArgument("send_hwm must be >= 0 (0 = unlimited)");
  if (o.sketch_k < 0 || o.sketch_k > kMaxSketchK) {
    return Status::InvalidArgument("sketch_k must be between 0 (off) and " + std::to_string(kMaxSketchK));
  }
  if (o.hist_bins != 0 && o.hist_bins != kHistBins) {
    return Status::InvalidArgument("hist_bins must be 0 (off) or " + std::to_string(kHistBins));
  }
  if (o.max_records_per_message < 1 || o.max_records_per_message > kMaxRecordsPerMessage) {
    return Status::InvalidArgument("max_records_per_message must be between 1 and " +
                                   std::to_string(kMaxRecordsPerMessage));
  }
  if (o.send_buffer_bytes != 0) {
    const size_t per_record = sizeof(wire::TensorStat) + static_cast<size_t>(o.sketch_k) * sizeof(float) +
                              static_cast<size_t>(o.hist_bins) * sizeof(uint32_t);
    const size_t need = 2 * (o.max_records_per_message * per_record + 4096);
    if (o.send_buffer_bytes < need) {
      return Status::InvalidArgument(
          "the send buffer (send_buffer_bytes " + std::to_string(o.send_buffer_bytes) +
          ") is smaller than two of the largest messages; give at least " +
          std::to_string((need + (1 << 20) - 1) >> 20) +
          " MiB (Python: send_buffer_mb / LOCKSTEP_SEND_BUFFER_MB), or 0 for no byte bound");
    }
  }
  if (o.heartbeat_interval.count() <= 0) {
    return Status::InvalidArgument("heartbeat_interval must be positive");
  }
  if (o.batch_linger.count() < 0) return Status::InvalidArgument("batch_linger must be >= 0");
  if (o.world_size < 1 || o.rank >= o.world_size) {
    return Status::InvalidArgument("rank " + std::to_string(o.rank) + " is not below world_size " +
                                   std::to_string(o.world_size) + "; give 0 <= rank < world_size");
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<Agent>> Agent::CreateWithTransport(const AgentOptions& options,
                                                            std::unique_ptr<Transport> t) {
  try {
    LOCKSTEP_RETURN_IF_ERROR(Validate(options));
    if (t == nullptr) return Status::InvalidArgument("no transport given to the agent");
    return std::unique_ptr<Agent>(new engine::AgentImpl(options, std::move(t)));
  } catch (const std::exception& e) {
    return Status::Internal(std::string("could not start the lockstep agent: ") + e.what());
  } catch (...) {
    return Status::Internal("could not start the lockstep agent");
  }
}

StatusOr<std::unique_ptr<Agent>> Agent::Create(const AgentOptions& options) {
  try {
    LOCKSTEP_RETURN_IF_ERROR(Validate(options));
    ZmqTransportOptions z;
    z.endpoint = options.endpoint;
    z.send_hwm = options.send_hwm;
    z.curve_server_key = options.curve_server_key;
    z.curve_public_key = options.curve_public_key;
    z.curve_secret_key = options.curve_secret_key;
    z.control_endpoint = options.control_endpoint;
    auto t = ZmqTransport::Create(z);
    if (!t.ok()) return t.status();
    return CreateWithTransport(options, std::move(t).value());
  } catch (...) {
    return Status::Internal("could not start the lockstep agent");
  }
}

}  // namespace lockstep
