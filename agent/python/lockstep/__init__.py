"""lockstep: watch two training runs (e.g. GPU and NPU) and say when and where they
part ways. See docs/python.md.

    import lockstep
    lockstep.seed_all(1234)
    mon = lockstep.Monitor(run="npu-01", role="candidate", experiment="glm")
    mon.watch(model, optimizer=opt)
    ...  # training loop, calling mon.step(loss=loss, lr=lr) once per step
    mon.close()
"""
import importlib.util as _util
import os as _os
import sys as _sys

__version__ = "0.1.0"


def _preload_bundled_libs():
    """A wheel built with LOCKSTEP_WHEEL_BUNDLE_LIBS=1 carries libzmq and its libraries in
    lockstep/_libs/ (for machines without them); loading them first lets _core find them
    by soname. Libraries that need another one are retried after it (no fixed order)."""
    libs_dir = _os.path.join(_os.path.dirname(__file__), "_libs")
    if not _os.path.isdir(libs_dir):
        return
    import ctypes  # pylint: disable=import-outside-toplevel
    pending = sorted(_os.listdir(libs_dir))
    while pending:
        failed = []
        for name in pending:
            try:
                ctypes.CDLL(_os.path.join(libs_dir, name), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                failed.append(name)
        if len(failed) == len(pending):
            return  # _core's import then names what is missing
        pending = failed


_preload_bundled_libs()

if _util.find_spec("torch") is not None:
    from lockstep._monitor import Monitor
    from lockstep._seed import seed_all
else:
    # Without torch the package still imports (`python -m lockstep doctor`, lockstep._core);
    # the torch-facing API says what is missing when it is first used.
    def __getattr__(name):
        if name in ("Monitor", "seed_all"):
            raise ImportError("lockstep.%s needs PyTorch, which this Python (%s) does not "
                              "have; install torch in this environment" % (name, _sys.executable))
        raise AttributeError("module 'lockstep' has no attribute %r" % (name,))

__all__ = ["Monitor", "seed_all", "__version__"]
