"""An fp32 run whose values grow past fp16's range (encoder.layers.0.linear1's output
is scaled by 100**step): `overflow` warns at the first step a value exceeds 65504 —
when this tensor would overflow in an fp16 run — and before any NaN/Inf shows up,
which here happens many steps later when the values pass fp32's own range."""
import torch

from scenario_lib import Collector, fmt_alerts, make_pair, run_of, train_pair

FP16_MAX = 65504.0
TENSOR = "encoder.layers.0.linear1"
STEPS = 24


def test_overflow_warns_before_any_nan(tmp_path):
    state = {"step": 0}
    absmax = {}  # step -> the tensor's absmax as lockstep records it

    def inject(run):
        def hook(_m, _i, out):
            out = out * (100.0 ** state["step"])
            absmax[state["step"]] = out.detach().abs().max().item()
            return out
        run.model.encoder.layers[0].linear1.register_forward_hook(hook)

    with Collector(tmp_path) as col:
        b, c = make_pair(col.endpoint, "ovf", candidate_kwargs={"prepare": inject})
        train_pair(b, c, STEPS, before_candidate_step=lambda s: state.update(step=s))
        assert b.close() and c.close()
        col.wait_goodbye(["ovf-base", "ovf-cand"])
    alerts = [a for a in col.alerts() if run_of(a) == "ovf-cand"]
    text = fmt_alerts(alerts)
    past_fp16 = min(s for s, v in absmax.items() if v > FP16_MAX)
    nonfinite_steps = [s for s, v in absmax.items() if not torch.isfinite(torch.tensor(v))]
    assert nonfinite_steps, "the scenario must end in Inf/NaN: %s" % absmax
    overflow = [a for a in alerts if a["rule"] == "overflow"]
    assert overflow, text
    first = min(overflow, key=lambda a: (a["step"], a.get("id", "")))
    assert first["step"] == past_fp16, (past_fp16, text)
    assert TENSOR in {a["tensor"] for a in overflow if a["step"] == past_fp16}, text
    nonfinite = [a for a in alerts if a["rule"] == "nonfinite"]
    assert nonfinite, text  # the blow-up is reported too...
    # ...and the warning came first, by many steps
    assert first["step"] < min(a["step"] for a in nonfinite) <= min(nonfinite_steps), text
