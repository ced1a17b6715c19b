"""A NaN injected into one tensor of the candidate at step S (one element of
encoder.layers.0.linear1's output): `nonfinite` fires at step S and names that tensor,
the producer, not the dozens of tensors downstream that the NaN reaches."""
import torch

from scenario_lib import Collector, fmt_alerts, make_pair, run_of, train_pair

S = 4
STEPS = 7
PRODUCER = "encoder.layers.0.linear1"


def test_nan_is_reported_at_its_step_naming_the_producer(tmp_path):
    state = {"step": 0}

    def inject(run):
        # Registered before watch(): lockstep's hook sees the output this hook returns.
        def hook(_m, _i, out):
            if state["step"] != S:
                return None
            poison = torch.zeros_like(out)
            poison[0, 3, 5] = float("nan")
            return out + poison
        run.model.encoder.layers[0].linear1.register_forward_hook(hook)

    with Collector(tmp_path) as col:
        b, c = make_pair(col.endpoint, "nan", candidate_kwargs={"prepare": inject})
        train_pair(b, c, STEPS, before_candidate_step=lambda s: state.update(step=s))
        assert b.losses[:S] == c.losses[:S]
        assert c.losses[S] != c.losses[S]  # the NaN reached the loss
        assert b.close() and c.close()
        col.wait_goodbye(["nan-base", "nan-cand"])
    alerts = col.alerts()
    text = fmt_alerts(alerts)
    nonfinite = [a for a in alerts if a["rule"] == "nonfinite"]
    assert nonfinite, text
    first = min(nonfinite, key=lambda a: a["step"])
    assert first["step"] == S, text
    assert first["tensor"] == PRODUCER and first["kind"] == "act", text
    assert run_of(first) == "nan-cand" and first["severity"] == "critical", text
    assert all(run_of(a) == "nan-cand" for a in nonfinite), text  # the baseline is clean
    assert all(a["step"] >= S for a in alerts), text
