"""The load harness of load_bench.py, short (8 agents x 200 tensors x 5 steps/s for
10 s: 8,040 records/s), so CI runs the harness itself: real collector, real loadgens,
the same zero-loss accounting (load_lib.check_zero_loss) as the 2-minute bench."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_lib  # noqa: E402


def test_paced_load_arrives_without_loss(tmp_path):
    r = load_lib.run_load(agents=8, tensors=200, rate=5, seconds=10, work_dir=str(tmp_path))
    assert r["problems"] == []
    steps = 50
    assert r["records_attempted"] == 8 * (200 + 1) * steps
    assert r["records_logged"] == r["records_attempted"] and r["lost_records"] == 0
    assert sorted(r["summaries"]) == sorted(
        (run, rank) for run, _ in load_lib.RUNS for rank in range(4))
    # The pacing is real: 50 steps at 5/s take about 10 s, not as fast as possible.
    assert all(a["seconds"] >= 9.7 for a in r["agents_out"]), [a["seconds"] for a in r["agents_out"]]
    # The aligner compared every (rank, step) of the pair; nothing was evicted.
    assert (r["pair_compared_steps"], r["pair_evicted_steps"]) == (4 * steps, 0)
    assert len(r["samples"]) >= 8 and r["rss_first_mib"] > 0


def test_a_lost_message_is_reported():
    # The accounting can fail: a log one message short, with a gap, is named.
    a = {"attempts": 400, "records_sent": 400, "messages_sent": 5, "refused": 0,
         "records_dropped": 0, "messages_dropped": 0, "other_dropped": 0, "errors": 0,
         "closed": True}
    labels = frozenset({("run", "load-base"), ("rank", "0")})
    metrics = {("lockstep_rank_records_total", labels): 402.0,
               ("lockstep_rank_finished", labels): 1.0}
    s = {"stat_records": 400, "scalar_records": 2, "messages": 5, "first_seq": 0, "last_seq": 4,
         "gaps": 0, "duplicates": 0, "bad_messages": 0, "agent_records_dropped": 0,
         "agent_messages_dropped": 0, "goodbye": True}
    key = ("load-base", 0)
    assert load_lib.check_zero_loss({key: a}, metrics, {key: s}, steps=2) == []
    lossy = dict(s, stat_records=200, messages=4, gaps=1)
    problems = load_lib.check_zero_loss({key: a}, metrics, {key: lossy}, steps=2)
    assert any("200 tensor" in p for p in problems)
    assert any("gaps=1" in p for p in problems)
