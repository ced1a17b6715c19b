"""The PEP 517 build backend of the `lockstep` Python agent (pyproject.toml names it).

Standard library only, so `pip install --no-build-isolation <checkout>` works in any
environment, offline, with no setuptools: it configures the project's CMake with
LOCKSTEP_AGENT_ONLY=ON for the interpreter that runs pip, builds `_core` and the package,
and writes the wheel (zipfile) or the sdist (tarfile) itself. docs/python.md "Install".

Environment knobs (all optional):
  LOCKSTEP_PIP_BUILD_DIR  the CMake build folder (default: build-pip/<python>-<hash> in the
                          checkout when it is writable, so a second install is incremental;
                          else a temporary folder)
  LOCKSTEP_PIP_BUILD_TYPE CMake build type (default Release)
  LOCKSTEP_NO_CCACHE=1    do not use ccache even when it is installed
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the CPUs this process may use)
  LOCKSTEP_WHEEL_BUNDLE_LIBS=1  put the shared libraries _core needs (libzmq and its own,
                          not the C/C++ runtime) in lockstep/_libs/, for a machine that lacks
                          them (the package loads them before _core)
  LOCKSTEP_NO_TORCH_BRIDGE=1  do not build the torch bridge (by default, where the Python
                          that builds imports torch, the wheel carries the bridge for that
                          torch: lockstep._bridge; a failed build of it is a warning)
"""
import base64
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

NAME = "lockstep"
SUMMARY = "lockstep agent: per-step tensor statistics of a training job, sent to a lockstep collector"
# What goes into the sdist: enough to configure with LOCKSTEP_AGENT_ONLY=ON.
SDIST_PATHS = ("pyproject.toml", "CMakeLists.txt", "README.md", "schema", "agent")


def _root():
    return os.path.abspath(os.getcwd())  # PEP 517: hooks run in the source tree's root


def _version():
    with open(os.path.join(_root(), "agent", "python", "lockstep", "__init__.py")) as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("lockstep build: no __version__ in agent/python/lockstep/__init__.py")
    return m.group(1)


def _tag():
    impl = "cp" if sys.implementation.name == "cpython" else sys.implementation.name[:2]
    ver = "%d%d" % sys.version_info[:2]
    abi = (impl + ver + getattr(sys, "abiflags", "")) if impl == "cp" else "none"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s%s-%s-%s" % (impl, ver, abi, plat)


def _metadata():
    readme = ""
    p = os.path.join(_root(), "README.md")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            readme = f.read()
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\n"
            "Requires-Python: >=3.9\n%sDescription-Content-Type: text/markdown\n\n%s"
            % (NAME, _version(), SUMMARY,
               "".join("Requires-Dist: %s\n" % d for d in DEPENDENCIES), readme))


def _wheel_file():
    return ("Wheel-Version: 1.0\nGenerator: lockstep_build %s\nRoot-Is-Purelib: false\nTag: %s\n"
            % (_version(), _tag()))


# What `import lockstep` needs at run time beyond torch (which pip must not touch: the
# job's torch is a CUDA or torch_npu build): pyproject.toml's [project] dependencies.
DEPENDENCIES = ("numpy",)

ENTRY_POINTS = "[console_scripts]\nlockstep-agent = lockstep.__main__:main\n"


def _python():
    """The interpreter to build for: a venv's base interpreter (same headers and ABI), so
    builds for several venvs of one Python share a build folder and ccache entries."""
    base = getattr(sys, "_base_executable", None)
    if base and os.path.exists(base):
        return base
    return sys.executable


def _build_dir():
    env = os.environ.get("LOCKSTEP_PIP_BUILD_DIR")
    if env:
        return os.path.abspath(env), False
    py = os.path.realpath(_python())
    key = "py%d%d-%s" % (sys.version_info[0], sys.version_info[1],
                         hashlib.sha256(py.encode()).hexdigest()[:8])
    if os.access(_root(), os.W_OK):
        return os.path.join(_root(), "build-pip", key), False
    return tempfile.mkdtemp(prefix="lockstep-build-"), True


def _run(cmd, log):
    log.write("$ %s\n" % " ".join(cmd))
    log.flush()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-8000:])
        raise RuntimeError("lockstep build: `%s` failed (exit %d); the build requirements are "
                           "in docs/python.md \"Install\"" % (" ".join(cmd[:3]), r.returncode))


def _cmake_build():
    """Builds _core for this interpreter; returns the path of the built extension."""
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("lockstep build: cmake is not on PATH; install it (Debian: apt-get "
                           "install cmake) -- docs/python.md \"Install\" lists what the build needs")
    bdir, temporary = _build_dir()
    os.makedirs(bdir, exist_ok=True)
    py = _python()
    args = [cmake, "-S", _root(), "-B", bdir,
            "-DCMAKE_BUILD_TYPE=" + os.environ.get("LOCKSTEP_PIP_BUILD_TYPE", "Release"),
            "-DLOCKSTEP_AGENT_ONLY=ON", "-DLOCKSTEP_BUILD_TESTS=OFF",
            "-DLOCKSTEP_BUILD_BENCH=OFF", "-DLOCKSTEP_BUILD_PYTHON=ON",
            "-DPython_EXECUTABLE=" + py, "-DPYTHON_EXECUTABLE=" + py]
    if not os.path.exists(os.path.join(bdir, "CMakeCache.txt")) and shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if shutil.which("ccache") and os.environ.get("LOCKSTEP_NO_CCACHE", "") in ("", "0"):
        args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    t0 = time.monotonic()
    with open(os.path.join(bdir, "pip-build.log"), "w") as log:
        _run(args, log)
        _run([cmake, "--build", bdir, "-j", jobs, "--target", "lockstep_python_core",
              "lockstep_python_package"], log)
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    so = os.path.join(bdir, "python", "lockstep", "_core" + suffix)
    if not os.path.exists(so):
        raise RuntimeError("lockstep build: %s was not built (is pybind11 installed? see %s)"
                           % (so, os.path.join(bdir, "pip-build.log")))
    sys.stderr.write("lockstep build: _core for Python %s in %.1f s (%s)\n"
                     % (sysconfig.get_python_version(), time.monotonic() - t0, bdir))
    return so, (bdir if temporary else None)


# The C and C++ runtime every Linux has: never bundled.
_BASE_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|"
                        r"libgcc_s|libutil|libresolv)\.")


def _needed_libs(so):
    out = subprocess.run(["ldd", so], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
            if not _BASE_LIBS.match(parts[0]):
                libs.append((parts[0], parts[2]))  # (soname, path)
    return libs


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _dist_info():
    return "%s-%s.dist-info" % (NAME, _version())


# ---- PEP 517 hooks ---------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    for name, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file()),
                       ("entry_points.txt", ENTRY_POINTS)):
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)
    return _dist_info()


def _torch_bridge(work_dir):
    """[(arcname, path)] of the torch bridge built for the torch this Python imports
    (lockstep._bridge, run from the source tree as `python -m lockstep build-bridge`), or []
    without torch, with LOCKSTEP_NO_TORCH_BRIDGE=1, or when it does not build: the agent
    works without it, reading tensors through Python."""
    if os.environ.get("LOCKSTEP_NO_TORCH_BRIDGE", "") not in ("", "0"):
        return []
    probe = subprocess.run([sys.executable, "-c", "import torch"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
    if probe.returncode != 0:
        return []
    dest = os.path.join(work_dir, "torch-bridges")
    shutil.rmtree(dest, ignore_errors=True)
    # Run as a file: the source tree's package has no _core to import.
    script = os.path.join(_root(), "agent", "python", "lockstep", "_bridge.py")
    t0 = time.time()
    r = subprocess.run([sys.executable, script, "--dest", dest], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    if r.returncode != 0:
        sys.stderr.write("lockstep build: warning: the torch bridge was not built (the agent "
                         "works without it, ~1 us a tensor slower): %s\n"
                         % r.stdout.strip().splitlines()[-1:])
        return []
    out = []
    for folder, _, names in os.walk(dest):
        for n in names:
            path = os.path.join(folder, n)
            out.append(("lockstep/_bridges/" + os.path.relpath(path, dest).replace(os.sep, "/"),
                        path))
    sys.stderr.write("lockstep build: the torch bridge in %.1f s\n" % (time.time() - t0))
    return out


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    so, temp_dir = _cmake_build()
    pkg = os.path.join(_root(), "agent", "python", "lockstep")
    # py.typed: the package's type hints are for type checkers too (PEP 561). The torch
    # bridge's source: `python -m lockstep build-bridge` compiles it where it is installed.
    files = [("lockstep/" + n, os.path.join(pkg, n)) for n in sorted(os.listdir(pkg))
             if n.endswith(".py") or n in ("py.typed", "_torch_bridge.cc", "_torch_bridge.h")]
    files.append(("lockstep/" + os.path.basename(so), so))
    # so is <build dir>/python/lockstep/_core...: the bridge is built beside that tree.
    files += _torch_bridge(temp_dir or os.path.dirname(os.path.dirname(os.path.dirname(so))))
    if os.environ.get("LOCKSTEP_WHEEL_BUNDLE_LIBS", "") not in ("", "0"):
        files += [("lockstep/_libs/" + name, path) for name, path in _needed_libs(so)]
    name = "%s-%s-%s.whl" % (NAME, _version(), _tag())
    path = os.path.join(wheel_directory, name)
    records = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        def add(arcname, data, mode=0o644):
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (mode | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            records.append(_record_line(arcname, data))
        for arcname, src in files:
            with open(src, "rb") as f:
                add(arcname, f.read(), 0o755 if src == so or src.endswith(".so") else 0o644)
        di = _dist_info()
        add(di + "/METADATA", _metadata().encode())
        add(di + "/WHEEL", _wheel_file().encode())
        add(di + "/entry_points.txt", ENTRY_POINTS.encode())
        records.append(di + "/RECORD,,")
        info = zipfile.ZipInfo(di + "/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        z.writestr(info, "\n".join(records) + "\n")
    if temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)
    return name


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, _version())
    name = base + ".tar.gz"
    root = _root()

    def keep(info):
        parts = info.name.split("/")
        if "__pycache__" in parts or info.name.endswith(".pyc"):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in SDIST_PATHS:
            if os.path.exists(os.path.join(root, rel)):
                t.add(os.path.join(root, rel), arcname=base + "/" + rel, filter=keep)
        data = _metadata().encode()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        t.addfile(info, io.BytesIO(data))
    return name
