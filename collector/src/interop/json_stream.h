// JsonStream: a pull reader of one JSON document, token by token, from a file read in
// fixed-size chunks, so a dump.json of several GB is read with the memory of one chunk
// (1 MiB) plus the longest string in it. Accepts what Python's json module writes,
// NaN, Infinity and -Infinity included (msprobe's dump.json holds them for tensors
// with NaN/Inf); nlohmann's parser refuses those.
//
// Errors are one sentence naming the file and the byte offset: a document that ends
// too early ("truncated at byte N"), bad syntax, an unreadable file.
//
// Threads: one object, one thread.
#ifndef LOCKSTEP_COLLECTOR_INTEROP_JSON_STREAM_H_
#define LOCKSTEP_COLLECTOR_INTEROP_JSON_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/common/status.h"

namespace lockstep::collector {

class JsonStream {
 public:
  enum class Token : uint8_t {
    kBeginObject, kEndObject, kBeginArray, kEndArray,
    kKey,     // an object's key; text()
    kString,  // text()
    kNumber,  // number(); NaN and +-Infinity included
    kTrue, kFalse, kNull,
    kEnd      // the document is complete
  };

  // Reads `path` in chunks of `chunk_bytes`. NotFound / IOError name the file.
  static StatusOr<std::unique_ptr<JsonStream>> Open(const std::string& path, size_t chunk_bytes = 1 << 20);
  // Reads `text` (tests); `name` stands for the file in messages.
  static std::unique_ptr<JsonStream> FromString(std::string text, std::string name = "<string>");
  ~JsonStream();
  JsonStream(const JsonStream&) = delete;
  JsonStream& operator=(const JsonStream&) = delete;

  // The next token. Corruption (bad syntax, truncated) or IOError, naming the file.
  Status Next(Token* t);
  // Skips the rest of a value whose first token was `first` (an object or array to its
  // end; a scalar: nothing).
  Status Skip(Token first);

  const std::string& text() const { return text_; }
  double number() const { return number_; }
  uint64_t offset() const { return consumed_ + pos_; }  // bytes read so far
  int depth() const { return static_cast<int>(stack_.size()); }
  const std::string& name() const { return name_; }

 private:
  JsonStream(int fd, std::string name, size_t chunk_bytes);

  bool Fill();              // false at the end of the input (or an error, see io_error_)
  int Peek();               // -1 at the end
  int Get();
  Status Error(const std::string& what) const;
  Status Truncated() const;
  Status ReadString();
  Status ReadNumber(int first);
  Status ReadWord(const char* rest, Token t, Token* out);
  Status AfterValue();      // a value ended: the container now expects ',' or its end

  int fd_ = -1;
  std::string name_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  uint64_t consumed_ = 0;   // bytes before buf_[0]
  bool eof_ = false;
  std::string io_error_;
  std::string text_;
  double number_ = 0;
  std::vector<char> stack_;  // '{' or '['
  // What the next token may be: a value (kValue), a key or '}' (kKey), ',' or the
  // container's end (kNext), nothing but the end (kDone).
  enum class Expect : uint8_t { kValue, kFirstValue, kKey, kFirstKey, kNext, kDone } expect_ = Expect::kValue;
};

const char* JsonTokenName(JsonStream::Token t);

}  // namespace lockstep::collector

#endif  // LOCKSTEP_COLLECTOR_INTEROP_JSON_STREAM_H_
