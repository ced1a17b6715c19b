"""The torch bridge (lockstep._bridge, lockstep/_torch_bridge.cc): what it reads of each
kind of tensor is what the tensor's Python attributes say, a training records the same
values with and without it, and a missing, refused or broken bridge changes nothing but
the speed.

The build tree has a bridge for each torch stack (agent/python/CMakeLists.txt builds
them with `python -m lockstep build-bridge`); a test that needs one skips without it.
"""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from lockstep import _bridge, _core, _watch  # noqa: F401  (_watch installs the bridge)
from conftest import fake_monitor

HAS_BRIDGE = _bridge.find(torch) is not None
needs_bridge = pytest.mark.skipif(not HAS_BRIDGE, reason="no torch bridge built for this torch")


@pytest.fixture
def bridge_on():
    """The bridge set in _core for the test, and set back as it was after it."""
    path = _bridge.install()
    if path is None:
        pytest.skip("no torch bridge built for this torch")
    yield path
    _bridge.install()


def _python_facts(t):
    try:
        version = t._version
    except RuntimeError:  # an inference tensor
        version = None
    return dict(is_cpu=t.is_cpu, dtype=t.dtype, data_ptr=t.data_ptr(), numel=t.numel(),
                version=version, is_contiguous=t.is_contiguous(),
                strided=t.layout == torch.strided, shape=tuple(t.shape), stride=t.stride())


class _Sub(torch.Tensor):
    pass


def _tensors():
    """(what, tensor) of the kinds a recorder meets."""
    base = torch.randn(4, 6, 8)
    out = [("contiguous", base), ("transposed", base.transpose(0, 2)),
           ("sliced", base[1:3, ::2]), ("0-d", torch.tensor(3.5)),
           ("empty", torch.empty(0, 5)), ("expanded", torch.randn(1, 6).expand(4, 6)),
           ("channels_last", torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)),
           ("bf16", torch.randn(7, dtype=torch.bfloat16)),
           ("fp16", torch.randn(7, dtype=torch.float16)), ("int64", torch.arange(9)),
           ("parameter", torch.nn.Parameter(torch.randn(3, 3))),
           ("12 dims", torch.randn(*([1] * 11 + [2])))]
    changed = torch.zeros(5)
    changed += 1
    changed.mul_(2)
    out.append(("changed in place", changed))
    leaf = torch.randn(3, requires_grad=True)
    out.append(("graph output", leaf * 2))
    with torch.inference_mode():
        out.append(("inference", torch.ones(4)))
    return out


@needs_bridge
@pytest.mark.parametrize("what", [w for w, _ in _tensors()])
def test_facts_are_the_python_attributes(bridge_on, what):
    t = dict(_tensors())[what]
    facts = _core._bridge_facts(t)
    assert facts is not None, "the bridge left a plain CPU tensor to Python"
    assert facts == _python_facts(t)


@needs_bridge
def test_what_it_leaves_to_python(bridge_on):
    """Anything but a plain strided tensor with storage: a subclass (its attributes may
    be Python), sparse, more than 12 dimensions, not a tensor at all. A tensor off the
    CPU: only is_cpu and dtype."""
    assert _core._bridge_facts(torch.randn(3).as_subclass(_Sub)) is None
    assert _core._bridge_facts(torch.randn(3, 3).to_sparse()) is None
    assert _core._bridge_facts(torch.randn(*([1] * 13))) is None
    assert _core._bridge_facts([1.0]) is None
    assert _core._bridge_facts(None) is None
    meta = torch.empty(3, device="meta")
    assert _core._bridge_facts(meta) == dict(is_cpu=False, dtype=torch.float32)


def test_off_means_python():
    _core.set_torch_bridge(None)
    try:
        assert _core._bridge_facts(torch.randn(3)) is None
    finally:
        _bridge.install()


def test_the_abi_is_the_one_of_the_folder_name():
    assert _bridge.ABI == _core.TORCH_BRIDGE_ABI
    assert _bridge.key(torch).endswith("-abi%d" % _core.TORCH_BRIDGE_ABI)


def test_a_capsule_of_something_else_is_refused():
    import datetime  # its C API capsule: a real capsule of another name
    with pytest.raises(ValueError):
        _core.set_torch_bridge(datetime.datetime_CAPI)


class _Net(torch.nn.Module):
    """What moves the recorder's paths: BatchNorm then an in-place ReLU (a record
    changed in place after it), a transposed output (strided), a module called twice, a
    tuple output, parameter gradients."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.relu = torch.nn.ReLU(inplace=True)
        self.shared = torch.nn.Linear(8, 8)
        self.gru = torch.nn.GRU(8, 8, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.relu(self.bn(self.lin(x)))
        h = self.shared(self.shared(h))
        seq, _ = self.gru(h.unsqueeze(1).expand(-1, 3, -1).contiguous())
        return self.head(seq.transpose(0, 1)[-1])


def _train(worker, steps=3):
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon, fake = fake_monitor(worker=worker)
    mon.watch(model)
    x, y = torch.randn(6, 8), torch.randint(0, 3, (6,))
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if worker:
            fake.run_jobs()
        opt.step()
        opt.zero_grad()
        mon.step(loss=loss)
    mon.close()
    counters = {k: getattr(mon._rec, k) for k in
                ("records", "repeats", "skipped", "failed", "threaded", "changed_in_flight")}
    return fake.records, counters


@needs_bridge
@pytest.mark.parametrize("worker", [False, True], ids=["inline", "thread"])
def test_a_training_records_the_same_with_and_without(bridge_on, worker):
    with_bridge = _train(worker)
    _core.set_torch_bridge(None)
    without = _train(worker)
    assert len(with_bridge[0]) > 50
    assert with_bridge == without


def _isolated(tmp_path, monkeypatch):
    """_bridge looks only in tmp_path (not the build tree's bridges)."""
    root = str(tmp_path / "bridges")
    monkeypatch.setattr(_bridge, "roots", lambda: [root])
    return os.path.join(root, _bridge.key(torch))


def test_none_built_is_said_and_changes_nothing(tmp_path, monkeypatch):
    _isolated(tmp_path, monkeypatch)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _bridge.install() is None
        assert "none built for torch %s" % torch.__version__ in _bridge.status()
        assert _core._bridge_facts(torch.randn(2)) is None
    finally:
        monkeypatch.undo()
        _bridge.install()


def test_a_broken_bridge_is_one_warning(tmp_path, monkeypatch):
    folder = _isolated(tmp_path, monkeypatch)
    os.makedirs(folder)
    with open(os.path.join(folder, _bridge.filename()), "w") as f:
        f.write("not a shared object")
    try:
        with pytest.warns(RuntimeWarning, match="does not load"):
            assert _bridge.install() is None
        assert "does not load" in _bridge.status()
        assert _core._bridge_facts(torch.randn(2)) is None
    finally:
        monkeypatch.undo()
        _bridge.install()


def test_off_by_environment(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_TORCH_BRIDGE", "off")
    try:
        assert _bridge.install() is None
        assert _bridge.status() == "off (LOCKSTEP_TORCH_BRIDGE)"
    finally:
        monkeypatch.undo()
        _bridge.install()


def test_a_failed_build_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(RuntimeError, match="does not compile"):
        _bridge.build(str(tmp_path))
    assert os.listdir(os.path.join(str(tmp_path), _bridge.key(torch))) == []  # no leftovers


@needs_bridge
def test_it_refuses_another_torch():
    """Loaded under a torch whose version is not the one it was built for: ImportError,
    before its table can be used (a fresh process: an extension loads once)."""
    code = textwrap.dedent("""
        import torch
        from lockstep import _bridge
        path = _bridge.find(torch)
        torch.__version__ = "0.0.1"
        try:
            _bridge._load(path)
        except ImportError as e:
            print("refused:", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=120,
                       env=dict(os.environ, LOCKSTEP_TORCH_BRIDGE="off"))  # not loaded before
    assert "refused: lockstep's torch bridge was built for torch %s, not this torch 0.0.1" \
        % torch.__version__ in r.stdout, r.stdout


# ---- gradient hooks in C++ (torch >= 2.0) ----------------------------------------------

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
needs_cxx_hooks = pytest.mark.skipif(not (HAS_BRIDGE and TORCH2),
                                     reason="C++ gradient hooks: a bridge on torch >= 2.0")


@needs_bridge
@pytest.mark.skipif(TORCH2, reason="torch 1.13 only")
def test_no_cxx_gradient_hooks_on_torch1(bridge_on):
    """torch < 2.0 keeps a tensor's hooks on its first graph node: the agent's own path."""
    x = torch.randn(3, requires_grad=True) * 2
    assert not _core.bridge_add_grad_hook(x, lambda g: None)


@needs_cxx_hooks
def test_a_cxx_gradient_hook_sees_what_register_hook_sees(bridge_on):
    leaf = torch.randn(4, requires_grad=True)
    seen, theirs = [], []
    out = leaf * 3
    assert _core.bridge_add_grad_hook(out, seen.append)
    out.register_hook(theirs.append)
    assert out._backward_hooks is not None  # theirs; ours is not in the dict
    (out * torch.arange(4.0)).sum().backward()
    assert len(seen) == 1 and torch.equal(seen[0], theirs[0])
    assert torch.equal(seen[0], torch.arange(4.0))
    assert torch.equal(leaf.grad, 3 * torch.arange(4.0))  # the gradient is not changed


@needs_cxx_hooks
def test_after_a_users_hook_the_agent_keeps_to_the_hook_dict(bridge_on):
    """A tensor that has a user's hook before the agent's (registered in the module's
    forward): torch runs a node's hook dict where the dict was made, so a C++ hook would
    run after the user's later hooks too. The agent's hook goes in the dict there, in
    registration order (test_tensor_hooks.py has the order)."""
    y = torch.ones(3, requires_grad=True) * 2
    y.register_hook(lambda g: None)
    n = len(y._backward_hooks)
    _watch._add_hook(y, lambda g: None)
    assert len(y._backward_hooks) == n + 1
    z = torch.ones(3, requires_grad=True) * 2
    _watch._add_hook(z, lambda g: None)
    assert z._backward_hooks is None  # C++


@needs_cxx_hooks
def test_a_cxx_gradient_hook_before_an_inplace_change(bridge_on):
    """Registered before `out.mul_(2)`: the gradient of the value before it, as a hook
    register_hook put there (both stay on the node they were registered on)."""
    leaf = torch.randn(3, requires_grad=True)
    out = leaf + 1
    seen, theirs = [], []
    assert _core.bridge_add_grad_hook(out, seen.append)
    out.register_hook(theirs.append)
    out.mul_(2)
    out.sum().backward()
    assert torch.equal(seen[0], theirs[0]) and torch.equal(seen[0], torch.full((3,), 2.0))


@needs_cxx_hooks
def test_what_a_cxx_gradient_hook_refuses(bridge_on):
    fn = lambda g: None  # noqa: E731
    assert not _core.bridge_add_grad_hook(torch.randn(3), fn)  # no grad
    # A leaf: torch keeps its C++ and Python hooks in one list that either kind's
    # registration clears.
    assert not _core.bridge_add_grad_hook(torch.randn(3, requires_grad=True), fn)
    sub = (torch.randn(3, requires_grad=True) * 2).as_subclass(_Sub)
    assert not _core.bridge_add_grad_hook(sub, fn)
    assert not _core.bridge_add_grad_hook("tensor", fn)


@needs_cxx_hooks
def test_an_exception_in_a_cxx_gradient_hook_reaches_backward(bridge_on):
    def boom(_g):
        raise KeyboardInterrupt  # not an Exception: the hooks let it through

    out = torch.randn(3, requires_grad=True) * 2
    assert _core.bridge_add_grad_hook(out, boom)
    with pytest.raises(KeyboardInterrupt):
        out.sum().backward()


@needs_cxx_hooks
def test_a_cxx_gradient_hook_lets_go_of_its_callable(bridge_on):
    import gc
    import weakref

    class Fn:
        calls = 0

        def __call__(self, g):
            Fn.calls += 1

    fn = Fn()
    ref = weakref.ref(fn)
    out = torch.randn(3, requires_grad=True) * 2
    assert _core.bridge_add_grad_hook(out, fn)
    del fn
    out.sum().backward()
    assert Fn.calls == 1
    del out
    gc.collect()
    assert ref() is None


@needs_cxx_hooks
def test_a_watched_training_hooks_outputs_in_cxx(bridge_on):
    """With the bridge, the C forward hooks put no Python hook dict on the outputs they
    hook: the gradient hooks are C++. Without it, they do."""
    def dicts():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
        mon, fake = fake_monitor()
        mon.watch(model)
        outs = []
        model[1].register_forward_hook(lambda m, i, o: outs.append(o))  # after lockstep's
        for _ in range(2):  # the first step's forward hooks take their Python path
            outs.clear()
            loss = model(torch.randn(3, 4)).sum()
            loss.backward()
            mon.step(loss=loss)
        mon.close()
        assert "0" in fake.names("act_grad") and "1" in fake.names("act_grad")
        return outs[0]._backward_hooks

    assert dicts() is None
    _core.set_torch_bridge(None)
    assert dicts() is not None
