"""Hostile and random values at every flag of every `lockstep` subcommand and at every
TOML key, through the real binary: the process exits with one of the codes of
lockstep/common/exit_codes.h, a usage error (2) is one line on stderr, and no signal ever kills it.

A seeded generator stands in for a property-testing library (none is installed). Flags
come from each subcommand's --help, so a new flag is fuzzed without editing this file.
`collect` and `top` get safe defaults (loopback ports picked by the kernel, no view
feed or metrics port, a short --once timeout) so a value that is valid starts the
collector, which the test then stops: "started fine" is a pass.
"""
import os
import random
import re
import signal
import subprocess
import tempfile
import time

import pytest

LOCKSTEP = os.environ.get("LOCKSTEP_BIN", "lockstep")
SEED = 20261125
EXIT_CODES = {0, 1, 2, 3, 4, 5, 6}  # lockstep/common/exit_codes.h

HOSTILE = ["", " ", "-1", "-0", "-1e9", "0", "1", "2.5", "1e400", "-1e400", "nan", "inf", "-inf",
           "9" * 30, "-9223372036854775809", "9223372036854775807", "0x10", "abc", "true", "false",
           "--", "=", "x" * 5000, "tcp://", "tcp://127.0.0.1:*", "tcp://127.0.0.1:nope", "env:LOCKSTEP_NOPE",
           "/", "/etc/hostname/x", "/nonexistent/dir/file", "\u00e9\u00e8\U0001f4a5", "1.5",
           "kind=webhook,url=htps://x.example/h,colour=red", "https://127.0.0.1:1/h", "off", "info",
           "critical", "a,b,,c", "\t", "\n", "-", "--help=x"]

TOML_VALUES = ['""', '"x"', "-1", "0", "1", "2.5", "-0.5", "9223372036854775807", "1e308", "nan",
               "inf", "-inf", "true", "false", "[]", '[1, "a"]', '["x"]', "{a = 1}",
               "1979-05-27T07:32:00Z", '"' + "y" * 3000 + '"', '"env:LOCKSTEP_NOPE"',
               '"/etc/hostname/x"', '"kind=generic,url=https://127.0.0.1:1/h,colour=red"']


def flags_of(cmd):
    out = subprocess.run([LOCKSTEP, cmd, "--help"], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    flags = re.findall(r"^  --([a-z0-9-]+)( [A-Z]+)?", out.stdout, re.M)
    return [(name, bool(value)) for name, value in flags if name != "help"]


class Runner:
    """Runs the binary and checks every outcome; counts invocations."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.count = 0
        self.started = 0

    def run(self, args, wait_s=5.0, ready_file=None):
        self.count += 1
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([LOCKSTEP] + args, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    cwd=self.tmp)
            deadline = time.monotonic() + wait_s
            started = False
            while proc.poll() is None and time.monotonic() < deadline:
                if ready_file and os.path.exists(ready_file):
                    started = True  # a valid value: the collector is up, stop it
                    break
                time.sleep(0.005)  # polling a child process, not a synchronization
            if proc.poll() is None:
                started = True
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    pytest.fail("did not stop on SIGTERM: %r" % args)
            if ready_file and os.path.exists(ready_file):
                os.remove(ready_file)
            out.seek(0)
            err.seek(0)
            stderr = err.read().decode("utf-8", "replace")
        rc = proc.returncode
        label = "lockstep %s -> %s\n%s" % (" ".join(a[:80] for a in args), rc, stderr[-2000:])
        assert rc >= 0 and rc < 128, "killed by a signal: " + label
        if started:
            self.started += 1
            assert rc in EXIT_CODES, label
            return rc, stderr
        assert rc in EXIT_CODES, label
        if rc == 2:
            lines = [l for l in stderr.splitlines() if l.strip()]
            assert len(lines) == 1 and lines[0].startswith("lockstep"), "not one line: " + label
        return rc, stderr


# Defaults that keep a collector that starts on loopback, off fixed ports, short-lived.
def collect_safe(tmp, skip):
    safe = {"listen": "tcp://127.0.0.1:*", "view-listen": "off", "metrics-listen": "off",
            "data-dir": os.path.join(tmp, "data"), "ready-file": os.path.join(tmp, "ready.json"),
            "status-interval-s": "0", "log-level": "error"}
    args = []
    for k, v in safe.items():
        if k not in skip:
            args += ["--" + k, v]
    return args


def positional_for(cmd, tmp):
    if cmd == "compare":
        return [os.path.join(tmp, "missing-a.lslog"), os.path.join(tmp, "missing-b.lslog")]
    if cmd == "inspect":
        return [os.path.join(tmp, "missing.lslog")]
    if cmd == "keygen":
        return [os.path.join(tmp, "keys", "k")]
    return []


def extra_for(cmd, skip):
    if cmd == "top":
        return [a for k, v in (("once", None), ("connect", "tcp://127.0.0.1:1"), ("timeout-s", "0.2"))
                if k not in skip for a in (["--" + k] + ([v] if v else []))]
    if cmd == "alert-test":  # a local sink, no retries: each call is quick
        safe = {"alerts-file": "alerts.jsonl", "alert-retries": "0", "alert-timeout-s": "0.3",
                "alert-connect-timeout-s": "0.3", "alert-backoff-ms": "10"}
        return [a for k, v in safe.items() if k not in skip for a in ("--" + k, v)]
    return []


@pytest.fixture
def runner(tmp_path):
    return Runner(str(tmp_path))


@pytest.mark.parametrize("cmd", ["collect", "compare", "inspect", "top", "alert-test", "keygen"])
def test_every_flag_with_hostile_values(cmd, runner):
    rng = random.Random("%s-%d" % (cmd, SEED))
    tmp = runner.tmp
    per_flag = 2 if cmd == "collect" else 4
    for name, takes_value in flags_of(cmd):
        values = rng.sample(HOSTILE, per_flag) if takes_value else ["", "=maybe", "=false"]
        for value in values:
            if takes_value:
                flag = ["--%s" % name, value] if rng.random() < 0.7 else ["--%s=%s" % (name, value)]
            else:
                flag = ["--%s%s" % (name, value)]
            skip = {name}
            args = [cmd] + flag + positional_for(cmd, tmp) + extra_for(cmd, skip)
            if cmd == "collect":
                args += collect_safe(tmp, skip)
                runner.run(args, ready_file=None if name == "ready-file" else
                           os.path.join(tmp, "ready.json"))
            else:
                runner.run(args)
    # Words that are not flags at all.
    for junk in (["--"], ["-x"], ["---"], ["--=1"], ["pos", "itional"], ["--" + "z" * 3000]):
        runner.run([cmd] + junk + extra_for(cmd, set()) +
                   (collect_safe(tmp, set()) if cmd == "collect" else []),
                   ready_file=os.path.join(tmp, "ready.json") if cmd == "collect" else None)
    assert runner.count >= 10


def test_every_toml_key_with_hostile_values(runner):
    rng = random.Random(SEED)
    tmp = runner.tmp
    keys = [name for name, _ in flags_of("collect") if name != "config"]
    cases = [(k, v) for k in rng.sample(keys, min(30, len(keys))) for v in rng.sample(TOML_VALUES, 2)]
    cases += [("no-such-key", "1"), ("tol_fp23", "0.1"), ("[colect]\ntol-fp32", "0.1"),
              ("[collect.x]\na", "1"), ("[collect]\n[collect]\na", "1"), ("tol-fp32", "-0.5"),
              ("alert-rate-per-min", "-1"), ("alert-sink", '["kind=generic,url=x,colour=red"]')]
    for i, (key, value) in enumerate(cases):
        path = os.path.join(tmp, "c%d.toml" % i)
        in_table = rng.random() < 0.5 and not key.startswith("[")
        with open(path, "w", encoding="utf-8") as f:
            f.write(("[collect]\n" if in_table else "") + "%s = %s\n" % (key, value))
        plain = key.split("\n")[-1].replace("_", "-")
        args = ["collect", "--config", path] + collect_safe(tmp, {plain})
        rc, err = runner.run(args, ready_file=os.path.join(tmp, "ready.json"))
        if rc == 2 and "config file" in err:
            assert re.search(r"line \d+", err), err  # names the line
    # Unknown keys and misspelt tables are errors that name them.
    for text, want in (("tol-fp23 = 0.1\n", "did you mean 'tol-fp32'"),
                       ("[colect]\ntol-fp32 = 0.1\n", "unknown table [colect]"),
                       ("[collect]\ntol-fp32 = -0.5\n", "--tol-fp32 must not be negative")):
        path = os.path.join(tmp, "k.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        rc, err = runner.run(["collect", "--config", path] + collect_safe(tmp, set()))
        assert rc == 2 and want in err and "line " in err, err
    assert runner.count > 60


def test_alert_sink_setup_failures_exit_2_not_a_crash(runner, tmp_path):
    """The crash of issue 16: a sink that cannot be set up once killed collect (139)."""
    (tmp_path / "plain").write_text("x")
    (tmp_path / "garbage.pem").write_text("not a certificate\n")
    (tmp_path / "adir").mkdir()
    for flags, want in ((["--alerts-file", str(tmp_path / "adir")], "is a directory"),
                        (["--alerts-file", str(tmp_path / "plain" / "a.jsonl")], "plain/a.jsonl"),
                        (["--alert-ca-file", str(tmp_path / "garbage.pem"), "--webhook",
                          "https://127.0.0.1:1/h"], "garbage.pem")):
        rc, err = runner.run(["collect"] + flags + collect_safe(runner.tmp, set()),
                             ready_file=os.path.join(runner.tmp, "ready.json"))
        assert rc == 2 and want in err, err
