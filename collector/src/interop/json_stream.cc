#include "interop/json_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

namespace lockstep::collector {
namespace {

// A character for a message: itself when printable, else its code ('\n' would break
// the one-line error).
std::string CharName(int c) {
  if (c >= 0x20 && c < 0x7F) return "'" + std::string(1, static_cast<char>(c)) + "'";
  char buf[16];
  std::snprintf(buf, sizeof buf, "byte 0x%02X", c & 0xFF);
  return buf;
}

}  // namespace

const char* JsonTokenName(JsonStream::Token t) {
  switch (t) {
    case JsonStream::Token::kBeginObject: return "an object";
    case JsonStream::Token::kEndObject: return "the end of an object";
    case JsonStream::Token::kBeginArray: return "a list";
    case JsonStream::Token::kEndArray: return "the end of a list";
    case JsonStream::Token::kKey: return "a key";
    case JsonStream::Token::kString: return "a string";
    case JsonStream::Token::kNumber: return "a number";
    case JsonStream::Token::kTrue: return "true";
    case JsonStream::Token::kFalse: return "false";
    case JsonStream::Token::kNull: return "null";
    case JsonStream::Token::kEnd: return "the end of the document";
  }
  return "?";
}

JsonStream::JsonStream(int fd, std::string name, size_t chunk_bytes)
    : fd_(fd), name_(std::move(name)), buf_(chunk_bytes < 64 ? 64 : chunk_bytes) {}

JsonStream::~JsonStream() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<JsonStream>> JsonStream::Open(const std::string& path, size_t chunk_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    std::string msg = path + ": cannot open: " + std::strerror(e);
    if (e == ENOENT) return Status::NotFound(msg);
    return Status::IOError(msg);
  }
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<JsonStream>(new JsonStream(fd, path, chunk_bytes));
}

std::unique_ptr<JsonStream> JsonStream::FromString(std::string text, std::string name) {
  std::unique_ptr<JsonStream> s(new JsonStream(-1, std::move(name), 64));
  s->buf_.assign(text.begin(), text.end());
  s->end_ = s->buf_.size();
  s->eof_ = true;
  return s;
}

bool JsonStream::Fill() {
  if (eof_) return false;
  consumed_ += end_;
  pos_ = end_ = 0;
  for (;;) {
    const ssize_t n = ::read(fd_, buf_.data(), buf_.size());
    if (n > 0) {
      end_ = static_cast<size_t>(n);
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_error_ = std::strerror(errno);
    eof_ = true;
    return false;
  }
}

inline int JsonStream::Peek() {
  if (pos_ == end_ && !Fill()) return -1;
  return static_cast<unsigned char>(buf_[pos_]);
}

inline int JsonStream::Get() {
  if (pos_ == end_ && !Fill()) return -1;
  return static_cast<unsigned char>(buf_[pos_++]);
}

Status JsonStream::Error(const std::string& what) const {
  // The offending character was just read: its offset is one before.
  const uint64_t at = offset() > 0 ? offset() - 1 : 0;
  return Status::Corruption(name_ + ": not valid JSON at byte " + std::to_string(at) + ": " + what);
}

Status JsonStream::Truncated() const {
  if (!io_error_.empty()) return Status::IOError(name_ + ": cannot read at byte " + std::to_string(offset()) + ": " + io_error_);
  return Status::Corruption(name_ + ": truncated at byte " + std::to_string(offset()) +
                            " (the file ends inside its JSON: a dump that was cut off or is still being written)");
}

Status JsonStream::AfterValue() {
  expect_ = stack_.empty() ? Expect::kDone : Expect::kNext;
  return Status::OK();
}

Status JsonStream::ReadString() {
  text_.clear();
  for (;;) {
    // The common run of plain characters at once.
    if (pos_ == end_ && !Fill()) return Truncated();
    const char* p = buf_.data() + pos_;
    const char* e = buf_.data() + end_;
    const char* q = p;
    while (q < e && *q != '"' && *q != '\\' && static_cast<unsigned char>(*q) >= 0x20) ++q;
    text_.append(p, q);
    pos_ += static_cast<size_t>(q - p);
    if (q == e) continue;
    const int c = Get();
    if (c == '"') return Status::OK();
    if (c != '\\') return Error("a control character inside a string");
    const int x = Get();
    switch (x) {
      case -1: return Truncated();
      case '"': text_ += '"'; break;
      case '\\': text_ += '\\'; break;
      case '/': text_ += '/'; break;
      case 'b': text_ += '\b'; break;
      case 'f': text_ += '\f'; break;
      case 'n': text_ += '\n'; break;
      case 'r': text_ += '\r'; break;
      case 't': text_ += '\t'; break;
      case 'u': {
        auto hex4 = [this](uint32_t* v) -> Status {
          *v = 0;
          for (int i = 0; i < 4; ++i) {
            const int h = Get();
            if (h < 0) return Truncated();
            uint32_t d;
            if (h >= '0' && h <= '9') d = h - '0';
            else if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
            else if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
            else return Error("a bad \\u escape");
            *v = *v * 16 + d;
          }
          return Status::OK();
        };
        uint32_t cp;
        if (Status s = hex4(&cp); !s.ok()) return s;
        if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
          if (Get() != '\\' || Get() != 'u') return Error("a lone surrogate in a \\u escape");
          uint32_t lo;
          if (Status s = hex4(&lo); !s.ok()) return s;
          if (lo < 0xDC00 || lo >= 0xE000) return Error("a bad surrogate pair");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp < 0x80) {
          text_ += static_cast<char>(cp);
        } else if (cp < 0x800) {
          text_ += static_cast<char>(0xC0 | (cp >> 6));
          text_ += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          text_ += static_cast<char>(0xE0 | (cp >> 12));
          text_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          text_ += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          text_ += static_cast<char>(0xF0 | (cp >> 18));
          text_ += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          text_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          text_ += static_cast<char>(0x80 | (cp & 0x3F));
        }
        break;
      }
      default: return Error("a bad escape in a string");
    }
  }
}

Status JsonStream::ReadNumber(int first) {
  char tmp[64];
  size_t n = 0;
  tmp[n++] = static_cast<char>(first);
  for (;;) {
    const int c = Peek();
    if (c < 0) {
      // A number may end the document only at the top level.
      if (!stack_.empty()) return Truncated();
      break;
    }
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) break;
    if (n + 1 >= sizeof tmp) return Error("a number too long");
    tmp[n++] = static_cast<char>(c);
    ++pos_;
  }
  tmp[n] = 0;
  if (first == '-' && n == 1) {  // -Infinity
    if (Status s = ReadWord("Infinity", Token::kNumber, nullptr); !s.ok()) return s;
    number_ = -std::numeric_limits<double>::infinity();
    return Status::OK();
  }
  char* endp = nullptr;
  number_ = std::strtod(tmp, &endp);
  if (endp != tmp + n) return Error(std::string("a bad number '") + tmp + "'");
  return Status::OK();
}

// The letters of a bare word after its first (already read) one.
Status JsonStream::ReadWord(const char* rest, Token t, Token* out) {
  for (const char* p = rest; *p; ++p) {
    const int c = Get();
    if (c < 0) return Truncated();
    if (c != *p) return Error("an unexpected character " + CharName(c));
  }
  if (out != nullptr) *out = t;
  return Status::OK();
}

Status JsonStream::Next(Token* t) {
  for (;;) {
    int c = Get();
    while (c == ' ' || c == '\n' || c == '\r' || c == '\t') c = Get();
    if (c < 0) {
      if (expect_ == Expect::kDone) {
        *t = Token::kEnd;
        return Status::OK();
      }
      if (consumed_ + end_ == 0 && io_error_.empty()) return Status::Corruption(name_ + ": empty file, not JSON");
      return Truncated();
    }
    switch (expect_) {
      case Expect::kDone:
        return Error("text after the end of the document");
      case Expect::kNext:
        if (c == ',') {
          expect_ = stack_.back() == '{' ? Expect::kKey : Expect::kValue;
          continue;
        }
        if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
          *t = c == '}' ? Token::kEndObject : Token::kEndArray;
          stack_.pop_back();
          return AfterValue();
        }
        return Error("expected ',' or the end of the " + std::string(stack_.back() == '{' ? "object" : "list"));
      case Expect::kFirstKey:
        if (c == '}') {
          *t = Token::kEndObject;
          stack_.pop_back();
          return AfterValue();
        }
        [[fallthrough]];
      case Expect::kKey: {
        if (c != '"') return Error("expected a key in quotes");
        if (Status s = ReadString(); !s.ok()) return s;
        int d = Get();
        while (d == ' ' || d == '\n' || d == '\r' || d == '\t') d = Get();
        if (d < 0) return Truncated();
        if (d != ':') return Error("expected ':' after a key");
        expect_ = Expect::kValue;
        *t = Token::kKey;
        return Status::OK();
      }
      case Expect::kFirstValue:
        if (c == ']') {
          *t = Token::kEndArray;
          stack_.pop_back();
          return AfterValue();
        }
        [[fallthrough]];
      case Expect::kValue:
        break;
    }
    // A value.
    switch (c) {
      case '{':
        stack_.push_back('{');
        expect_ = Expect::kFirstKey;
        *t = Token::kBeginObject;
        return Status::OK();
      case '[':
        stack_.push_back('[');
        expect_ = Expect::kFirstValue;
        *t = Token::kBeginArray;
        return Status::OK();
      case '"':
        if (Status s = ReadString(); !s.ok()) return s;
        *t = Token::kString;
        return AfterValue();
      case 't':
        if (Status s = ReadWord("rue", Token::kTrue, t); !s.ok()) return s;
        return AfterValue();
      case 'f':
        if (Status s = ReadWord("alse", Token::kFalse, t); !s.ok()) return s;
        return AfterValue();
      case 'n':
        if (Status s = ReadWord("ull", Token::kNull, t); !s.ok()) return s;
        return AfterValue();
      case 'N':
        if (Status s = ReadWord("aN", Token::kNumber, t); !s.ok()) return s;
        number_ = std::numeric_limits<double>::quiet_NaN();
        return AfterValue();
      case 'I':
        if (Status s = ReadWord("nfinity", Token::kNumber, t); !s.ok()) return s;
        number_ = std::numeric_limits<double>::infinity();
        return AfterValue();
      default:
        if (c == '-' || (c >= '0' && c <= '9')) {
          if (Status s = ReadNumber(c); !s.ok()) return s;
          *t = Token::kNumber;
          return AfterValue();
        }
        return Error("an unexpected character " + CharName(c));
    }
  }
}

Status JsonStream::Skip(Token first) {
  if (first != Token::kBeginObject && first != Token::kBeginArray) return Status::OK();
  const int target = depth() - 1;
  Token t;
  while (depth() > target) {
    if (Status s = Next(&t); !s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace lockstep::collector
