// The streaming JSON reader of the msprobe import (collector/src/interop/json_stream.h):
// tokens, what Python's json writes (NaN, Infinity), strings across chunk boundaries,
// and the one-line errors for truncated and malformed documents.
#include "interop/json_stream.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "test_dir.h"

namespace lockstep::collector {
namespace {

using Token = JsonStream::Token;

// Every token of `text` as a short string ("{", "k:a", "s:x", "n:1.5", ...), or the error.
std::string Tokens(std::unique_ptr<JsonStream> js) {
  std::string out;
  for (;;) {
    Token t;
    Status s = js->Next(&t);
    if (!s.ok()) return out + "ERROR " + s.message();
    switch (t) {
      case Token::kBeginObject: out += "{ "; break;
      case Token::kEndObject: out += "} "; break;
      case Token::kBeginArray: out += "[ "; break;
      case Token::kEndArray: out += "] "; break;
      case Token::kKey: out += "k:" + js->text() + " "; break;
      case Token::kString: out += "s:" + js->text() + " "; break;
      case Token::kNumber: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", js->number());
        out += std::string("n:") + buf + " ";
        break;
      }
      case Token::kTrue: out += "true "; break;
      case Token::kFalse: out += "false "; break;
      case Token::kNull: out += "null "; break;
      case Token::kEnd: return out + "END";
    }
  }
}

std::string Tokens(const std::string& text) { return Tokens(JsonStream::FromString(text, "dump.json")); }

TEST(JsonStream, TokensOfAnObject) {
  EXPECT_EQ(Tokens(R"({"a": [1, -2.5e3, true, false, null], "b": {}, "c": [], "d": "x\"y"})"),
            "{ k:a [ n:1 n:-2500 true false null ] k:b { } k:c [ ] k:d s:x\"y } END");
}

TEST(JsonStream, ReadsWhatPythonWritesForNonFiniteFloats) {
  auto js = JsonStream::FromString(R"([NaN, Infinity, -Infinity, 0.5])");
  Token t;
  ASSERT_TRUE(js->Next(&t).ok());
  std::vector<double> v;
  for (;;) {
    ASSERT_TRUE(js->Next(&t).ok());
    if (t == Token::kEndArray) break;
    ASSERT_EQ(t, Token::kNumber);
    v.push_back(js->number());
  }
  ASSERT_EQ(v.size(), 4u);
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], INFINITY);
  EXPECT_EQ(v[2], -INFINITY);
  EXPECT_EQ(v[3], 0.5);
}

TEST(JsonStream, EscapesAndUnicode) {
  EXPECT_EQ(Tokens(R"(["a\\b\/c\n", "\u00e9\ud83d\ude00"])"), "[ s:a\\b/c\n s:\xc3\xa9\xf0\x9f\x98\x80 ] END");
}

TEST(JsonStream, TruncatedDocumentsNameTheFileAndOffset) {
  for (const char* text : {R"({"data": {"x": [1, 2)", R"({"a": "unfinished)", R"({"a": 1.5)", R"({"a")", "[tr"}) {
    const std::string got = Tokens(text);
    EXPECT_NE(got.find("ERROR dump.json: truncated at byte"), std::string::npos) << text << " -> " << got;
  }
  EXPECT_NE(Tokens("").find("ERROR dump.json: empty file"), std::string::npos);
}

TEST(JsonStream, SyntaxErrorsSayWhat) {
  EXPECT_NE(Tokens(R"({"a" 1})").find("not valid JSON at byte 5: expected ':'"), std::string::npos) << Tokens(R"({"a" 1})");
  EXPECT_NE(Tokens(R"([1 2])").find("expected ',' or the end of the list"), std::string::npos);
  EXPECT_NE(Tokens(R"({"a": 1} x)").find("text after the end of the document"), std::string::npos);
  EXPECT_NE(Tokens(R"({a: 1})").find("expected a key in quotes"), std::string::npos);
  // A control character is named by its code: the message stays one line.
  const std::string ctl = Tokens(std::string("[1, \x01]"));
  EXPECT_NE(ctl.find("an unexpected character byte 0x01"), std::string::npos) << ctl;
  EXPECT_EQ(Tokens("[1, \n\n x]").find('\n'), std::string::npos);
}

TEST(JsonStream, SkipJumpsOverAValue) {
  auto js = JsonStream::FromString(R"({"skip": {"x": [1, {"y": 2}], "z": "w"}, "keep": 7})");
  Token t;
  ASSERT_TRUE(js->Next(&t).ok());  // {
  ASSERT_TRUE(js->Next(&t).ok());  // skip
  ASSERT_TRUE(js->Next(&t).ok());  // {
  ASSERT_TRUE(js->Skip(t).ok());
  ASSERT_TRUE(js->Next(&t).ok());
  ASSERT_EQ(t, Token::kKey);
  EXPECT_EQ(js->text(), "keep");
  ASSERT_TRUE(js->Next(&t).ok());
  EXPECT_EQ(js->number(), 7);
}

// A file read in tiny chunks: strings, numbers and words split across every boundary.
TEST(JsonStream, ChunkBoundariesAnywhere) {
  testing::TempDir dir;
  const std::string text = R"({"a long key name": ["a string that spans chunks", 123456.789e-3, NaN, true, null]})";
  {
    std::ofstream(dir / "x.json") << text;
  }
  const std::string want = Tokens(text);
  ASSERT_EQ(want.find("ERROR"), std::string::npos) << want;
  auto js = JsonStream::Open(dir / "x.json", 1);  // rounded up to the smallest buffer
  ASSERT_TRUE(js.ok()) << js.status().message();
  EXPECT_EQ(Tokens(std::move(*js)), want);
  auto missing = JsonStream::Open(dir / "nope.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound());
  EXPECT_NE(missing.status().message().find("nope.json: cannot open"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::collector
