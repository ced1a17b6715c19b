#include "align/names.h"

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

namespace lockstep::collector {
namespace {

TEST(NameCanonicalizer, StripsWrapperPrefixes) {
  NameCanonicalizer c;
  EXPECT_EQ(c.Canonical("module.layers.0.attn"), "layers.0.attn");
  EXPECT_EQ(c.Canonical("module.module.layers.0"), "layers.0");
  EXPECT_EQ(c.Canonical("_orig_mod.module.fc"), "fc");
  EXPECT_EQ(c.Canonical("layers.0._fsdp_wrapped_module.mlp"), "layers.0.mlp");
  EXPECT_EQ(c.Canonical("_fsdp_wrapped_module.layers.1._checkpoint_wrapped_module.mlp.fc1"), "layers.1.mlp.fc1");
  EXPECT_EQ(c.Canonical("model._orig_mod"), "model");
  // "module." deeper down is a real layer name, kept.
  EXPECT_EQ(c.Canonical("encoder.module.fc"), "encoder.module.fc");
  EXPECT_EQ(c.Canonical("modules.0"), "modules.0");
  EXPECT_EQ(c.Canonical(""), "");
}

TEST(NameCanonicalizer, AppliesRulesInOrderAfterStripping) {
  auto c = NameCanonicalizer::FromText(
      "# comment\n\n^transformer\\.h\\.(\\d+) => layers.$1\nlayers\\.(\\d+)\\.attn\\.c_attn => layers.$1.qkv\n",
      "test");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rule_count(), 2u);
  EXPECT_EQ(c->Canonical("module.transformer.h.3.attn.c_attn"), "layers.3.qkv");
  EXPECT_EQ(c->Canonical("other"), "other");
}

TEST(NameCanonicalizer, BadRuleIsOneClearSentence) {
  auto c = NameCanonicalizer::FromText("ok => fine\n(unclosed => x\n", "map.txt");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("map.txt line 2"), std::string::npos) << c.status().message();
  auto d = NameCanonicalizer::FromText("no arrow here\n", "map.txt");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("REGEX => REPLACEMENT"), std::string::npos);
  auto e = NameCanonicalizer::FromFile("/nonexistent/dir/map.txt");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--name-map"), std::string::npos);
}

TEST(NameCanonicalizer, ReadsAFile) {
  std::string path = ::testing::TempDir() + "/names_test_map.txt";
  {
    std::ofstream f(path);
    f << "^blocks => layers\n";
  }
  auto c = NameCanonicalizer::FromFile(path);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->Canonical("blocks.1"), "layers.1");
  std::remove(path.c_str());
}

TEST(NameTable, InternsDensely) {
  NameTable t;
  EXPECT_EQ(t.Intern("a"), 0u);
  EXPECT_EQ(t.Intern("b"), 1u);
  EXPECT_EQ(t.Intern("a"), 0u);
  EXPECT_EQ(t.Name(1), "b");
  EXPECT_EQ(t.size(), 2u);
}

TEST(NameTable, MessagesNameTheModuleType) {
  NameTable t;
  const uint32_t conv = t.Intern("features.0");
  const uint32_t child = t.Intern("0");  // a child of a Sequential model
  const uint32_t bare = t.Intern("1");
  const uint32_t fc2 = t.Intern("blocks.0.mlp.fc2");
  const uint32_t mlp = t.Intern("blocks.0.mlp");
  t.SetModuleType(conv, "Conv2d");
  t.SetModuleType(conv, "Linear");  // the first declared type stays
  t.SetModuleType(child, "Conv2d");
  t.SetModuleType(bare, "");
  t.SetModuleType(fc2, "Linear");
  t.AddAlias(fc2, mlp, 0);
  EXPECT_EQ(t.Display(conv), "features.0 (Conv2d)");
  EXPECT_EQ(t.Display(child), "0 (Conv2d)");
  EXPECT_EQ(t.Display(bare), "module 1");
  EXPECT_EQ(t.Display(mlp), "blocks.0.mlp");
  EXPECT_EQ(t.Label(fc2, 0), "blocks.0.mlp.fc2 (Linear, = blocks.0.mlp)");
  EXPECT_EQ(t.Label(conv, 1), "features.0 (Conv2d)");
  EXPECT_EQ(t.Name(conv), "features.0");  // the alert's tensor field stays plain
  EXPECT_EQ(t.ModuleType(bare), "");
}

}  // namespace
}  // namespace lockstep::collector
