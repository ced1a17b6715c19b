"""`python -m lockstep import-msprobe DUMP -o RUN.lslog`: an msprobe tensor dump as a run
log with full rows (docs/msprobe.md "Tensor mode").

msprobe's tensor mode saves every tensor of dump.json to dump_tensor_data/ with
torch.save. This reads each of those files (``torch.load(path, weights_only=True)``: data
only, never arbitrary unpickling), computes lockstep's full statistics row with the
agent's own C++ kernel (``_core.host_stats``: every field, the count-sketch and the
histogram, exactly as a live run's CPU tensors get them, docs/statistics.md), and writes
the rows of each rank folder to ``<rows>/step<N>/<rank>/lockstep_rows.json``. Then the
``lockstep`` binary's importer (``lockstep import msprobe --rows``) writes the log: names,
kinds, orders and layout are the C++ importer's, each tensor with a row imported whole
(a tensor without a file keeps dump.json's statistics, marked statistics-only).

One tensor is in memory at a time. A file that is not a floating-point tensor the kernel
reads (strings, integers, complex) is left to dump.json's statistics.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

EXIT_USAGE, EXIT_BAD_INPUT = 2, 3


def _rank_folders(dump):
    """(relative path, folder) of every rank folder holding dump_tensor_data/."""
    for root, dirs, _files in os.walk(dump):
        if "dump_tensor_data" in dirs:
            yield os.path.relpath(root, dump), root
            dirs[:] = [d for d in dirs if d != "dump_tensor_data"]


def _row(t, core, codes, sketch_k, hist_bins):
    """The full row of tensor t (the layout msprobe_import.cc reads), or None."""
    import torch  # pylint: disable=import-outside-toplevel
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.is_complex():
        return None
    code = codes.get(t.dtype)
    if code is None:
        return None
    t = t.detach().to("cpu").contiguous()
    s = core.host_stats(t.data_ptr(), t.numel(), code, sketch_k, hist_bins)
    return ([s["numel"], s["min"], s["max"], s["mean"], s["std"], s["l2"], s["absmax"], s["nan_count"],
             s["inf_count"], s["zero_count"], s["sat_count"], s["subnormal_count"], s["limit_dtype"]]
            + list(s["sketch"]) + list(s["hist"]))


def compute_rows(dump, rows_dir, sketch_k=32, hist_bins=16, log=None):
    """Writes <rows_dir>/<rank folder>/lockstep_rows.json for each rank folder of `dump`
    that has tensor files; returns (files read, rows written)."""
    import torch  # pylint: disable=import-outside-toplevel
    from lockstep import _core  # pylint: disable=import-outside-toplevel
    from lockstep._recorder import probe_host_dtypes  # pylint: disable=import-outside-toplevel
    codes = probe_host_dtypes(sketch_k, hist_bins)
    files = written = 0
    for rel, folder in _rank_folders(dump):
        data = os.path.join(folder, "dump_tensor_data")
        rows = {}
        for name in sorted(os.listdir(data)):
            if not name.endswith(".pt"):
                continue
            files += 1
            try:
                t = torch.load(os.path.join(data, name), map_location="cpu", weights_only=True)
            except Exception as e:  # pylint: disable=broad-except  (one bad file: its statistics stay)
                if log is not None:
                    log("lockstep import-msprobe: %s: cannot read (%s); its statistics from dump.json stay"
                        % (os.path.join(data, name), str(e).splitlines()[0] if str(e) else type(e).__name__))
                continue
            row = _row(t, _core, codes, sketch_k, hist_bins)
            del t
            if row is not None:
                rows[name] = row
        out = os.path.join(rows_dir, rel)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "lockstep_rows.json"), "w") as f:
            json.dump({"sketch_k": sketch_k, "hist_bins": hist_bins, "rows": rows}, f)
        written += len(rows)
    return files, written


def _binary(given):
    """The lockstep binary: --lockstep, else $LOCKSTEP_BIN, else `lockstep` on PATH."""
    for path in (given, os.environ.get("LOCKSTEP_BIN"), shutil.which("lockstep")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def main(args):
    """import-msprobe: rows from the tensors, then `lockstep import msprobe --rows`."""
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    exe = _binary(args.lockstep)
    if exe is None:
        say("lockstep import-msprobe: cannot find the lockstep binary (give --lockstep PATH or set LOCKSTEP_BIN)")
        return EXIT_USAGE
    if not os.path.isdir(args.dump):
        say("lockstep import-msprobe: %s: no such directory" % args.dump)
        return EXIT_BAD_INPUT
    if not 0 <= args.sketch_k <= 256:
        say("lockstep import-msprobe: --sketch-k takes 0 to 256")
        return EXIT_USAGE
    rows_dir = tempfile.mkdtemp(prefix="lockstep-msprobe-rows-")
    try:
        files, rows = compute_rows(args.dump, rows_dir, args.sketch_k, 16, log=say)
        cmd = [exe, "import", "msprobe", args.dump, "-o", args.output, "--rows", rows_dir]
        for flag in ("run", "role", "experiment"):
            if getattr(args, flag):
                cmd += ["--" + flag, getattr(args, flag)]
        out = subprocess.run(cmd, check=False)
        if out.returncode == 0:
            say("lockstep import-msprobe: %d of %d tensor files read into full rows" % (rows, files))
        return out.returncode
    finally:
        shutil.rmtree(rows_dir, ignore_errors=True)
