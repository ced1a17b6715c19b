"""The live view and `compare` after a NaN, against a real collector fed by real torch
loops: a NaN made in one tensor of the candidate at step S reaches every tensor at the
next step. `lockstep top --once --width 80` lists the producer first (not the forward
tensor that comes first in execution order), KIND whole, times in ms, the candidate's
loss as NaN; a solo run that passes no loss shows "-". `compare` prints the NaN loss."""
import json
import os
import re
import subprocess
import time

import torch

import lockstep
from scenario_lib import Collector, TinyTransformer, batches, make_pair, train_pair

S = 3
STEPS = 7
PRODUCER = "encoder.layers.0.linear1"


def top_once(col, view_ep):
    out = subprocess.run([col.exe, "top", "--once", "--width", "80", "--connect", view_ep],
                         capture_output=True, text=True, timeout=30, env={**os.environ, "LANG": "C"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_top_and_compare_after_a_nan(tmp_path):
    state = {"step": 0}

    def inject(run):
        def hook(_m, _i, out):
            if state["step"] != S:
                return None
            poison = torch.zeros_like(out)
            poison[0, 3, 5] = float("nan")
            return out + poison
        run.model.encoder.layers[0].linear1.register_forward_hook(hook)

    with Collector(tmp_path, extra_args=["--view-listen", "tcp://127.0.0.1:*"]) as col:
        with open(os.path.join(str(tmp_path), "ready.json"), encoding="utf-8") as f:
            view_ep = json.load(f)["view"]
        b, c = make_pair(col.endpoint, "nanview", candidate_kwargs={"prepare": inject})
        # A solo run that never passes a loss: its LOSS column is "-", not NaN.
        solo_model = TinyTransformer()
        solo = lockstep.Monitor(run="noloss-solo", role="solo", experiment="other",
                                endpoint=col.endpoint, strict=True)
        solo.watch(solo_model)
        for x, _y in batches(2):
            solo_model(x).sum().backward()
            solo.step()
        train_pair(b, c, STEPS, before_candidate_step=lambda s: state.update(step=s))
        assert c.losses[S] != c.losses[S]  # the NaN reached the loss

        # Poll until the view has compared the last step.
        deadline = time.monotonic() + 20
        text = ""
        while time.monotonic() < deadline:
            text = top_once(col, view_ep)
            if re.search(r"PAIR nanview: \S+ vs \S+\s+step %d" % (STEPS - 1), text) and "noloss-solo" in text:
                break
            time.sleep(0.1)
        assert solo.close(timeout=10.0)
        assert b.close() and c.close()
        col.wait_goodbye(["nanview-base", "nanview-cand"])

    lines = text.splitlines()
    assert all(len(l) <= 80 for l in lines), text
    # The producer first, pinned, although every tensor is non-finite by now.
    hdr = next(i for i, l in enumerate(lines) if l.lstrip().startswith("NAME") and " KIND " in l)
    first_row = lines[hdr + 1]
    assert "linear1" in first_row and "producer" in first_row, text
    assert "first NaN/Inf: step %d in %s (act)" % (S, PRODUCER) in text, text
    rows = lines[hdr + 1:hdr + 11]
    assert sum("nonfinite" in r for r in rows) >= 5, text
    # KIND is never cut ("param_gra"): each row's kind is a whole kind name.
    kinds = {"act", "act_grad", "act_in", "param_grad", "param", "optim", "loss", "input"}
    assert all(r.split()[1] in kinds for r in rows if r.strip()), text
    # Times in ms, whole: no "7.8e-0".
    run_rows = {l.split()[0]: l for l in lines if l.startswith(("nanview-", "noloss-"))}
    assert set(run_rows) >= {"nanview-base", "nanview-cand", "noloss-solo"}, text
    for r in run_rows.values():
        assert re.search(r"\d(\.\d+)?(ms|s)\s", r + " "), r
        assert "e-0" not in r, r
    # Loss: NaN for the candidate, a number for the baseline, "-" for the run without one.
    assert run_rows["nanview-cand"].split()[-1] == "NaN", text
    assert re.match(r"^\d", run_rows["nanview-base"].split()[-1]), text
    assert run_rows["noloss-solo"].split()[-1] == "-", text
    assert re.search(r"loss baseline \S+\s+candidate NaN", text), text

    # The alert says NaN too.
    nonfinite = [a for a in col.alerts() if a["rule"] == "nonfinite" and a["step"] == S]
    assert nonfinite and "the loss is NaN too" in nonfinite[0]["message"], nonfinite

    out = subprocess.run([col.exe, "compare", col.log_path("nanview-base"), col.log_path("nanview-cand")],
                         capture_output=True, text=True, timeout=60)
    m = re.search(r"loss at the last compared step: (\S+) vs (\S+)", out.stdout)
    assert m, out.stdout + out.stderr
    assert m.group(2) == "NaN" and m.group(1) not in ("-", "NaN"), out.stdout
