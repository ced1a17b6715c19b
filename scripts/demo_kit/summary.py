#!/usr/bin/env python3
"""Summarizes the lockstep demo's alerts (JSON lines on stdin).

Prints the end-of-demo summary; exits 1 when lockstep did not name the injected
layer (--injected) as the first divergence, so CI can check the demo's outcome.
"""
import argparse
import collections
import glob
import json
import os
import shutil
import subprocess
import sys

def load(stream):
    alerts = []
    for line in stream:
        line = line.strip()
        if line:
            try:
                alerts.append(json.loads(line))
            except ValueError:
                pass
    return alerts


def runs_of(a):
    r = a.get("runs") or a.get("run") or []
    return ", ".join(r) if isinstance(r, list) else str(r)


def first(alerts, rule):
    xs = [a for a in alerts if a.get("rule") == rule]
    return min(xs, key=lambda a: (a.get("step", 0), a.get("first_seen_unix_ns", 0))) if xs else None


def offline_answer(lockstep, base, cand, live):
    """What `lockstep compare` of the logs says, against the live first divergence: it
    reuses the settings the collector recorded next to the logs, so they agree."""
    try:
        out = subprocess.run([lockstep, "compare", "--json", base, cand], capture_output=True, text=True,
                             timeout=120, check=False)
        fd = json.loads(out.stdout).get("first_divergence")
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return f"(compare could not be run: {e})"
    where = lambda a: f"step {a.get('step')}, {a.get('tensor')}" if a else "none"
    if (fd and live and (fd.get("step"), fd.get("tensor")) == (live.get("step"), live.get("tensor"))) or \
            (fd is None and live is None):
        return f"(compare gives the live answer, with the settings recorded next to the logs: {where(fd)})"
    return f"(compare gives {where(fd)}, live gave {where(live)}: are the logs' .settings.toml files missing?)"


def replay_verdict(message):
    """The verdict line of `python -m lockstep replay` on the files a capture alert names."""
    files = message.split("python -m lockstep replay ")[-1].split()
    if len(files) != 2 or not all(os.path.isfile(f) for f in files):
        return "(the capture files are not here: " + " ".join(files) + ")"
    try:
        out = subprocess.run([sys.executable, "-m", "lockstep", "replay", *files], capture_output=True,
                             text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"(replay could not be run: {e})"
    lines = [l for l in out.stdout.splitlines() if l.startswith("verdict:")]
    return lines[-1] if lines else "(replay said: " + (out.stdout + out.stderr).strip()[-300:] + ")"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir")
    p.add_argument("--lockstep", default="build/lockstep")
    p.add_argument("--injected", help="name of the layer the demo changed")
    args = p.parse_args()
    alerts = load(sys.stdin)

    fd = first(alerts, "first_divergence")
    print()
    if fd:
        print(f"First divergence:  step {fd.get('step')}, tensor {fd.get('tensor')} ({fd.get('kind')})")
        print(f"                   {fd.get('message')}")
    else:
        print("First divergence:  none found")
    named = bool(fd and args.injected and
                 (fd.get("tensor") == args.injected or str(fd.get("tensor", "")).startswith(args.injected + ".")
                  or str(fd.get("tensor", "")).startswith(args.injected + "[")))
    if args.injected:
        verdict = "lockstep named it" if named else "lockstep did NOT name it"
        print(f"Injected change:   {args.injected} stores its output in fp16 -> {verdict}")
    # The collector zoomed into a container born in its own code and named the call.
    zoomed = [a for a in alerts if a.get("rule") == "first_divergence"
              and str(a.get("message", "")).startswith("zoomed into ")]
    if zoomed:
        z = zoomed[0]
        print(f"Zoomed in:         step {z.get('step')}, {z.get('tensor')}: "
              f"{z.get('message', '').split(': ', 1)[-1]}")
    nf = first(alerts, "nonfinite")
    if nf:
        print(f"First NaN/Inf:     step {nf.get('step')} in {runs_of(nf)}: {nf.get('message')}")
    uf = first(alerts, "underflow")
    if uf:
        same = sum(1 for a in alerts if a.get("rule") == "underflow" and a.get("step") == uf.get("step"))
        more = f" (and {same - 1} more tensors at that step)" if same > 1 else ""
        print(f"First underflow:   step {uf.get('step')} in {runs_of(uf)}: {uf.get('message')}{more}")
    ov = first(alerts, "overflow")
    if ov:
        print(f"First overflow:    step {ov.get('step')} in {runs_of(ov)}: {ov.get('message')}")
    cap = first(alerts, "capture")
    if cap:
        # The collector had both runs save the op where the error is born; re-running it
        # in float64 says which run computes it wrongly (docs/python.md "Capture and replay").
        print(f"Captured:          {cap.get('tensor')} at step {cap.get('step')} in both runs")
        print(f"Which run:         {replay_verdict(cap.get('message', ''))}")
    by = collections.Counter((a.get("rule"), a.get("severity")) for a in alerts)
    print(f"Alerts:            {len(alerts)} in all: " +
          ", ".join(f"{n} {r} ({s})" for (r, s), n in sorted(by.items())))
    if args.data_dir:
        d = args.data_dir
        hook = os.path.join(d, "webhook.jsonl")
        if os.path.exists(hook):
            with open(hook) as f:
                got = sum(1 for _ in f)
            print(f"Webhook:           the local receiver got {got} message(s), one per incident "
                  f"opened, escalated, updated or resolved: {hook}")
        print(f"Alerts file:       {os.path.join(d, 'alerts.jsonl')}")
        logs = sorted(glob.glob(os.path.join(d, "*.lslog")))
        for i, log in enumerate(logs):
            print(("Run logs:          " if i == 0 else "                   ") + log)
        base = [l for l in logs if "baseline" in os.path.basename(l)]
        cand = [l for l in logs if "candidate" in os.path.basename(l)]
        if base and cand:
            print("Look again:        " + f"{args.lockstep} compare {base[0]} {cand[0]}")
            print("                   " + f"{args.lockstep} inspect {cand[0]} | head")
            print("                   " + offline_answer(args.lockstep, base[0], cand[0],
                                                         zoomed[0] if zoomed else fd))
            # The HTML report of the two runs (docs/report.md): one self-contained page.
            page = os.path.join(d, "report.html")
            rep = subprocess.run([args.lockstep, "report", base[0], cand[0], "-o", page],
                                 capture_output=True, text=True, check=False)
            print("Report:            " + (f"{page}  (open it in a browser)" if rep.returncode == 0
                                           else "not written: " + rep.stderr.strip()))
            # In a terminal with a desktop, offer to open it (stdin is the alerts file: ask the tty).
            opener = shutil.which("xdg-open")
            if rep.returncode == 0 and opener and os.environ.get("DISPLAY") and sys.stdout.isatty():
                try:
                    with open("/dev/tty", encoding="utf-8") as tty:
                        print("                   open it now? [y/N] ", end="", flush=True)
                        if tty.readline().strip().lower() in ("y", "yes"):
                            subprocess.Popen([opener, page], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                except OSError:
                    pass
    if args.injected and not named:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
