"""The collector's requests (the control channel, docs/design.md "The control channel").

The agent's sender thread takes the requests published for this run and rank off the
control socket, each id once, and answers "received"; Monitor.step() asks whether any
wait (one relaxed load: a step without a request pays nothing more) and acts on them
here, between steps, then answers "done" (with what was done) or "refused" (with why).

- ``zoom``: Monitor.zoom(target, steps) from the request's step (both runs get the same
  step, so their calls pair), or the step about to start when that one is past;
- ``capture``: Monitor.capture(target, step); the answer names the file it will write,
  and once it is written the capture's writer thread replays it against float64 and
  answers again with the result (lockstep._self_replay);
- ``sample``: tensors every ``steps``-th step (step % k == 0, 1 = every step) from the
  request's step on, or the step about to start when that one is past (both runs record
  the same steps whatever step they act at); watch(every=N) stays the floor (the stride
  is rounded up to a multiple of N). The collector's --sample-quiet asks for it.

Runs on the training thread; nothing here raises into the job.
"""
from lockstep import _capture_file
from lockstep._names import call_name


def act(monitor, requests, step):
    """Acts on `requests` ([(id, action, target, step, steps)]) before `step` starts."""
    agent = monitor._agent
    for rid, action, target, at, steps in requests:
        try:
            status, detail, when = _one(monitor, rid, action, target, at, steps, step)
        except Exception as e:  # pylint: disable=broad-except  (never into the job)
            status, detail, when = "refused", "%s: %s" % (type(e).__name__, e), 0
        agent.acknowledge(rid, status, when, detail[:1000])


def _one(monitor, rid, action, target, at, steps, step):
    first = max(at, step)
    if action == "zoom":
        why = monitor._zoom(target, max(1, min(int(steps or 2), 10000)), first)
        if why is not None:
            return "refused", why, 0
        last = first + max(1, int(steps or 2)) - 1
        return "done", "zoom %s steps %d..%d" % (target, first, last), first
    if action == "capture":
        caps = monitor._captures
        if caps is None:
            return "refused", "this lockstep agent cannot capture", 0
        if not monitor.capture(target, step=first):
            return "refused", "capture of %s at step %d refused (see the job's warning)" % (
                target, first), 0
        # The file the writer thread will save after that step's forward.
        path, call, op = _capture_file.parse_row(target)
        row = op if op is not None else call_name(path, call)
        where = _capture_file.capture_path(caps.directory, caps.ident["experiment"],
                                           caps.ident["run"], int(caps.ident_of.rank), first, row)
        detail = ("capture %s at step %d into %s" % (target, first, where))[:1000]
        # Once written, the writer thread replays it and answers again with the result.
        caps.answer_after(row, first, rid, detail, monitor._agent.acknowledge_replay)
        return "done", detail, first
    if action == "sample":
        k = int(steps)
        if k < 1 or k > 2**31 - 1:
            return "refused", "sample every %d steps: give a number of steps from 1 to 2**31-1" % k, 0
        if not monitor.enabled or monitor._closed:
            return "refused", "the monitor is closed", 0
        first, stride = monitor._sample_from(k, at)
        detail = "sample every %d steps from step %d" % (stride, first)
        if stride != k:
            detail += " (asked %d; watch(every=%d) is the floor)" % (k, monitor._every)
        return "done", detail, first
    return "ignored", "this lockstep agent does not know the action '%s'" % action[:64], 0
