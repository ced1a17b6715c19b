// Tells ThreadSanitizer about the one hand-over it cannot see: a zero-copy message
// given to ZeroMQ (zmq_msg_init_data) comes back to its zmq_free_fn on ZeroMQ's I/O
// thread, ordered after the send by libzmq's own lock-free pipes — which are not
// instrumented (Debian's libzmq), so TSan reported the callback's read of the block
// header (written by the sender thread) as a race. The sender marks the hint released
// before zmq_msg_send; the free callback acquires it. No-ops outside -fsanitize=thread.
#ifndef LOCKSTEP_AGENT_TRANSPORT_HANDOFF_ANNOTATIONS_H_
#define LOCKSTEP_AGENT_TRANSPORT_HANDOFF_ANNOTATIONS_H_

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace lockstep {

// On the sending thread, before the message (and `hint`) goes to ZeroMQ.
inline void HandOffToZmq(void* hint) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(hint);
#else
  (void)hint;
#endif
}

// First thing in a zmq_free_fn, on whichever thread ZeroMQ calls it.
inline void TakeBackFromZmq(void* hint) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(hint);
#else
  (void)hint;
#endif
}

}  // namespace lockstep

#endif  // LOCKSTEP_AGENT_TRANSPORT_HANDOFF_ANNOTATIONS_H_
