"""msprobe's own dumps, made here by its PrecisionDebugger (mindstudio-probe 26.2.0, torch
2.x stack only) on a small model on the CPU, and the structure of what it writes: what an
importer of msprobe dumps (`lockstep import msprobe`) reads. Dumps come from
msprobe_dump.make_dump (the `msprobe_dumps` fixture of conftest.py reuses them).

CPU: msprobe dumps on the CPU with no NPU or GPU (its only NPU-only task is nan_check,
refused without torch_npu; statistics and tensor work). Its debugger is a process-wide
singleton and wraps torch's APIs for the life of the process, hence the child processes.

What msprobe writes (PyTorch, as observed in these tests; every item is asserted below):

- Layout: DUMP_PATH/step<N>/<proc>/ with <proc> = rank<R> when torch.distributed is
  initialised (rank0, rank1, ...), else proc<PID> (the process id). step<N> counts the
  debugger's step() calls from 0; only the steps in the config's "step" list are written.
  Each <proc> folder holds dump.json, construct.json, stack.json and, for task "tensor",
  dump_tensor_data/.
- dump.json: {"task": "statistics"|"tensor", "level": "L0"|"L1"|"mix", "framework":
  "pytorch", "dump_data_dir": the dump_tensor_data path or null, "data": {entry: record}},
  entries in the order their hooks finished (a module after its children).
- Entry names: modules "Module.<path>.<Class>.forward.<n>" / ".backward.<n>" (path as in
  named_modules(): "blocks.0.fc1"; n counts calls of that module in the step, from 0) and
  "Module.<path>.<Class>.parameters_grad.<n>" (its parameters' gradients); APIs
  "<Prefix>.<api>.<n>.forward" / ".backward" with n counting calls of that API in the step
  (note: the count comes before forward here, after it for modules), Prefix one of
  Functional (torch.nn.functional), Tensor (methods, dunders: Tensor.__add__), Torch
  (torch.*), Distributed (torch.distributed: all_reduce), Aten, NPU... The root module
  itself is never dumped (msprobe skips it); a list of models gets "Module.<i>.<path>...".
  L0 has Module.* only, L1 API entries only, mix both.
- A forward record: {"input_args": [...], "input_kwargs": {name: ...}, "output": [...]},
  for modules also "parameters": {name: tensor} (its own parameters). A backward record:
  {"input": gradients w.r.t. the outputs, "output": gradients w.r.t. the inputs}; for an
  API those of the autograd node that made its output, in the node's order (layer_norm:
  input, weight, bias; linear on a 3-D input: only the view after its matmul, a
  [batch*seq, out] gradient, no weight gradient). A parameters_grad record: {param
  name: [tensor]}.
- A tensor: {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [...], "Max",
  "Min", "Mean", "Norm" (L2, of the whole tensor), "requires_grad"}, plus "data_name"
  (the file in dump_tensor_data/) for task tensor. Other values: {"type": "int"|"float"|
  "str"|"bool"|..., "value": v}; None is null; lists and tuples nest as JSON lists.
- dump_tensor_data/<entry>.<input|output>.<i>.pt, <entry>.parameters.<name>.pt,
  <module>.parameters_grad.<n>.<name>.pt, with i the argument's index (an int argument's
  index is skipped): torch.save of a detached CPU tensor (.npy only for string arrays on
  PyTorch; MindSpore dumps use .npy).
- construct.json: {entry: the enclosing module's entry or null} for forward and backward
  entries (API calls inside a module point to that module's forward or backward entry;
  the optimizer's API calls to "optimizer"); parameters_grad entries are not in it.
- stack.json: {"<i>": [[entry names sharing one call stack], ["File <path>, line <n>, in
  <function>, \\n <source line>", ...]]}.
"""
import glob
import json
import os

import torch

import msprobe_dump as md

STEPS = 2
TENSOR_KEYS = {"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"}
MODULES = ["embed.Linear"] + ["blocks.%d.%s" % (b, m) for b in range(2) for m in (
    "Block", "norm.LayerNorm", "fc1.Linear", "act.GELU", "fc2.Linear")] + ["head.Linear"]
WITH_PARAMS = [m for m in MODULES if not m.endswith(("Block", "GELU"))]


def _procs(root, step):
    return sorted(glob.glob(os.path.join(root, "step%d" % step, "*")))


def _load(folder, name):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def _tensors(value):
    """Every tensor record in a record's value (lists nest)."""
    if isinstance(value, list):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict) and value.get("type") == "torch.Tensor":
        yield value
    elif isinstance(value, dict) and "type" not in value:
        for v in value.values():
            yield from _tensors(v)


def _reference(steps=1, rank=0):
    """The same training in this process, without msprobe: each step's module outputs
    (forward hooks) and parameter gradients."""
    model = md.build_model(0)
    opt = md.make_optimizer(model)
    names = {m: n for n, m in model.named_modules() if n}
    out = []
    for batch in md.batches(steps, rank):
        acts = {}
        hooks = [m.register_forward_hook(
            lambda mod, _i, o: acts.__setitem__(names[mod], o.detach().clone()))
            for m in names]
        loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        loss.backward()
        for h in hooks:
            h.remove()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        out.append((acts, grads))
    return out


def _close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


def _assert_stats(rec, t):
    """A dump.json tensor record describes tensor t."""
    assert rec["shape"] == list(t.shape) and rec["dtype"] == str(t.dtype)
    t = t.double()
    for key, value in (("Max", t.max()), ("Min", t.min()), ("Mean", t.mean()),
                       ("Norm", t.norm())):
        assert _close(rec[key], value.item()), (key, rec[key], value.item())


def test_statistics_L0_layout_and_entries(msprobe_dumps):
    root = msprobe_dumps("statistics", "L0", STEPS)
    assert sorted(os.listdir(root)) == ["step%d" % s for s in range(STEPS)]
    ref = _reference(STEPS)
    for step in range(STEPS):
        (proc,) = _procs(root, step)
        assert os.path.basename(proc).startswith("proc")  # no process group: proc<PID>
        assert sorted(os.listdir(proc)) == ["construct.json", "dump.json", "stack.json"]
        dump = _load(proc, "dump.json")
        assert {k: dump[k] for k in ("task", "level", "framework", "dump_data_dir")} == {
            "task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None}
        data = dump["data"]
        expected = {"Module.%s.%s.0" % (m, d) for m in MODULES for d in ("forward", "backward")}
        expected |= {"Module.%s.parameters_grad.0" % m for m in WITH_PARAMS}
        assert set(data) == expected  # the root (Net) is not dumped
        keys = list(data)
        # A module's forward entry comes after its children's (hooks finish inside out).
        assert keys.index("Module.blocks.0.Block.forward.0") > keys.index(
            "Module.blocks.0.fc2.Linear.forward.0")
        fwd = data["Module.blocks.0.fc1.Linear.forward.0"]
        assert set(fwd) == {"input_args", "input_kwargs", "output", "parameters"}
        assert set(fwd["parameters"]) == {"weight", "bias"}
        assert set(data["Module.blocks.0.fc1.Linear.backward.0"]) == {"input", "output"}
        assert set(data["Module.head.Linear.parameters_grad.0"]) == {"weight", "bias"}
        for record in data.values():
            for t in _tensors(record):
                assert set(t) == TENSOR_KEYS, t
        # The values are those of the same training without msprobe.
        acts, grads = ref[step]
        for m in MODULES:
            path = m.rsplit(".", 1)[0]
            (out,) = data["Module.%s.forward.0" % m]["output"]
            _assert_stats(out, acts[path])
        for m in WITH_PARAMS:
            path = m.rsplit(".", 1)[0]
            for pname, (rec,) in data["Module.%s.parameters_grad.0" % m].items():
                _assert_stats(rec, grads["%s.%s" % (path, pname)])
        construct = _load(proc, "construct.json")
        assert set(construct) == {k for k in data if "parameters_grad" not in k}
        assert construct["Module.blocks.0.fc1.Linear.forward.0"] == \
            "Module.blocks.0.Block.forward.0"
        assert construct["Module.blocks.1.act.GELU.backward.0"] == \
            "Module.blocks.1.Block.backward.0"
        assert construct["Module.blocks.0.Block.forward.0"] is None
        stack = _load(proc, "stack.json")
        named = [n for names, _frames in stack.values() for n in names]
        assert "Module.embed.Linear.forward.0" in named
        frames = next(f for names, f in stack.values() if "Module.embed.Linear.forward.0" in names)
        assert any("msprobe_dump.py" in f and "in train_step" in f for f in frames), frames


def test_tensor_mix_files_and_api_entries(msprobe_dumps):
    root = msprobe_dumps("tensor", "mix", 1)
    (proc,) = _procs(root, 0)
    assert sorted(os.listdir(proc)) == ["construct.json", "dump.json", "dump_tensor_data",
                                        "stack.json"]
    dump = _load(proc, "dump.json")
    assert dump["task"] == "tensor" and dump["level"] == "mix"
    assert os.path.realpath(dump["dump_data_dir"]) == os.path.realpath(
        os.path.join(proc, "dump_tensor_data"))
    data = dump["data"]
    prefixes = {k.split(".")[0] for k in data}
    assert prefixes == {"Module", "Functional", "Tensor"}, prefixes
    for api in ("Functional.linear.0", "Functional.layer_norm.0", "Functional.gelu.1",
                "Functional.mse_loss.0", "Tensor.__add__.0"):
        assert api + ".forward" in data and api + ".backward" in data, api
    # An API's backward record is that of the autograd node that made its output: for
    # linear on a 3-D input, the view after the matmul (its input flattened: [24, 16]);
    # layer_norm's own node gives the gradients of input, weight and bias.
    shapes = lambda k: [[t["shape"] for t in data[k][io]] for io in ("input", "output")]
    assert shapes("Functional.linear.0.backward") == [
        [[md.BATCH, md.SEQ, md.D_MODEL]], [[md.BATCH * md.SEQ, md.D_MODEL]]]
    assert shapes("Functional.layer_norm.0.backward") == [
        [[md.BATCH, md.SEQ, md.D_MODEL]], [[md.BATCH, md.SEQ, md.D_MODEL], [md.D_MODEL],
                                          [md.D_MODEL]]]
    assert shapes("Module.blocks.0.fc1.Linear.backward.0") == [
        [[md.BATCH, md.SEQ, 2 * md.D_MODEL]], [[md.BATCH, md.SEQ, md.D_MODEL]]]
    # Every tensor has its file, and the file holds the tensor the record describes.
    files = set(os.listdir(os.path.join(proc, "dump_tensor_data")))
    named = set()
    for record in data.values():
        for t in _tensors(record):
            assert set(t) == TENSOR_KEYS | {"data_name"}, t
            assert t["data_name"] in files, t["data_name"]
            named.add(t["data_name"])
            saved = torch.load(os.path.join(proc, "dump_tensor_data", t["data_name"]))
            assert isinstance(saved, torch.Tensor) and not saved.requires_grad
            _assert_stats(t, saved)
    assert named == files
    assert "Module.blocks.0.fc1.Linear.forward.0.parameters.weight.pt" in files
    assert "Module.head.Linear.parameters_grad.0.bias.pt" in files
    # Functional.layer_norm(x, [16], weight, bias, eps): the list is index 1, no file.
    ln = data["Functional.layer_norm.0.forward"]["input_args"]
    assert ln[1] == [{"type": "int", "value": md.D_MODEL}] and ln[4]["type"] == "float"
    assert {"Functional.layer_norm.0.forward.input.%d.pt" % i for i in (0, 2, 3)} <= files
    # The saved module output is the very tensor of the training without msprobe.
    acts, _ = _reference(1)[0]
    saved = torch.load(os.path.join(proc, "dump_tensor_data",
                                    "Module.blocks.1.fc2.Linear.forward.0.output.0.pt"))
    assert torch.equal(saved, acts["blocks.1.fc2"])
    construct = _load(proc, "construct.json")
    assert construct["Functional.linear.1.forward"] == "Module.blocks.0.fc1.Linear.forward.0"
    assert construct["Tensor.__add__.0.forward"] == "Module.blocks.0.Block.forward.0"
    optimizer_calls = [k for k, v in construct.items() if v == "optimizer"]
    assert optimizer_calls and all(k.startswith("Tensor.") for k in optimizer_calls)


def test_statistics_L1_two_ranks(msprobe_dumps):
    root = msprobe_dumps("statistics", "L1", STEPS, ranks=2)
    for step in range(STEPS):
        procs = _procs(root, step)
        assert [os.path.basename(p) for p in procs] == ["rank0", "rank1"]
        data = [_load(p, "dump.json")["data"] for p in procs]
        assert set(data[0]) == set(data[1])
        assert not any(k.startswith("Module.") for k in data[0])  # L1: APIs only
        # one all_reduce per parameter per step (train_step averages the gradients)
        reduces = [k for k in data[0]
                   if k.startswith("Distributed.all_reduce.") and k.endswith(".forward")]
        assert len(reduces) == len(list(md.build_model().parameters()))
        # Each rank trained on its own data: the first layer's outputs differ, and after
        # the all_reduce both ranks hold the same gradient.
        outs = [d["Functional.linear.0.forward"]["output"][0]["Norm"] for d in data]
        assert outs[0] != outs[1]
        red = [d["Distributed.all_reduce.0.forward"]["output"][0] for d in data]
        assert red[0] == red[1]
    ranks_ref = [_reference(1, rank)[0] for rank in range(2)]
    data0 = [_load(p, "dump.json")["data"] for p in _procs(root, 0)]
    for rank in range(2):
        (out,) = data0[rank]["Functional.linear.0.forward"]["output"]
        _assert_stats(out, ranks_ref[rank][0]["embed"])
