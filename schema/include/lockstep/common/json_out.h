// JsonOut: a minimal streaming JSON writer for `lockstep inspect` and status output.
// Appends to a std::string; commas are placed automatically. Non-finite doubles are
// written as null (JSON has no NaN/Inf). Single-threaded.
#ifndef LOCKSTEP_COMMON_JSON_OUT_H_
#define LOCKSTEP_COMMON_JSON_OUT_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::collector {

class JsonOut {
 public:
  explicit JsonOut(std::string* out) : out_(out) {}

  JsonOut& BeginObject() { Sep(); out_->push_back('{'); first_.push_back(true); return *this; }
  JsonOut& EndObject() { out_->push_back('}'); first_.pop_back(); return *this; }
  JsonOut& BeginArray() { Sep(); out_->push_back('['); first_.push_back(true); return *this; }
  JsonOut& EndArray() { out_->push_back(']'); first_.pop_back(); return *this; }
  JsonOut& Key(std::string_view k) {
    Sep();
    Quote(k);
    out_->push_back(':');
    after_key_ = true;
    return *this;
  }
  JsonOut& Str(std::string_view s) { Sep(); Quote(s); return *this; }
  JsonOut& Uint(uint64_t v) { Sep(); out_->append(std::to_string(v)); return *this; }
  JsonOut& Int(int64_t v) { Sep(); out_->append(std::to_string(v)); return *this; }
  JsonOut& Bool(bool v) { Sep(); out_->append(v ? "true" : "false"); return *this; }
  JsonOut& Null() { Sep(); out_->append("null"); return *this; }
  // A value already encoded as JSON by another writer (e.g. alerting::AlertToJson).
  JsonOut& Raw(std::string_view json) { Sep(); out_->append(json); return *this; }
  JsonOut& Double(double v) {
    Sep();
    if (!std::isfinite(v)) {
      out_->append("null");
      return *this;
    }
    char b[32];
    // %.17g round-trips every double exactly.
    int n = std::snprintf(b, sizeof b, "%.17g", v);
    out_->append(b, static_cast<size_t>(n));
    return *this;
  }

  // A double rounded to `digits` significant digits (%.*g: compact, for pages and
  // plots, not for round trips); null when not finite.
  JsonOut& Rounded(double v, int digits) {
    Sep();
    if (!std::isfinite(v)) {
      out_->append("null");
      return *this;
    }
    char b[32];
    int n = std::snprintf(b, sizeof b, "%.*g", digits, v);
    out_->append(b, static_cast<size_t>(n));
    return *this;
  }

  // Shorthands for "key": value.
  JsonOut& Field(std::string_view k, std::string_view v) { return Key(k).Str(v); }
  JsonOut& Field(std::string_view k, const char* v) { return Key(k).Str(v); }
  JsonOut& FieldU(std::string_view k, uint64_t v) { return Key(k).Uint(v); }
  JsonOut& FieldI(std::string_view k, int64_t v) { return Key(k).Int(v); }
  JsonOut& FieldD(std::string_view k, double v) { return Key(k).Double(v); }
  JsonOut& FieldB(std::string_view k, bool v) { return Key(k).Bool(v); }

 private:
  void Sep() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_->push_back(',');
      first_.back() = false;
    }
  }
  void Quote(std::string_view s) {
    out_->push_back('"');
    for (unsigned char c : s) {
      switch (c) {
        case '"': out_->append("\\\""); break;
        case '\\': out_->append("\\\\"); break;
        case '\n': out_->append("\\n"); break;
        case '\r': out_->append("\\r"); break;
        case '\t': out_->append("\\t"); break;
        default:
          if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            out_->append(b);
          } else {
            out_->push_back(static_cast<char>(c));
          }
      }
    }
    out_->push_back('"');
  }

  std::string* out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COMMON_JSON_OUT_H_
