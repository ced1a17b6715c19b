#include "lockstep/common/url_encoding.h"

#include <string>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(UrlEncoding, KeepsUnreservedAndEscapesEverythingElse) {
  EXPECT_EQ(UrlEncode("gpt2-ft_v1.0~a"), "gpt2-ft_v1.0~a");
  EXPECT_EQ(UrlEncode("a b/c?d=e&f#g%"), "a%20b%2Fc%3Fd%3De%26f%23g%25");
  EXPECT_EQ(UrlEncode("+"), "%2B");
  EXPECT_EQ(UrlEncode(std::string("\x00\xff", 2)), "%00%FF");
  EXPECT_EQ(UrlEncode("\xe4\xb8\xad"), "%E4%B8%AD");  // UTF-8 bytes, one by one
  EXPECT_EQ(UrlEncode(""), "");
}

TEST(UrlEncoding, DecodesWhatItEncodesAndWhatBrowsersSend) {
  for (const std::string s : {"exp 1", "a/b?c=d&e", "\xe4\xb8\xad-\x01", "100%", "~+~"}) {
    EXPECT_EQ(UrlDecode(UrlEncode(s)), s) << s;
  }
  EXPECT_EQ(UrlDecode("a+b"), "a b");        // a form's space
  EXPECT_EQ(UrlDecode("%e4%B8%ad"), "\xe4\xb8\xad");  // either case of hex
}

TEST(UrlEncoding, KeepsAPercentThatIsNotAnEscape) {
  EXPECT_EQ(UrlDecode("100%"), "100%");
  EXPECT_EQ(UrlDecode("%4"), "%4");
  EXPECT_EQ(UrlDecode("%zz1"), "%zz1");
  EXPECT_EQ(UrlDecode("%41%"), "A%");
}

}  // namespace
}  // namespace lockstep
