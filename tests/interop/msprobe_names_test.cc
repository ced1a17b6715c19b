// msprobe's entry names and how they map to lockstep's (collector/src/interop/msprobe_names.h).
#include "interop/msprobe_names.h"

#include <gtest/gtest.h>

namespace lockstep::collector::msprobe {
namespace {

TEST(MsprobeNames, ModuleEntries) {
  Entry e = ParseEntry("Module.blocks.0.fc1.Linear.forward.0");
  EXPECT_EQ(e.kind, EntryKind::kModule);
  EXPECT_EQ(e.pass, Pass::kForward);
  EXPECT_EQ(e.path, "blocks.0.fc1");
  EXPECT_EQ(e.cls, "Linear");
  EXPECT_EQ(e.n, 0u);
  e = ParseEntry("Module.head.Linear.backward.3");
  EXPECT_EQ(e.pass, Pass::kBackward);
  EXPECT_EQ(e.path, "head");
  EXPECT_EQ(e.n, 3u);
  e = ParseEntry("Module.blocks.1.norm.LayerNorm.parameters_grad.0");
  EXPECT_EQ(e.pass, Pass::kParamsGrad);
  EXPECT_EQ(e.path, "blocks.1.norm");
  EXPECT_EQ(e.cls, "LayerNorm");
  EXPECT_EQ(CallName(e.path, 0), "blocks.1.norm");
  EXPECT_EQ(CallName("blocks.1.norm", 2), "blocks.1.norm#2");
}

TEST(MsprobeNames, ApiEntriesCountBeforeThePass) {
  Entry e = ParseEntry("Functional.linear.12.forward");
  EXPECT_EQ(e.kind, EntryKind::kApi);
  EXPECT_EQ(e.pass, Pass::kForward);
  EXPECT_EQ(e.prefix, "Functional");
  EXPECT_EQ(e.api, "linear");
  EXPECT_EQ(e.call, "Functional.linear.12");
  EXPECT_EQ(e.n, 12u);
  EXPECT_EQ(FuncName(e), "linear");
  e = ParseEntry("Aten.addmm.default.4.backward");
  EXPECT_EQ(e.pass, Pass::kBackward);
  EXPECT_EQ(e.api, "addmm.default");
  EXPECT_EQ(FuncName(e), "addmm");
  // Tensor dunders read as lockstep's zoom reads them: __add__ and __radd__ are add;
  // an in-place __iadd__ stays iadd.
  EXPECT_EQ(FuncName(ParseEntry("Tensor.__add__.0.forward")), "add");
  EXPECT_EQ(FuncName(ParseEntry("Tensor.__radd__.0.forward")), "add");
  EXPECT_EQ(FuncName(ParseEntry("Tensor.__rmatmul__.1.forward")), "matmul");
  EXPECT_EQ(FuncName(ParseEntry("Tensor.__iadd__.0.forward")), "iadd");
  EXPECT_EQ(FuncName(ParseEntry("Tensor.mul_.0.forward")), "mul_");
  EXPECT_EQ(FuncName(ParseEntry("Distributed.all_reduce.3.forward")), "all_reduce");
}

TEST(MsprobeNames, NotEntries) {
  for (const char* n : {"", "optimizer", "Module.x.forward", "Functional.linear.forward", "Module.a.B.sideways.0",
                        "Functional.linear.x.forward", "Module.a.B.forward.-1"}) {
    EXPECT_EQ(ParseEntry(n).kind, EntryKind::kUnknown) << n;
  }
}

TEST(MsprobeNames, DTypes) {
  EXPECT_EQ(DTypeCode("torch.float32"), 1);
  EXPECT_EQ(DTypeCode("torch.bfloat16"), 3);
  EXPECT_EQ(DTypeCode("torch.float8_e5m2"), 12);
  EXPECT_EQ(DTypeCode("torch.int64"), 9);
  EXPECT_EQ(DTypeCode("torch.complex64"), 0);
  EXPECT_TRUE(IsFloatDType("torch.float16"));
  EXPECT_FALSE(IsFloatDType("torch.int32"));
  EXPECT_FALSE(IsFloatDType("torch.bool"));
}

}  // namespace
}  // namespace lockstep::collector::msprobe
