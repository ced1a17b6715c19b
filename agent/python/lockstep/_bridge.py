"""The torch bridge: lockstep._torch_bridge, built per torch, found and handed to _core.

lockstep._core is built against no torch, so it reads each recorded tensor's facts
(device, dtype, data pointer, size, layout, version counter) through the tensor's
Python attributes: ~8 calls into torch's bindings, ~1 us a record. The bridge
(_torch_bridge.cc, beside this file) reads them from the at::Tensor in one call. It is
C++ against torch's own headers and ABI, so it is built for one torch:

    python -m lockstep build-bridge          (about a minute; needs g++)

writes it into this package's ``_bridges/<key>/`` (or, where that is not writable, the
cache folder ``${LOCKSTEP_CACHE_DIR:-~/.cache/lockstep}/bridges/<key>/``), where <key>
names the torch build (its version and git commit). install() looks only there, for the
running torch's key, so a bridge is never loaded into another torch; the bridge checks
torch.__version__ again when it loads. Without one, nothing changes but the speed: the
recorder's values are the same (tests/python/test_torch_bridge.py).
LOCKSTEP_TORCH_BRIDGE=off leaves it unused.
"""
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import warnings

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_bridge.cc")
# The bridge's table version: kAbi in _torch_bridge.h (_core.TORCH_BRIDGE_ABI; a test
# checks they agree). In the folder name, so two lockstep versions sharing the cache
# folder each find their own.
ABI = 1


def key(torch):
    """The folder name of `torch`'s bridge: its version and git commit, and the ABI."""
    git = (getattr(torch.version, "git_version", None) or "nogit")[:12]
    return re.sub(r"[^A-Za-z0-9._-]", "_", "torch-%s-%s-abi%d" % (torch.__version__, git, ABI))


def filename():
    return "_torch_bridge" + sysconfig.get_config_var("EXT_SUFFIX")


def cache_root():
    base = os.environ.get("LOCKSTEP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "lockstep")
    return os.path.join(base, "bridges")


def roots():
    """Where bridges are looked for, in order: the package's own folder, the cache."""
    return [os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bridges"), cache_root()]


def find(torch):
    """The path of the running torch's bridge, or None."""
    for root in roots():
        path = os.path.join(root, key(torch), filename())
        if os.path.isfile(path):
            return path
    return None


def _load(path):
    import importlib.util  # pylint: disable=import-outside-toplevel
    spec = importlib.util.spec_from_file_location("lockstep._torch_bridge", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_STATE = {"path": None, "why": "not looked for"}


def install():
    """Hands the running torch's bridge to _core when there is one (else tells it to read
    through Python); returns its path or None. Never raises: a bridge that does not load is one warning, and Python reads."""
    from lockstep import _core  # pylint: disable=import-outside-toplevel
    import torch  # pylint: disable=import-outside-toplevel
    _core.set_torch_bridge(None)  # until one loads
    if os.environ.get("LOCKSTEP_TORCH_BRIDGE", "").lower() in ("off", "0", "false", "no"):
        _STATE.update(path=None, why="off (LOCKSTEP_TORCH_BRIDGE)")
        return None
    path = find(torch)
    if path is None:
        _STATE.update(path=None, why="none built for torch %s (python -m lockstep "
                      "build-bridge)" % torch.__version__)
        return None
    try:
        _core.set_torch_bridge(_load(path).api)
    except Exception as e:  # pylint: disable=broad-except
        _STATE.update(path=None, why="%s does not load: %s" % (path, e))
        warnings.warn("lockstep: the torch bridge %s does not load (%s); tensors are read "
                      "through Python (rebuild it: python -m lockstep build-bridge)"
                      % (path, e), RuntimeWarning, stacklevel=2)
        return None
    _STATE.update(path=path, why="loaded")
    return path


def status():
    """What the last install() did: the bridge in use, or why none is (one line)."""
    return ("loaded (%s)" % _STATE["path"]) if _STATE["path"] else _STATE["why"]


def build(dest_root=None, quiet=False):
    """Builds the bridge for the running torch into `dest_root`/<key>/ (default: the
    first writable of roots()); returns its path. Raises RuntimeError with the compiler's
    message when it fails."""
    import torch  # pylint: disable=import-outside-toplevel
    # torch's own layout (torch.utils.cpp_extension's include_paths and library_paths,
    # without importing that module, which looks for CUDA and warns when there is none).
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    includes = [os.path.join(torch_dir, "include"),
                os.path.join(torch_dir, "include", "torch", "csrc", "api", "include")]
    libs = os.path.join(torch_dir, "lib")
    candidates = [dest_root] if dest_root else roots()
    last_error = None
    for root in candidates:
        folder = os.path.join(root, key(torch))
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
            os.close(fd)
        except OSError as e:
            last_error = e
            continue
        cxx = os.environ.get("CXX", "g++")
        cmd = ([cxx, "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
                "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI),
                '-DLOCKSTEP_TORCH_VERSION="%s"' % torch.__version__,
                "-I" + sysconfig.get_paths()["include"]]
               + ["-I" + p for p in includes]
               + [_SOURCE, "-L" + libs, "-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python",
                  "-Wl,-rpath," + libs, "-o", tmp])
        if not quiet:
            print("lockstep: building the torch bridge for torch %s in %s"
                  % (torch.__version__, folder), file=sys.stderr)
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True, check=False)
        except OSError as e:
            os.unlink(tmp)
            raise RuntimeError("the C++ compiler %r does not run: %s" % (cxx, e)) from e
        if r.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError("the torch bridge does not compile:\n%s" % r.stdout[-4000:])
        path = os.path.join(folder, filename())
        os.replace(tmp, path)  # atomic: a job loading it meanwhile sees old or new
        return path
    raise RuntimeError("no folder to build the torch bridge in is writable (%s): %s"
                       % (", ".join(candidates), last_error))


def main(argv=None):
    """`python -m lockstep build-bridge [--dest DIR]`, and this file run by itself."""
    import argparse  # pylint: disable=import-outside-toplevel
    p = argparse.ArgumentParser(prog="python -m lockstep build-bridge",
                                description="Builds lockstep's torch bridge for this torch.")
    p.add_argument("--dest", metavar="DIR", help="the folder to build into")
    args = p.parse_args(argv)
    try:
        path = build(args.dest)
    except ImportError as e:  # torch missing or broken: nothing to build against
        print("lockstep build-bridge: cannot run: %s" % e)
        return 2
    except RuntimeError as e:
        print("lockstep build-bridge: %s" % e)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    # Run as a file (CMake's build tree, the wheel's build): without importing the
    # package, whose __init__ loads _core (not built yet in a source tree; instrumented in
    # a sanitizer build). This file's folder is not a place to import from.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.exit(main())
