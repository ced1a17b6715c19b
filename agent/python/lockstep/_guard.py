"""Error containment: lockstep is a guest in the training process.

Every hook and public method body runs inside ``try/except Exception`` and hands the
exception to ``Guard.fail``, which counts it and warns once per monitor. The training
loop never sees a lockstep exception (KeyboardInterrupt and SystemExit still pass).
"""
import threading
import warnings


class Guard:
    """Counts internal errors; warns about the first one only. Thread-safe enough for
    hooks on autograd threads: the counter is updated under the GIL."""

    def __init__(self, owner="lockstep"):
        self._owner = owner
        self._warned = False
        self._lock = threading.Lock()
        self.count = 0
        self.last = None  # "where: Type: message" of the most recent error

    def fail(self, where, exc):
        self.count += 1
        self.last = "%s: %s: %s" % (where, type(exc).__name__, exc)
        with self._lock:
            if self._warned:
                return
            self._warned = True
        warnings.warn(
            "%s: internal error in %s (%s: %s); training continues, lockstep counts "
            "further errors without warning (see Monitor.counters()['python_errors'])"
            % (self._owner, where, type(exc).__name__, exc),
            RuntimeWarning,
            stacklevel=3,
        )

    def warn(self, message):
        """A one-time configuration warning (not an internal error)."""
        warnings.warn("lockstep: " + message, RuntimeWarning, stacklevel=3)
