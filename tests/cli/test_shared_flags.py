"""A flag that several commands take is defined once (cli/align_flags.h): the same
value is refused by each of them with the same one line, exit 2 and nothing started
(--max-buffered-steps 0 was refused by collect and silently clamped to 1 by compare
and report)."""
import os
import re
import subprocess

import pytest

LOCKSTEP = os.environ.get("LOCKSTEP_BIN", "lockstep")
COMMANDS = [["collect", "--data-dir", "{tmp}/data", "--listen", "tcp://127.0.0.1:*"],
            ["compare", "{tmp}/a.lslog", "{tmp}/b.lslog"],
            ["report", "{tmp}/a.lslog", "{tmp}/b.lslog", "-o", "{tmp}/r.html"]]


def run(tmp_path, argv):
    argv = [a.format(tmp=tmp_path) for a in argv]
    return subprocess.run([LOCKSTEP] + argv, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("value", ["0", "-3", "2000000"])
def test_max_buffered_steps_is_refused_the_same_by_every_command(tmp_path, value):
    tails = set()
    for cmd in COMMANDS:
        r = run(tmp_path, cmd + ["--max-buffered-steps", value])
        assert r.returncode == 2, (cmd[0], r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (cmd[0], r.stderr)
        assert "--max-buffered-steps" in lines[0], lines[0]
        assert value in lines[0], lines[0]
        tails.add(lines[0][lines[0].index("--max-buffered-steps"):])
    assert len(tails) == 1, tails  # one definition: one sentence
    assert not (tmp_path / "data").exists()  # collect started nothing


def test_help_shows_one_definition(tmp_path):
    helps = []
    for cmd in ("collect", "compare", "report"):
        r = subprocess.run([LOCKSTEP, cmd, "--help"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        block = [l for l in r.stdout.splitlines() if "--max-buffered-steps" in l or "--name-map" in l]
        assert len(block) == 2, (cmd, block)
        helps.append(block)
    assert helps[0] == helps[1] == helps[2], helps


def test_default_settings_is_one_flag_for_compare_and_report():
    helps = []
    for cmd in ("compare", "report"):
        r = subprocess.run([LOCKSTEP, cmd, "--help"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        m = re.search(r"--default-settings(.*?)sets it", r.stdout, re.S)
        assert m, r.stdout
        helps.append(" ".join(m.group(1).split()))
    assert helps[0] == helps[1], helps
