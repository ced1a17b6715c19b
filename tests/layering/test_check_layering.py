"""scripts/check_layering: passes on this tree, and fails on a planted violation of each
rule, naming the file, the line and the rule."""
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_layering"


def run(root):
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                          capture_output=True, text=True, timeout=30)


def write(root, rel, text):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_this_tree_follows_the_layering():
    r = run(REPO)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def fake_tree(root):
    """A small clean tree with one header per room."""
    write(root, "schema/include/lockstep/common/status.h", "#pragma once\n")
    write(root, "schema/include/lockstep/common/flags.h", "#pragma once\n")
    write(root, "agent/include/lockstep/agent/agent.h", '#include "lockstep/common/status.h"\n')
    write(root, "alerting/include/lockstep/alerting/alert.h", '#include "lockstep/common/status.h"\n')
    write(root, "collector/include/lockstep/collector/collector.h", "#pragma once\n")
    write(root, "collector/src/ingest/registry.h", "#pragma once\n")
    write(root, "collector/src/runlog/log_reader.cc", '#include "lockstep/common/status.h"\n')
    write(root, "collector/src/rules/detector.cc", '#include "runlog/log_reader.h"\n')
    write(root, "collector/src/detect/analyzer.h", '#include "rules/detector.h"\n')
    write(root, "collector/src/cli/compare_cmd.cc", '#include "ingest/registry.h"\n')
    write(root, "collector/src/top/top_ui.cc", "#include <ncurses.h>\n")
    write(root, "collector/src/top/CMakeLists.txt", "target_link_libraries(t PRIVATE ncursesw)\n")
    write(root, "collector/src/view/CMakeLists.txt", "# the view feed\n")


# (rule, the file planted, its text): each plants one violation into the clean fake tree.
PLANTS = [
    ("stacks-apart", "agent/tools/loadgen.cc", '#include "cli/compare_cmd.cc"\n'),
    ("stacks-apart", "agent/src/engine/x.cc", '#include "lockstep/alerting/alert.h"\n'),
    ("order", "schema/include/lockstep/common/flags.h", '#include "lockstep/agent/agent.h"\n'),
    ("order", "alerting/src/formats.cc", '#include "lockstep/collector/collector.h"\n'),
    ("order", "collector/src/runlog/inspect.h", '#include "ingest/registry.h"\n'),
    ("order", "collector/src/detect/rules.cc", '#include "cli/compare_cmd.cc"\n'),
    ("order", "collector/src/view/view_model.cc", '#include "top/top_ui.cc"\n'),
    ("order", "collector/src/top/top_cmd.cc", '#include "cli/compare_cmd.cc"\n'),
    ("rules-without-flag-parser", "collector/src/rules/rule_settings.cc",
     '#include "lockstep/common/flags.h"\n'),
    ("rules-without-flag-parser", "collector/src/detect/analyzer.cc",
     '#include "lockstep/common/flags.h"\n'),
    ("order", "collector/src/rules/birth.cc", '#include "detect/analyzer.h"\n'),
    ("public-not-private", "collector/include/lockstep/collector/service.h",
     '// the pipeline\n#include "ingest/registry.h"\n'),
    ("daemon-without-ncurses", "collector/src/view/CMakeLists.txt",
     "target_link_libraries(lockstep_collector PRIVATE ncursesw)\n"),
]


def test_the_fake_tree_is_clean(tmp_path):
    fake_tree(tmp_path)
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("rule,rel,text", PLANTS, ids=[f"{p[0]}:{p[1]}" for p in PLANTS])
def test_a_planted_violation_fails_and_names_file_and_rule(tmp_path, rule, rel, text):
    fake_tree(tmp_path)
    write(tmp_path, rel, text)
    r = run(tmp_path)
    assert r.returncode == 1, r.stderr
    lines = [l for l in r.stderr.splitlines() if f"rule {rule}:" in l]
    assert lines, r.stderr
    line_no = text.count("\n", 0, text.index("ncursesw" if "ncurses" in text else "#include")) + 1
    assert lines[0].startswith(f"check_layering: {rel}:{line_no}: "), lines[0]


def test_a_comment_or_system_include_is_not_a_violation(tmp_path):
    fake_tree(tmp_path)
    write(tmp_path, "agent/src/a.cc", '#include <zmq.hpp>\n#include "no/such/file.h"\n')
    write(tmp_path, "collector/src/view/CMakeLists.txt", "# not ncurses here\n")
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
