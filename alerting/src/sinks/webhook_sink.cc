// The generic webhook: the generic JSON (AlertToJson, every field) POSTed as it is, with
// "Authorization: Bearer <token>" when a token is set (docs/alerting.md "Sinks and
// message formats"). Any 2xx is delivered.
#include "sink_type.h"

namespace lockstep::alerting {

extern const SinkType kWebhookSink{
    .name = "webhook",
    .aliases = {"generic", "json"},
    .listed_as = "generic",
    .http = true,
    .bearer_token = true};  // format: the generic JSON

}  // namespace lockstep::alerting
