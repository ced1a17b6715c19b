#include "top/top_ui.h"

#include <langinfo.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "top/top_client.h"
#include "top/top_text.h"
#include "view/snapshot.h"

// Last: curses.h defines macros (OK, ERR, ...) that clash with ordinary names.
#define NCURSES_WIDECHAR 1
#include <ncursesw/curses.h>

namespace lockstep::collector::view {
namespace {

using Clock = std::chrono::steady_clock;

enum class Mode { kMain, kHistory, kHelp };
enum class SortKey { kDrift, kRelL2, kCosine, kFirst, kOrder, kName, kCount };
const char* SortName(SortKey k) {
  static const char* kNames[] = {"drift", "rel_l2", "cosine", "first drift", "exec order", "name"};
  return kNames[static_cast<int>(k)];
}

enum Colour : short { kOk = 1, kWarn = 2, kBad = 3, kHead = 4, kDim = 5 };

bool UnicodeLocale() {
  const char* cs = nl_langinfo(CODESET);
  return cs && (std::strcmp(cs, "UTF-8") == 0 || std::strcmp(cs, "utf8") == 0);
}

class Screen {
 public:
  Screen(const TopOptions& opt, FeedClient* feed) : opt_(opt), feed_(feed), unicode_(UnicodeLocale()) {}

  int Run() {
    initscr();
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    set_escdelay(25);
    timeout(0);
    colour_ = !opt_.monochrome && has_colors();
    if (colour_) {
      start_color();
      use_default_colors();
      init_pair(kOk, COLOR_GREEN, -1);
      init_pair(kWarn, COLOR_YELLOW, -1);
      init_pair(kBad, COLOR_RED, -1);
      init_pair(kHead, COLOR_CYAN, -1);
      init_pair(kDim, COLOR_BLUE, -1);
    }
    started_ = Clock::now();
    bool dirty = true;
    auto last_second = Clock::now();
    while (true) {
      std::string msg;
      if (feed_->Receive(100, &msg)) {
        auto snap = ParseSnapshot(msg);
        if (snap.ok()) {
          snap_ = std::move(*snap);
          have_ = true;
          last_rx_ = Clock::now();
          feed_error_.clear();
        } else {
          feed_error_ = snap.status().message();
        }
        dirty = true;
      }
      for (int ch = getch(); ch != ERR; ch = getch()) {
        if (!HandleKey(ch)) {
          endwin();
          return 0;
        }
        dirty = true;
      }
      // Once a second anyway, so "not reachable" and ages appear without any input.
      if (Clock::now() - last_second >= std::chrono::seconds(1)) {
        last_second = Clock::now();
        dirty = true;
      }
      if (dirty) {
        Draw();
        dirty = false;
      }
    }
  }

 private:
  // --- input -------------------------------------------------------------------
  bool HandleKey(int ch) {
    if (editing_) {
      if (ch == 27) {
        editing_ = false;
        edit_.clear();
      } else if (ch == '\n' || ch == KEY_ENTER || ch == '\r') {
        editing_ = false;
        filter_ = edit_;
        cursor_ = 0;
      } else if (ch == KEY_BACKSPACE || ch == 127 || ch == 8) {
        if (!edit_.empty()) edit_.pop_back();
      } else if (ch >= 32 && ch < 127) {
        edit_.push_back(static_cast<char>(ch));
      }
      return true;
    }
    if (ch == KEY_RESIZE) return true;  // the next Draw() reads the new LINES/COLS
    if (ch == 'q' || ch == 'Q') return false;
    if (mode_ == Mode::kHelp) {
      mode_ = Mode::kMain;
      return true;
    }
    if (mode_ == Mode::kHistory) {
      if (ch == 27 || ch == KEY_BACKSPACE || ch == 127 || ch == 'h' || ch == KEY_LEFT) mode_ = Mode::kMain;
      if (ch == '?') mode_ = Mode::kHelp;
      return true;
    }
    const auto vis = Visible();
    switch (ch) {
      case '?': mode_ = Mode::kHelp; break;
      case 's': sort_ = static_cast<SortKey>((static_cast<int>(sort_) + 1) % static_cast<int>(SortKey::kCount)); break;
      case '/': editing_ = true; edit_ = filter_; break;
      case 27: filter_.clear(); break;
      case '\t': case 'p':
        if (have_ && !snap_.pairs.empty()) pair_ = (pair_ + 1) % snap_.pairs.size();
        cursor_ = 0;
        break;
      case KEY_UP: case 'k': if (cursor_ > 0) --cursor_; break;
      case KEY_DOWN: case 'j': if (cursor_ + 1 < vis.size()) ++cursor_; break;
      case KEY_PPAGE: cursor_ = cursor_ > 10 ? cursor_ - 10 : 0; break;
      case KEY_NPAGE: cursor_ = std::min(cursor_ + 10, vis.empty() ? 0 : vis.size() - 1); break;
      case '\n': case '\r': case KEY_ENTER: case KEY_RIGHT: case 'l':
        if (cursor_ < vis.size()) {
          selected_ = vis[cursor_]->name + "\t" + vis[cursor_]->kind;
          mode_ = Mode::kHistory;
        }
        break;
      default: break;
    }
    return true;
  }

  const PairRow* Pair() const {
    if (!have_ || snap_.pairs.empty()) return nullptr;
    return &snap_.pairs[std::min(pair_, snap_.pairs.size() - 1)];
  }

  std::vector<const TensorRow*> Visible() const {
    std::vector<const TensorRow*> v;
    const PairRow* p = Pair();
    if (!p) return v;
    for (const TensorRow& t : p->tensors) {
      if (filter_.empty() || t.name.find(filter_) != std::string::npos || t.kind == filter_) v.push_back(&t);
    }
    auto num = [](double x, double nan_as) { return std::isnan(x) ? nan_as : x; };
    std::stable_sort(v.begin(), v.end(), [&](const TensorRow* a, const TensorRow* b) {
      // The NaN/Inf producer stays pinned on the first row whatever the sort.
      const bool pa = a->status == "producer", pb = b->status == "producer";
      if (pa != pb) return pa;
      switch (sort_) {
        case SortKey::kDrift: return num(a->ratio, -1) > num(b->ratio, -1);
        case SortKey::kRelL2: return num(a->rel_l2, -1) > num(b->rel_l2, -1);
        case SortKey::kCosine: return num(a->cos, 2) < num(b->cos, 2);
        case SortKey::kFirst: {
          const int64_t fa = a->first < 0 ? INT64_MAX : a->first, fb = b->first < 0 ? INT64_MAX : b->first;
          return fa != fb ? fa < fb : a->order < b->order;
        }
        case SortKey::kOrder: return a->order < b->order;
        default: return a->name < b->name;
      }
    });
    return v;
  }

  // --- drawing -----------------------------------------------------------------
  void Put(int y, int x, const std::string& s, attr_t a = A_NORMAL, short colour = 0) {
    if (y < 0 || y >= LINES || x >= COLS) return;
    if (colour && colour_) a |= COLOR_PAIR(colour);
    attrset(a);
    mvaddstr(y, x, ClipCols(s, static_cast<size_t>(COLS - x)).c_str());
    attrset(A_NORMAL);
  }
  short StatusColour(const std::string& st) const {
    return st == "ok" ? kOk : st == "drifting" || st == "drifted" ? kWarn : kBad;
  }
  attr_t Strong(short colour) const { return colour == kBad ? A_BOLD : A_NORMAL; }

  void Draw() {
    erase();
    if (LINES < 8 || COLS < 30) {
      Put(0, 0, "terminal too small for lockstep top (needs 30x8)");
      refresh();
      return;
    }
    DrawHeader();
    if (mode_ == Mode::kHelp) {
      DrawHelp();
    } else if (mode_ == Mode::kHistory) {
      DrawHistory();
    } else {
      DrawMain();
    }
    refresh();
  }

  void DrawHeader() {
    std::string h = " lockstep top  " + opt_.connect;
    if (have_) {
      std::time_t tt = static_cast<std::time_t>(snap_.unix_ms / 1000);
      std::tm tm{};
      localtime_r(&tt, &tm);
      char ts[16];
      std::strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
      // The one alert count on screen (the ALERTS section lists, it does not count again).
      h += "  " + std::string(ts) + "  alerts " + std::to_string(snap_.alerts_total) + " (" +
           std::to_string(snap_.alerts_critical) + " critical)";
    }
    h += "  ? keys";
    h.resize(std::max<size_t>(h.size(), static_cast<size_t>(COLS)), ' ');
    Put(0, 0, h, A_REVERSE);
    const auto age = have_ ? Clock::now() - last_rx_ : Clock::now() - started_;
    const bool late = age > std::chrono::milliseconds(opt_.unreachable_after_ms);
    if (late) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), have_ ? "; last snapshot %.0fs ago" : "",
                    std::chrono::duration<double>(age).count());
      Put(1, 0, "collector not reachable at " + opt_.connect + " (retrying" + buf + ")", A_BOLD | A_REVERSE, kBad);
    } else if (!have_) {
      Put(1, 0, "waiting for the first snapshot from " + opt_.connect + " ...", A_NORMAL, kDim);
    } else if (!feed_error_.empty()) {
      Put(1, 0, feed_error_, A_BOLD, kBad);
    }
  }

  void DrawMain() {
    int y = 2;
    const int w = COLS;
    if (!have_) return;
    const size_t name_w = RunNameWidth(w);
    const bool plat = RunShowsPlatform(w);
    Put(y++, 0, RunHeader(name_w, plat), A_BOLD, kHead);
    const int max_runs = std::max(2, (LINES - 12) / 3);
    int shown = 0;
    for (const RunRow& r : snap_.runs) {
      if (shown++ == max_runs) {
        Put(y++, 0, "  ... " + std::to_string(snap_.runs.size() - static_cast<size_t>(max_runs)) + " more runs");
        break;
      }
      const bool lossy = r.drops + r.gaps > 0;
      const bool nan_loss = r.has_loss && !std::isfinite(r.loss);
      Put(y++, 0, RunLine(r, name_w, plat, unicode_), nan_loss ? A_BOLD : A_NORMAL, nan_loss ? kBad : lossy ? kWarn : 0);
    }
    if (!snap_.unpaired.empty()) {
      std::string u = "! " + snap_.unpaired.front();
      if (snap_.unpaired.size() > 1) u += " (+" + std::to_string(snap_.unpaired.size() - 1) + " more)";
      Put(y++, 0, u, A_BOLD, kBad);
    }
    const PairRow* p = Pair();
    if (!p) {
      Put(++y, 0, "no pair yet: waiting for a baseline and a candidate of one experiment", A_NORMAL, kDim);
      DrawAlerts(y + 2);
      return;
    }
    ++y;
    std::string title = "LOSS " + p->experiment + ": " + p->baseline + " vs " + p->candidate + "  step " +
                        std::to_string(p->step);
    if (snap_.pairs.size() > 1) title += "  (pair " + std::to_string(pair_ + 1) + "/" + std::to_string(snap_.pairs.size()) + ", Tab: next)";
    Put(y++, 0, title, A_BOLD, kHead);
    std::string l = " baseline " + FormatLoss(p->loss_b, p->has_loss_b) + "  candidate " +
                    FormatLoss(p->loss_c, p->has_loss_c) + "  rel diff " + FormatNum(p->loss_rel) + "  ";
    std::vector<double> rel;
    for (const LossPoint& lp : p->loss_hist) {
      rel.push_back(std::fabs(lp.c - lp.b) / std::max(std::fabs(lp.b), 1e-12));
    }
    Put(y, 0, l);
    Put(y++, static_cast<int>(Cols(l)), Sparkline(rel, w - static_cast<int>(Cols(l)) - 1, unicode_), A_NORMAL,
        p->loss_rel > 1e-2 ? kWarn : kOk);
    if (p->setup_differences > 0) {
      Put(y++, 0, " setup: " + p->setup_summary, A_NORMAL, kWarn);
    }
    if (p->has_nan_onset) {
      Put(y++, 0,
          " first NaN/Inf: step " + std::to_string(p->nan_onset_step) + " in " + p->nan_onset_tensor + " (" +
              p->nan_onset_kind + ")",
          A_BOLD, kBad);
    }
    if (p->diverged) {
      Put(y++, 0, " first divergence: step " + std::to_string(p->first_div_step) + p->FirstDivWhere() + " at " + p->first_div_tensor,
          A_BOLD, kBad);
    }
    // Tensors get what the alerts (up to 4 rows + title) and the footer leave.
    const int alert_rows = std::clamp((LINES - y) / 5, 2, 4);
    const int table_end = LINES - 1 - (alert_rows + 1);
    const auto vis = Visible();
    std::string th = "TENSORS  sort: " + std::string(SortName(sort_)) + "  " +
                     std::to_string(p->drifting) + " of " + std::to_string(p->tensors_total) + " drifting";
    if (!filter_.empty()) th += "  filter: " + filter_ + " (" + std::to_string(vis.size()) + ")";
    Put(y++, 0, th, A_BOLD, kHead);
    const size_t tw = TensorNameWidth(w);
    Put(y++, 0, " " + TensorHeader(tw), A_UNDERLINE);
    const int rows = std::max(0, table_end - y);
    if (cursor_ >= vis.size()) cursor_ = vis.empty() ? 0 : vis.size() - 1;
    size_t top = cursor_ >= static_cast<size_t>(rows) && rows > 0 ? cursor_ - static_cast<size_t>(rows) + 1 : 0;
    for (int i = 0; i < rows && top + static_cast<size_t>(i) < vis.size(); ++i) {
      const size_t idx = top + static_cast<size_t>(i);
      const TensorRow& t = *vis[idx];
      const short c = StatusColour(t.status);
      attr_t a = idx == cursor_ ? A_REVERSE : Strong(c);
      Put(y + i, 0, (idx == cursor_ ? ">" : " ") + TensorLine(t, tw, unicode_), a, c);
    }
    DrawAlerts(table_end);
    if (editing_) {
      Put(LINES - 1, 0, "filter (name substring or kind; Enter apply, Esc cancel): /" + edit_, A_REVERSE);
    } else {
      Put(LINES - 1, 0, "q quit  ? keys  Enter history  s sort  / filter  Tab pair", A_NORMAL, kDim);
    }
  }

  // The selected pair's alerts, newest first, with the number of recent alerts of other
  // runs on the title line; with no pair yet, every alert, labelled with its runs.
  void DrawAlerts(int y) {
    if (y >= LINES - 1) return;
    const PairRow* p = Pair();
    std::vector<const AlertRow*> mine;
    size_t others = 0;
    for (const AlertRow& a : snap_.alerts) {
      if (!p || AlertOfPair(a, *p)) {
        mine.push_back(&a);
      } else {
        ++others;
      }
    }
    std::string title = p ? "ALERTS of " + p->baseline + " vs " + p->candidate : std::string("ALERTS");
    if (others) title += "  (+" + std::to_string(others) + " of other runs; top --once lists all)";
    Put(y++, 0, title, A_BOLD, kHead);
    if (mine.empty()) Put(y, 0, " (none yet)", A_NORMAL, kDim);
    for (const AlertRow* ap : mine) {
      const AlertRow& a = *ap;
      if (y >= LINES - 1) break;
      std::time_t tt = static_cast<std::time_t>(a.unix_ms / 1000);
      std::tm tm{};
      localtime_r(&tt, &tm);
      char ts[16];
      std::strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
      const short c = a.severity == "critical" ? kBad : a.severity == "warning" ? kWarn : kOk;
      Put(y++, 0,
          " " + std::string(ts) + " " + a.severity + " " + (p ? "" : "[" + AlertLabel(a) + "] ") + a.rule +
              " step " + std::to_string(a.step) +
              // Most messages begin with the tensor's name already.
              (a.tensor.empty() || a.message.rfind(a.tensor, 0) == 0 ? "" : " " + a.tensor) + ": " + a.message,
          Strong(c), c);
    }
  }

  void DrawHistory() {
    int y = 2;
    const PairRow* p = Pair();
    const TensorRow* t = nullptr;
    if (p) {
      for (const TensorRow& r : p->tensors) {
        if (r.name + "\t" + r.kind == selected_) t = &r;
      }
    }
    const std::string name = selected_.substr(0, selected_.find('\t'));
    Put(LINES - 1, 0, "Esc back  q quit  ? keys", A_NORMAL, kDim);
    if (!t) {
      Put(y, 0, "TENSOR " + name, A_BOLD, kHead);
      Put(y + 2, 0, "no longer among the tensors the collector sends (most drifting first); Esc to go back");
      return;
    }
    const short c = StatusColour(t->status);
    Put(y++, 0, "TENSOR " + t->name + " (" + t->kind + ", order " + std::to_string(t->order) + ")", A_BOLD, kHead);
    Put(y++, 0,
        " status " + t->status + "  drift " + FormatNum(t->ratio) + " x threshold (" + t->metric + ")  worst " +
            FormatNum(t->worst) + "  first drift " + (t->first >= 0 ? std::to_string(t->first) : "-"),
        Strong(c), c);
    Put(y++, 0, " at step " + std::to_string(t->step) + ": rel_l2 " + FormatNum(t->rel_l2) + "  cosine " +
                    FormatNum(t->cos, 9) + "  |baseline| " + FormatNum(t->b_l2) + "  |candidate| " + FormatNum(t->c_l2));
    if (!t->has_hist || t->hist.empty()) {
      Put(y + 1, 0, " no history in the feed for this tensor (only the most drifting ones carry one)", A_NORMAL, kDim);
      return;
    }
    std::vector<double> ratio, bl, cl;
    for (const HistPoint& h : t->hist) {
      ratio.push_back(h.ratio);
      bl.push_back(h.b_l2);
      cl.push_back(h.c_l2);
    }
    const int sw = COLS - 16;
    ++y;
    Put(y, 0, " drift/thr");
    Put(y++, 15, Sparkline(ratio, sw, unicode_), A_NORMAL, c);
    Put(y, 0, " |baseline|");
    Put(y++, 15, Sparkline(bl, sw, unicode_));
    Put(y, 0, " |candidate|");
    Put(y++, 15, Sparkline(cl, sw, unicode_));
    Put(y++, 0, " steps " + std::to_string(t->hist.front().step) + " .. " + std::to_string(t->hist.back().step) +
                    " (each line scaled to its own range; drift 1 = the tolerance)", A_NORMAL, kDim);
    ++y;
    Put(y++, 0, "    STEP      DRIFT   |BASELINE|  |CANDIDATE|   REL DIFF", A_UNDERLINE);
    // Newest first; the oldest point (the onset, when the collector kept it) stays on
    // the last row whatever the height.
    const size_t n = t->hist.size();
    const size_t fit = static_cast<size_t>(std::max(1, LINES - 1 - y));
    for (size_t k = 0; k < n && k < fit; ++k) {
      const size_t i = (k + 1 == fit && fit < n) ? 0 : n - 1 - k;
      const HistPoint& h = t->hist[i];
      char buf[128];
      std::snprintf(buf, sizeof(buf), " %7lld %10s %12s %12s %10s", (long long)h.step, FormatNum(h.ratio).c_str(),
                    FormatNum(h.b_l2, 12).c_str(), FormatNum(h.c_l2, 12).c_str(),
                    FormatNum(std::fabs(h.c_l2 - h.b_l2) / std::max(std::fabs(h.b_l2), 1e-30)).c_str());
      Put(y++, 0, buf, A_NORMAL, h.ratio > 1 ? kWarn : 0);
    }
  }

  void DrawHelp() {
    static const char* kLines[] = {
        "KEYS",
        "  q          quit",
        "  ?          this help (any key closes it)",
        "  Up/Down    move in the tensor list (also j/k, PgUp/PgDn)",
        "  Enter      the selected tensor's history: drift per step, both runs' norms",
        "  Esc        back from the history; clears the filter in the list",
        "  s          cycle the sort key: drift, rel_l2, cosine, first drift, order, name",
        "  /          filter tensors by a name substring or a kind (act, param_grad, ...)",
        "  Tab, p     next pair (baseline vs candidate) when there are several",
        "",
        "COLUMNS",
        "  DRIFT      this step's drift score over its threshold: above 1 is drifting",
        "  REL_L2     |norm_c - norm_b| / norm_b;  COSINE: sketch estimate",
        "  FIRST      the first step this tensor drifted;  LAG: steps behind its pair",
        "",
        "Feed format and figures: docs/top.md",
    };
    int y = 2;
    for (const char* l : kLines) Put(y++, 0, l, l[0] != ' ' && l[0] ? A_BOLD : A_NORMAL, l[0] != ' ' ? kHead : 0);
  }

  const TopOptions& opt_;
  FeedClient* feed_;
  bool unicode_;
  bool colour_ = false;
  Snapshot snap_;
  bool have_ = false;
  Clock::time_point last_rx_, started_;
  std::string feed_error_;
  Mode mode_ = Mode::kMain;
  SortKey sort_ = SortKey::kDrift;
  std::string filter_, edit_, selected_;
  bool editing_ = false;
  size_t cursor_ = 0, pair_ = 0;
};

}  // namespace

int RunTop(const TopOptions& opt) {
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    std::fprintf(stderr, "lockstep top: needs a terminal; use 'lockstep top --once' for a plain-text snapshot\n");
    return 1;
  }
  std::setlocale(LC_ALL, "");
  auto feed = FeedClient::Create(opt.connect);
  if (!feed.ok()) {
    std::fprintf(stderr, "lockstep top: %s\n", feed.status().message().c_str());
    return 2;
  }
  Screen screen(opt, feed->get());
  return screen.Run();
}

int RunTopOnce(const TopOptions& opt) {
  std::setlocale(LC_ALL, "");
  auto feed = FeedClient::Create(opt.connect);
  if (!feed.ok()) {
    std::fprintf(stderr, "lockstep top: %s\n", feed.status().message().c_str());
    return 2;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(opt.once_timeout_ms);
  std::string msg;
  while (Clock::now() < deadline) {
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (!(*feed)->Receive(std::max(1, std::min(left, 200)), &msg)) continue;
    auto snap = ParseSnapshot(msg);
    if (!snap.ok()) {
      std::fprintf(stderr, "lockstep top: %s\n", snap.status().message().c_str());
      return 1;
    }
    std::fputs(FormatPlain(*snap, opt.connect, opt.once_width, UnicodeLocale()).c_str(), stdout);
    return 0;
  }
  std::fprintf(stderr,
               "lockstep top: collector not reachable at %s (no snapshot within %.1f s); is 'lockstep collect' "
               "running with this --view-listen?\n",
               opt.connect.c_str(), opt.once_timeout_ms / 1000.0);
  return 1;
}

}  // namespace lockstep::collector::view
