"""`python -m lockstep` (also installed as `lockstep-agent`): what this environment would use.

    python -m lockstep --version   the agent's version and the Python it runs in
    python -m lockstep doctor      version, _core, torch and its device, the endpoint and
                                   LOCKSTEP_* settings a Monitor would use, and whether a
                                   collector answers there (at most --timeout seconds)
    python -m lockstep doctor --neutrality MODULE:FACTORY [--steps N] [--micro-steps M]
                                   trains the model FACTORY() returns with and without
                                   the agent and says whether losses, parameters and
                                   gradients are bit-identical (lockstep._neutrality)
    python -m lockstep replay BASELINE_CAPTURE CANDIDATE_CAPTURE (or one capture folder)
                                   re-runs a captured op in float64 on the CPU and says
                                   which run is wrong (lockstep._replay)
    python -m lockstep build-bridge [--dest DIR]
                                   builds the torch bridge for this torch (lockstep._bridge:
                                   reads each recorded tensor in one C++ call; g++, about
                                   a minute)
    python -m lockstep import-msprobe DUMP -o RUN.lslog [--run ID] [--role R] [--experiment E]
                                   an msprobe tensor dump as a run log with full rows
                                   computed from its tensors by the agent's kernel
                                   (lockstep._msprobe_rows, docs/msprobe.md)

doctor exits 0 when _core loads and a collector answers, 1 otherwise. It never imports
more than it reports on and never waits longer than --timeout per check.
doctor --neutrality exits 0 when the agent changed nothing, 1 when it did (or the check
was inconclusive: the model is not deterministic without the agent), 2 when the factory
cannot be loaded or used.
replay exits 0 when the op is accurate in both runs, 1 when the runs compute different
functions or one is less accurate (or both are off), 2 on a usage error, 3 when the op
cannot be replayed (lockstep._replay.EXIT_TEXT).
"""
import argparse
import importlib.util
import os
import socket
import sys

import lockstep

DEFAULT_ENDPOINT = "tcp://127.0.0.1:6200"  # _config.OPTIONS["endpoint"] (that module needs torch)
_ZMTP_SIGNATURE_FIRST, _ZMTP_SIGNATURE_LAST = 0xFF, 0x7F  # ZMTP 3 greeting: FF, 8 bytes, 7F


def version_line():
    return "lockstep %s (Python agent; Python %s, %s)" % (
        lockstep.__version__, sys.version.split()[0], sys.executable)


def _core_line():
    try:
        from lockstep import _core  # pylint: disable=import-outside-toplevel
        return True, "loaded (%s)" % _core.__file__
    except ImportError as e:
        return False, "does not load: %s (reinstall the package for this Python)" % e


def _torch_line():
    if importlib.util.find_spec("torch") is None:
        return "torch not installed (lockstep.Monitor needs it; lockstep._core works without)"
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except Exception as e:  # pylint: disable=broad-except
        return "torch does not import: %s" % e
    parts = ["torch %s" % torch.__version__]
    try:
        if torch.cuda.is_available():
            parts.append("device cuda (%s, %d visible)" % (torch.cuda.get_device_name(0),
                                                           torch.cuda.device_count()))
        elif importlib.util.find_spec("torch_npu") is not None:
            import torch_npu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
            n = torch.npu.device_count() if hasattr(torch, "npu") else 0
            parts.append("device npu (%d visible)" % n if n else "device cpu (torch_npu: no NPU)")
        else:
            parts.append("device cpu (no CUDA device)")
    except Exception as e:  # pylint: disable=broad-except
        parts.append("device check failed: %s" % e)
    return ", ".join(parts)


def _bridge_line():
    """The torch bridge this torch would use (lockstep._bridge), without loading it."""
    if importlib.util.find_spec("torch") is None:
        return "none (no torch)"
    try:
        import torch  # pylint: disable=import-outside-toplevel
        from lockstep import _bridge  # pylint: disable=import-outside-toplevel
        if os.environ.get("LOCKSTEP_TORCH_BRIDGE", "").lower() in ("off", "0", "false", "no"):
            return "off (LOCKSTEP_TORCH_BRIDGE)"
        path = _bridge.find(torch)
    except Exception as e:  # pylint: disable=broad-except
        return "cannot tell: %s" % e
    if path is None:
        return ("none built for torch %s: tensors are read through Python, ~1 us more a "
                "record (python -m lockstep build-bridge)" % torch.__version__)
    return "built for this torch (%s)" % path


def probe(endpoint, timeout):
    """(answers, text) for a ZeroMQ endpoint: connects and reads the peer's ZMTP greeting."""
    try:
        if endpoint.startswith("tcp://"):
            hostport = endpoint[len("tcp://"):]
            host, _, port = hostport.rpartition(":")
            host = host.strip("[]") or "127.0.0.1"
            if host == "*":
                host = "127.0.0.1"
            s = socket.create_connection((host, int(port)), timeout=timeout)
        elif endpoint.startswith("ipc://"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(endpoint[len("ipc://"):])
        else:
            return False, "cannot check a %r endpoint (tcp:// and ipc:// only)" % endpoint
    except (OSError, ValueError) as e:
        return False, "no collector answers (%s)" % (e.strerror or e if isinstance(e, OSError) else e)
    with s:
        s.settimeout(timeout)
        try:
            greeting = s.recv(10)
        except OSError:
            greeting = b""
    if len(greeting) >= 1 and greeting[0] == _ZMTP_SIGNATURE_FIRST:
        return True, "a ZeroMQ peer answers (a collector, if nothing else listens there)"
    return False, "something listens but does not speak ZeroMQ (not a lockstep collector)"


def doctor(timeout):
    print(version_line())
    print("  package:   %s" % os.path.dirname(lockstep.__file__))
    core_ok, core = _core_line()
    print("  _core:     %s" % core)
    print("  torch:     %s" % _torch_line())
    print("  bridge:    %s" % _bridge_line())
    endpoint = os.environ.get("LOCKSTEP_ENDPOINT") or DEFAULT_ENDPOINT
    source = "LOCKSTEP_ENDPOINT" if os.environ.get("LOCKSTEP_ENDPOINT") else "default"
    print("  endpoint:  %s (%s)" % (endpoint, source))
    settings = sorted(k for k in os.environ if k.startswith("LOCKSTEP_") and k != "LOCKSTEP_ENDPOINT")
    for k in settings:
        v = os.environ[k]
        if "KEY" in k and v:
            v = "(set)"
        print("  %-10s %s=%s" % ("env:", k, v))
    answers, text = probe(endpoint, timeout)
    print("  collector: %s" % text)
    return 0 if core_ok and answers else 1


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m lockstep",
        description="The lockstep Python agent: what this environment would use.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command")
    d = sub.add_parser("doctor", help="check _core, torch, the endpoint and the collector")
    d.add_argument("--timeout", type=float, default=1.0,
                   help="seconds to wait for the collector (default 1)")
    d.add_argument("--neutrality", metavar="MODULE:FACTORY",
                   help="instead: prove that the agent does not change this model's training. "
                        "FACTORY() (MODULE importable from here, or a .py file) returns "
                        "(model, batch), (model, batch, loss_fn) or a dict with those keys and "
                        "optionally optimizer; loss_fn(model, batch) -> loss, default the "
                        "output's .loss or the mean square of its first tensor. The model is "
                        "copied and trained without the agent twice and with it once (AdamW "
                        "unless given, seeded, deterministic); losses, parameters and "
                        "gradients must be bit-identical. Exit 0 neutral, 1 not (or the model "
                        "is not deterministic), 2 the factory cannot be used")
    d.add_argument("--steps", type=int, default=1,
                   help="with --neutrality: optimizer steps to compare (default 1)")
    d.add_argument("--micro-steps", type=int, default=1,
                   help="with --neutrality: forward/backward passes accumulated per step "
                        "(default 1)")
    d.add_argument("--seed", type=int, default=1234,
                   help="with --neutrality: the seed given to lockstep.seed_all (default 1234)")
    r = sub.add_parser(
        "replay", help="re-run a captured op in float64 and say which run is wrong",
        description="Re-runs the op that Monitor.capture() saved in both runs on the CPU in "
                    "float64 (from each run's own inputs, and with each run's settings on the "
                    "baseline's inputs), prints each run's error against it and one verdict: "
                    "different functions (cause config), one run less accurate, both within "
                    "rounding (the birth-point budget to raise), or inputs differ. Reads the "
                    "files with torch.load(weights_only=True) only.",
        epilog="Exit status: 0 the op is accurate in both runs (within rounding, "
               "identical, or its inputs differ); 1 different functions, one run less "
               "accurate, or inconclusive; 2 a usage error; 3 the op cannot be replayed.")
    r.add_argument("captures", nargs="+", metavar="CAPTURE",
                   help="the baseline's and the candidate's capture files, or the one folder "
                        "holding both (<capture_dir>/<experiment>/step<N>-<row>/)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--ulps", type=float, default=16.0,
                   help="what a dtype explains: an op is accurate when its error against "
                        "float64 is within this many ULPs of the pair's dtype, plus "
                        "sqrt(width) for a reduction's length (default 16)")
    r.add_argument("--factor", type=float, default=4.0,
                   help="a run is less accurate when its error is this many times the "
                        "other's (default 4)")
    r.add_argument("--birth-ulps", type=float, default=32.0,
                   help="the collector's --birth-ulps, to say how far to raise it (default 32)")
    r.add_argument("--birth-gain", type=float, default=8.0,
                   help="the collector's --birth-gain (default 8)")
    b = sub.add_parser(
        "build-bridge", help="build the torch bridge for this torch",
        description="Compiles lockstep's torch bridge (the recorder's reads of each tensor, "
                    "in C++ against this torch's headers) with g++ (or $CXX) and prints "
                    "its path. A job started afterwards uses it; without it the agent "
                    "records the same values, reading tensors through Python.",
        epilog="Exit status: 0 built, 1 the build failed (the compiler's output is "
               "printed), 2 torch does not import.")
    b.add_argument("--dest", metavar="DIR",
                   help="the folder to build into (default: the package's _bridges/, else "
                        "${LOCKSTEP_CACHE_DIR:-~/.cache/lockstep}/bridges/); it is looked "
                        "for in those two only")
    m = sub.add_parser(
        "import-msprobe", help="an msprobe tensor dump as a run log with full rows",
        description="Reads the tensors an msprobe dump in tensor mode saved (torch.load with "
                    "weights_only=True only), computes lockstep's full statistics row of each "
                    "with the agent's kernel (sketch and histogram included, as a live run's), "
                    "and writes the run log with `lockstep import msprobe --rows` (names, "
                    "kinds and layout as that command's; docs/msprobe.md).",
        epilog="Exit status: that of lockstep import: 0 written, 2 a usage error, 3 the dump "
               "cannot be imported.")
    m.add_argument("dump", metavar="DUMP", help="the dump's folder (step<N>/rank<R>/...)")
    m.add_argument("-o", "--output", required=True, metavar="RUN.lslog", help="the run log to write")
    m.add_argument("--run", help="the run id (default: the dump folder's name)")
    m.add_argument("--role", help="baseline (default), candidate, solo or unknown")
    m.add_argument("--experiment", help="the experiment (default: the run id)")
    m.add_argument("--sketch-k", type=int, default=32,
                   help="count-sketch width, as the live runs' (default 32)")
    m.add_argument("--lockstep", metavar="PATH",
                   help="the lockstep binary (default: $LOCKSTEP_BIN, else lockstep on PATH)")
    args = p.parse_args(argv)
    if args.command == "build-bridge":
        from lockstep import _bridge  # pylint: disable=import-outside-toplevel
        return _bridge.main(["--dest", args.dest] if args.dest else [])
    if args.command == "import-msprobe":
        try:
            from lockstep import _msprobe_rows  # pylint: disable=import-outside-toplevel
        except ImportError as e:  # torch missing or broken: nothing to read the tensors with
            print("lockstep import-msprobe: cannot run: %s" % e)
            return 2
        return _msprobe_rows.main(args)
    if args.command == "replay":
        if len(args.captures) > 2:
            p.error("replay takes two capture files or one folder")
        if not (args.ulps >= 0 and args.factor >= 1 and args.birth_ulps >= 0
                and args.birth_gain >= 1):
            p.error("--ulps and --birth-ulps take a number >= 0, --factor and --birth-gain "
                    "a number >= 1")
        try:
            from lockstep import _replay  # pylint: disable=import-outside-toplevel
        except ImportError as e:  # torch missing or broken: nothing to replay with
            print("lockstep replay: cannot run: %s" % e)
            return 2
        return _replay.main(args)
    if args.version:
        print(version_line())
        return 0
    if args.command == "doctor" and args.neutrality is not None:
        if args.steps < 1 or args.micro_steps < 1:
            p.error("--steps and --micro-steps take an integer of at least 1")
        print(version_line())
        try:
            from lockstep import _neutrality  # pylint: disable=import-outside-toplevel
        except ImportError as e:  # torch missing or broken: nothing to train
            print("cannot check: %s" % e)
            return 2
        return _neutrality.check(args.neutrality, args.steps, args.micro_steps, args.seed)
    if args.command == "doctor":
        return doctor(max(0.05, args.timeout))
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
