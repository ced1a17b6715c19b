"""Readable names (issue 20): namedtuple outputs are named by field (``heads.logits``),
dict outputs by key, a field never takes a child module's name, and every tensor's
module type travels in the tensor directory (TensorInfo.module_type) so a message can
say ``features.0 (Conv2d)``."""
import collections

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
