"""Readable names (issue 20): namedtuple outputs are named by field (``heads.logits``),
dict outputs by key, a field never takes a child module's name, and every tensor's
module type travels in the tensor directory (TensorInfo.module_type) so a message can
say ``features.0 (Conv2d)``."""
import collections
import dataclasses

import torch

import lockstep
from conftest import fake_monitor

Heads = collections.namedtuple("Heads", ["logits", "aux"])


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.aux = torch.nn.Linear(4, 2)  # a child named like a field of the output

    def forward(self, x):
        return Heads(self.a(x), self.aux(x))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3), torch.nn.ReLU())
        self.heads = TwoHeads()

    def forward(self, x):
        h = self.features(x).flatten(1)[:, :4]
        out = self.heads(h)
        return {"logits": out.logits, "aux": out.aux}


def _train(mon, model):
    mon.watch(model)
    out = model(torch.randn(2, 1, 6))
    loss = out["logits"].sum() + out["aux"].sum()
    loss.backward()
    mon.step(loss=loss)


def test_namedtuple_fields_dict_keys_and_module_types():
    mon, fake = fake_monitor()
    _train(mon, Net())
    acts = set(fake.names("act"))
    assert {"heads.logits", "heads[aux]", "<root>[logits]", "<root>[aux]",
            "features.0", "features.1", "heads.a", "heads.aux"} <= acts, sorted(acts)
    assert not any("heads[0]" in n or "heads[1]" in n for n in acts)
    types = fake.module_types
    assert types["features.0"] == "Conv1d" and types["features.1"] == "ReLU"
    assert types["heads.logits"] == "TwoHeads" and types["heads[aux]"] == "TwoHeads"
    assert types["heads.aux"] == "Linear" and types["<root>[logits]"] == "Net"
    assert types["features.0.weight"] == "Conv1d"  # a parameter: its owner's type
    assert types["loss"] == ""


def test_module_type_reaches_the_collector(collector):
    mon = lockstep.Monitor(run="names", endpoint=collector.endpoint, host_stats_thread="off")
    _train(mon, Net())
    assert mon.close(5.0)
    infos = [t for r in collector.inspect("names") if r["type"] == "TensorDirectory"
             for t in r["body"]["tensors"]]
    got = {(t["name"], t["kind"]): t.get("module_type", "") for t in infos}
    assert got[("features.0", "act")] == "Conv1d", got
    assert got[("features.0.weight", "param_grad")] == "Conv1d", got
    assert got[("heads.logits", "act_grad")] == "TwoHeads", got


class _Pair(torch.nn.Module):
    """Three tensor inputs, two of them in a tuple, one by keyword; a dataclass output."""

    def forward(self, q, kv, mask=None):
        k, v = kv
        out = (q @ k.transpose(-1, -2) + (0 if mask is None else mask)).softmax(-1) @ v
        return _Out(out, out.sum())


@dataclasses.dataclass
class _Out:
    hidden: torch.Tensor
    total: torch.Tensor


class _UsesPair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.pair = _Pair()
        self.mha = torch.nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x):
        h = self.lin(x)
        a, _ = self.mha(h, h, h)
        return self.pair(a, (h, h + 1), mask=torch.zeros(3, 3)).hidden


def test_several_inputs_are_named_by_position_and_keyword_never_like_an_output():
    """act_in names (issue 25): one input is the module's name; several are `name(i)`,
    `name(key)`, `name(i)[j]`, so nn.MultiheadAttention's query `mha(0)` is not its first
    output `mha[0]`. Keywords reach pre-hooks on torch >= 2.0 only. Dataclass outputs
    are named by field, `pair[hidden]`."""
    mon, fake = fake_monitor()
    model = _UsesPair()
    mon.watch(model, kinds=("act", "act_in"))
    out = model(torch.randn(2, 3, 4))
    out.sum().backward()
    mon.step(loss=out.sum())
    ins, acts = set(fake.names("act_in")), set(fake.names("act"))
    keyword = {"pair(mask)"} if int(torch.__version__.split(".")[0]) >= 2 else set()
    assert ins == {"lin", "mha(0)", "mha(1)", "mha(2)", "pair(0)", "pair(1)[0]", "pair(1)[1]"} | keyword, \
        sorted(ins)
    assert {"mha[0]", "mha[1]", "pair[hidden]", "pair[total]"} <= acts, sorted(acts)
    # Only a one-input module's input has its output's name (the op's name, another kind).
    assert ins & acts == {"lin"}, sorted(ins & acts)
    types = fake.module_types
    assert types["mha(0)"] == "MultiheadAttention" and types["pair(1)[0]"] == "_Pair"
