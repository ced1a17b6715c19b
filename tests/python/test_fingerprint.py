"""The run fingerprint (docs/python.md "Run fingerprint"): what watch() sends, what the
first forward adds, and that nothing in it can reach the training loop."""
import warnings

import pytest
import torch
from torch import nn

import lockstep
from conftest import fake_monitor


class Broken(nn.Module):
    """A module whose extra_repr raises: its settings are left out, nothing else."""

    def extra_repr(self):
        raise RuntimeError("no repr for you")

    def forward(self, x):
        return x


def model():
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(p=0.25), nn.LayerNorm(8, eps=1e-6), Broken(),
                         nn.Linear(8, 1))


def test_watch_sends_versions_settings_optimizer_modules_env_and_config(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setenv("MY_KNOB", "7")
    monkeypatch.setenv("LOCKSTEP_FINGERPRINT_ENV", "MY_KNOB, UNSET_KNOB")
    lockstep.seed_all(42, deterministic=False)
    mon, fake = fake_monitor(config={"batch_size": 8, "data": {"path": "/d", "shuffle": True}})
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    mon.watch(m, optimizer=opt)
    fp = fake.fingerprint
    assert fp["version.torch"] == torch.__version__
    assert fp["version.python"].count(".") == 2
    assert fp["device.platform"] == "cpu" and fp["dist.world_size"] == "1"
    assert fp["seed.value"] == "42" and fp["seed.deterministic"] == "False"
    assert fp["det.deterministic_algorithms"] in ("True", "False")
    assert fp["math.float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert fp["optim.type"] == "AdamW"
    assert fp["optim.group0.lr"] == "0.0003" and fp["optim.group0.weight_decay"] == "0.1"
    assert fp["optim.group0.betas"] == "(0.9, 0.95)"
    assert fp["optim.group0.params"] == str(sum(p.numel() for p in m.parameters()))
    assert fp["module.type"] == "Sequential"
    assert fp["module.0.type"] == "Linear" and fp["module.0.in_features"] == "4"
    assert fp["module.0.weight"] == "float32[8, 4]" and fp["module.0.bias"] == "float32[8]"
    assert fp["module.1.p"] == "0.25" and fp["module.1.inplace"] == "False"
    assert fp["module.2.arg0"] == "(8,)" and fp["module.2.eps"] == "1e-06"
    assert fp["module.3.type"] == "Broken" and not [k for k in fp if k.startswith("module.3.")
                                                     and k != "module.3.type"]
    assert fp["dtype.params"] == "float32:6"
    assert fp["env.CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and fp["env.MY_KNOB"] == "7"
    assert "env.UNSET_KNOB" not in fp
    assert fp["config.batch_size"] == "8" and fp["config.data.path"] == "/d"
    assert fp["config.data.shuffle"] == "True"
    assert "amp" not in fp  # read at the first forward
    assert mon.counters()["python_errors"] == 0
    mon.close(timeout=1.0)


def test_the_step_the_optimizer_was_read_at_is_sent_with_it():
    """A resumed job (start_step=4, scheduler state loaded before watch) sends the lr of
    step 4 and says so: the collector then leaves scheduled values to the scalars rule."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(4):
        opt.step()
        sched.step()
    mon, fake = fake_monitor(start_step=4)
    mon.watch(m, optimizer=opt)
    fp = fake.fingerprint
    assert fp["fingerprint.step"] == "4"
    assert fp["optim.group0.lr"] == "0.025" and fp["optim.group0.initial_lr"] == "0.1"
    mon.close(timeout=1.0)
    # Without an optimizer there are no values of a step to qualify.
    mon, fake = fake_monitor(start_step=4)
    mon.watch(m)
    assert "fingerprint.step" not in fake.fingerprint
    mon.close(timeout=1.0)


def test_a_wrapped_model_has_the_keys_of_the_model_it_wraps():
    """DDP and DataParallel hold the model as `.module`; torch.compile, FSDP and
    checkpoint wrappers insert a component. The keys are those of the bare model (the
    collector names tensors without these components too), not `module.module.0.type`."""
    bare = model()

    class CheckpointWrapper(nn.Module):  # torch's, as far as names go
        def __init__(self, m):
            super().__init__()
            self._checkpoint_wrapped_module = m

    def module_keys(m):
        mon, fake = fake_monitor()
        mon.watch(m)
        mon.close(timeout=1.0)
        return {k: v for k, v in fake.fingerprint.items() if k.startswith("module") or k == "dtype.params"}

    want = module_keys(bare)
    assert want["module.type"] == "Sequential" and want["module.0.type"] == "Linear"
    assert module_keys(nn.DataParallel(bare)) == want
    wrapped = model()
    wrapped[4] = CheckpointWrapper(wrapped[4])
    assert module_keys(wrapped) == want


def test_settings_extra_repr_leaves_out_at_their_default_are_read_from_the_module():
    """ReLU() prints no `inplace`, ReLU(inplace=True) prints `inplace=True`; a Conv2d
    prints `padding` only when it is not 0. Both runs show a value, never "(absent)"."""
    def keys(*modules):
        mon, fake = fake_monitor()
        mon.watch(nn.Sequential(*modules))
        mon.close(timeout=1.0)
        return fake.fingerprint

    default = keys(nn.ReLU(), nn.Conv2d(3, 4, 3), nn.SiLU())
    changed = keys(nn.ReLU(inplace=True), nn.Conv2d(3, 4, 3, padding=1, groups=1), nn.SiLU(inplace=True))
    for fp, inplace, padding in ((default, "False", "(0, 0)"), (changed, "True", "(1, 1)")):
        assert fp["module.0.inplace"] == inplace and fp["module.2.inplace"] == inplace
        assert fp["module.1.padding"] == padding and fp["module.1.groups"] == "1"
        assert fp["module.1.dilation"] == "(1, 1)" and fp["module.1.padding_mode"] == "zeros"
    assert {k for k in default if k.startswith("module.")} == {k for k in changed if k.startswith("module.")}


def test_first_forward_adds_the_autocast_state_and_records_inputs_and_initial_weights():
    mon, fake = fake_monitor()
    m = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    mon.watch(m)
    # Not distributed yet (no process group, no RANK): the rank is pending, and the
    # initial weights wait for the first forward, still before the first update.
    assert mon._ident.pending
    w = m[0].weight.detach().double().clone()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(ids.float())
    out.float().sum().backward()
    opt.step()
    mon.step(loss=1.0)
    init = [r for r in fake.records if r["kind"] == "param"]
    assert [r["name"] for r in init] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert all(r["step"] == 0 for r in init)
    assert init[0]["stats"]["l2"] == pytest.approx(w.norm().item(), rel=1e-6)
    assert init[0]["stats"]["l2"] != pytest.approx(m[0].weight.detach().double().norm().item(), rel=1e-6)
    assert fake.fingerprint["amp"] == "bfloat16"
    inputs = [r for r in fake.records if r["kind"] == "input"]
    assert [r["name"] for r in inputs] == ["input[0]"] and inputs[0]["step"] == 0
    assert inputs[0]["stats"]["mean"] == pytest.approx(2.5)
    mon.close(timeout=1.0)


def test_initial_weights_go_at_watch_when_the_rank_is_known():
    mon, fake = fake_monitor(rank=-1)  # not distributed: nothing pending
    m = nn.Linear(3, 2)
    mon.watch(m)
    assert [r["name"] for r in fake.records if r["kind"] == "param"] == ["weight", "bias"]
    m(torch.randn(2, 3)).sum().backward()
    mon.step()
    assert len([r for r in fake.records if r["kind"] == "param"]) == 2  # once only
    mon.close(timeout=1.0)


def test_integer_inputs_are_recorded_as_float():
    mon, fake = fake_monitor()
    emb = nn.Embedding(10, 4)
    mon.watch(emb)
    emb(torch.tensor([[3, 4, 5]])).sum().backward()
    mon.step()
    rec = [r for r in fake.records if r["kind"] == "input"]
    assert len(rec) == 1 and rec[0]["stats"]["mean"] == pytest.approx(4.0)
    assert rec[0]["stats"]["max"] == 5.0
    mon.close(timeout=1.0)


def test_config_must_be_a_dict():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = lockstep.Monitor(run="unit", endpoint="tcp://127.0.0.1:9", config=["lr", 1])
    assert not mon.enabled
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1, msgs
    assert "config=['lr', 1] is not valid: give a dict" in msgs[0], msgs
    assert "records nothing" in msgs[0], msgs
    with pytest.raises(ValueError, match=r"config='lr=1' is not valid: give a dict"):
        lockstep.Monitor(run="unit", endpoint="tcp://127.0.0.1:9", config="lr=1", strict=True)


def test_config_values_that_cannot_be_read_are_left_out(monkeypatch):
    class Raises:
        def __str__(self):
            raise RuntimeError("hostile")

    mon, fake = fake_monitor(config={"good": 1, "bad": Raises(), "fn": len, "none": None})
    mon.watch(nn.Linear(2, 2))
    fp = fake.fingerprint
    assert fp["config.good"] == "1" and fp["config.none"] == "None"
    assert "config.bad" not in fp
    assert fp["config.fn"].startswith("<built-in function len")  # a callable is a value, not called
    assert mon.counters()["python_errors"] == 0


def test_a_transformers_config_is_recorded_once_with_its_attention_kernel():
    """A Hugging Face model's configuration (the `config` its modules share) is in the
    fingerprint once, at the module that holds it first, with the attention kernel
    (eager / sdpa), which no module's extra_repr prints; its version goes with the
    versions. Torch 2.x stack only (Debian's has no transformers)."""
    hf_models = pytest.importorskip("hf_models")
    if not hf_models.available():
        pytest.skip("transformers is not installed (the torch 2.x stack has it)")
    fps = {}
    for impl in ("eager", "sdpa"):
        mon, fake = fake_monitor()
        mon.watch(hf_models.llama(seed=0, attn_implementation=impl, rms_norm_eps=1e-5))
        fps[impl] = fake.fingerprint
        assert mon.counters()["python_errors"] == 0
        mon.close(timeout=1.0)
    fp = fps["eager"]
    assert fp["module.config.attn_implementation"] == "eager"
    assert fps["sdpa"]["module.config.attn_implementation"] == "sdpa"
    assert fp["module.config.rms_norm_eps"] == "1e-05"
    assert fp["module.config.hidden_act"] == "silu"
    assert fp["version.transformers"] == __import__("transformers").__version__
    # Once: the submodules that share the model's config add nothing.
    assert not [k for k in fp if ".config." in k and not k.startswith("module.config.")]
    differ = sorted(k for k in fp if fp[k] != fps["sdpa"].get(k))
    assert differ == ["module.config.attn_implementation"], differ
