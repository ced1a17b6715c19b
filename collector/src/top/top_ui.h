// `lockstep top`: the live terminal view (docs/top.md). RunTop() owns the terminal
// (ncurses) and a FeedClient; RunTopOnce() prints one plain-text snapshot.
//
// Threads: one thread does everything (ncurses is not thread-safe): it polls the feed
// socket for up to 100 ms, then reads keys without waiting, then redraws when
// something changed. KEY_RESIZE (ncurses' own SIGWINCH handling) triggers a redraw at
// the new size.
#ifndef LOCKSTEP_COLLECTOR_TOP_TOP_UI_H_
#define LOCKSTEP_COLLECTOR_TOP_TOP_UI_H_

#include <cstdint>
#include <string>

namespace lockstep::collector::view {

struct TopOptions {
  std::string connect = "tcp://127.0.0.1:6201";
  int64_t unreachable_after_ms = 3000;  // no snapshot this long: say so on screen
  int64_t once_timeout_ms = 5000;       // --once: how long to wait for a snapshot
  bool monochrome = false;              // --no-color, or a terminal without colours
  int once_width = 100;                 // --once: line width in columns (60..1000)
};

// Interactive view until `q`. Returns a process exit code (0, or 1 with one sentence
// on stderr when the terminal or the endpoint cannot be used).
int RunTop(const TopOptions& opt);
// Prints one snapshot as text on stdout. 0, or 1 when no snapshot arrived in time.
int RunTopOnce(const TopOptions& opt);

}  // namespace lockstep::collector::view

#endif  // LOCKSTEP_COLLECTOR_TOP_TOP_UI_H_
