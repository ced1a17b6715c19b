"""Real msprobe dumps for the tests (torch 2.x stack: mindstudio-probe is in its venv).

    from msprobe_dump import make_dump, build_model, batches, train_step
    root = make_dump(tmp_path, task="statistics", level="L0", steps=2)        # one process
    root = make_dump(tmp_path, task="tensor", level="mix", steps=2, ranks=2)  # gloo, 2 ranks
    # root/step0/rank0/dump.json, ... (layout: test_msprobe_dump.py's header)

make_dump runs msprobe's own PrecisionDebugger (``from msprobe.pytorch import
PrecisionDebugger``) around a few training steps of build_model() on the CPU, in child
processes of its own: msprobe wraps torch's functions and Tensor methods for the life of
the process and its debugger is a process-wide singleton, so it must not run inside
the pytest process (nor twice in one process with two configurations). The same model,
seed and data are importable here (build_model, batches, train_step), so a test can run
a live lockstep training of exactly what was dumped.

- task: "statistics" (Max/Min/Mean/Norm per tensor in dump.json) or "tensor" (the same,
  plus every tensor saved with torch.save under dump_tensor_data/);
- level: "L0" (modules), "L1" (APIs: Functional / Tensor / Torch / ...) or "mix" (both);
- steps: optimizer steps dumped (step0 .. step{steps-1});
- ranks: 1 (no process group: msprobe names the folder proc<PID>) or more (a gloo process
  group of that many processes: rank<R>); distributed=True gives a 1-rank group (rank0);
- gelu: the GELU approximation of every block ("none" or "tanh"), the one-layer change
  the interop tests use to make two runs differ; seed: the weights' seed.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist
from torch import nn

D_IN, D_MODEL, BATCH, SEQ = 8, 16, 4, 6


class Block(nn.Module):
    """Pre-norm residual MLP block: x + fc2(act(fc1(norm(x))))."""

    def __init__(self, d, gelu):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU(approximate=gelu)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Net(nn.Module):
    """embed -> blocks.0, blocks.1 -> head: nested modules (a ModuleList), as models are."""

    def __init__(self, gelu="none"):
        super().__init__()
        self.embed = nn.Linear(D_IN, D_MODEL)
        self.blocks = nn.ModuleList(Block(D_MODEL, gelu) for _ in range(2))
        self.head = nn.Linear(D_MODEL, 1)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x).squeeze(-1)


def build_model(seed=0, gelu="none"):
    torch.manual_seed(seed)
    return Net(gelu)


def batches(steps, rank=0, seed=0):
    """(x [BATCH, SEQ, D_IN], y [BATCH, SEQ]) per step, each rank its own data."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    out = []
    for _ in range(steps):
        x = torch.randn(BATCH, SEQ, D_IN, generator=g)
        out.append((x, x.sum(-1).tanh()))
    return out


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model, opt, batch):
    """One step as the dump ran it; returns the loss. In a process group the gradients
    are averaged over the ranks (all_reduce: a Distributed.* entry at level L1 / mix)."""
    loss = nn.functional.mse_loss(model(batch[0]), batch[1])
    loss.backward()
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world)
    opt.step()
    opt.zero_grad()
    return loss


def config(task, level, steps, dump_path):
    """msprobe's config.json for this dump (the keys its own template has)."""
    return {
        "task": task, "dump_path": str(dump_path), "rank": [], "step": list(range(steps)),
        "level": level,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                       "summary_mode": "statistics"},
        "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
    }


# The child: one rank's training under PrecisionDebugger, as msprobe's docs show its use.
_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {here!r})
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist
    from msprobe.pytorch import PrecisionDebugger
    import msprobe_dump as md
    rank = int(os.environ.get("RANK", "0"))
    if {distributed!r}:
        dist.init_process_group("gloo")
    model = md.build_model({seed!r}, {gelu!r})
    opt = md.make_optimizer(model)
    debugger = PrecisionDebugger(config_path={config_path!r})
    for batch in md.batches({steps!r}, rank, {seed!r}):
        debugger.start(model)
        md.train_step(model, opt, batch)
        debugger.stop()
        debugger.step()
    if {distributed!r}:
        dist.barrier()
        dist.destroy_process_group()
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_dump(tmp_path, task="statistics", level="L0", steps=2, ranks=1, distributed=None,
              gelu="none", seed=0, timeout=240):
    """Runs msprobe on build_model(seed, gelu) for `steps` steps in `ranks` processes;
    returns the dump's root folder (tmp_path/msprobe-<task>-<level>). Raises
    RuntimeError with msprobe's output when a process fails."""
    distributed = ranks > 1 if distributed is None else distributed
    root = os.path.join(str(tmp_path), "msprobe-%s-%s" % (task, level))
    os.makedirs(root, exist_ok=True)
    config_path = os.path.join(str(tmp_path), "msprobe-%s-%s.json" % (task, level))
    with open(config_path, "w") as f:
        json.dump(config(task, level, steps, root), f, indent=1)
    script = _CHILD.format(here=os.path.dirname(os.path.abspath(__file__)),
                           distributed=distributed, seed=seed, gelu=gelu,
                           config_path=config_path, steps=steps)
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), WORLD_SIZE=str(ranks))
    procs = []
    for rank in range(ranks):
        log = open(os.path.join(str(tmp_path), "msprobe-rank%d.log" % rank), "w+")
        procs.append((subprocess.Popen([sys.executable, "-c", script], stdout=log,
                                       stderr=subprocess.STDOUT, cwd=str(tmp_path),
                                       env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank))),
                      log))
    failed = []
    for proc, log in procs:
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.seek(0)
        if rc != 0:
            failed.append("exit %s:\n%s" % (rc, log.read()[-4000:]))
        log.close()
    if failed:
        raise RuntimeError("msprobe's dump failed: " + "\n".join(failed))
    return root
