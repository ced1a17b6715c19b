"""Which reentrant activation-checkpoint segment a hook runs in.

``torch.utils.checkpoint(..., use_reentrant=True)`` runs a segment's forward under
``no_grad`` (inside ``CheckpointFunction.forward``) and runs it again in backward
(inside ``CheckpointFunction.backward``), one segment after the other in backward
order, each followed by a backward of its own (a nested graph task). Both runs share one
``ctx`` object, the segment's node in the graph. A hook that knows that ctx can give a
recomputed call the number its forward took, whatever order backward recomputes the
segments in (docs/python.md "Names").

autograd says nothing about this, so the ctx is read from the Python frames that call
the hook: a feature check (the class's two functions, looked up once); without them
(another torch) ``segment`` returns None and lockstep numbers recomputed calls as
before. Only hooks that fire under ``no_grad`` in training, or inside a backward of a
micro step that had reentrant segments, walk the frames.
"""
import sys

FORWARD, BACKWARD = 0, 1
_CODES = []  # [(forward code, backward code)], looked up once


def _codes():
    if not _CODES:
        codes = (None, None)
        try:
            from torch.utils import checkpoint  # pylint: disable=import-outside-toplevel
            fn = checkpoint.CheckpointFunction
            codes = (fn.forward.__code__, fn.backward.__code__)
        except Exception:  # pylint: disable=broad-except  (no such class: another torch)
            pass
        _CODES.append(codes)
    return _CODES[0]


def segment(which):
    """The ctx of the reentrant checkpoint whose forward (FORWARD) or backward
    (BACKWARD) is running on this thread below the caller, or None."""
    code = _codes()[which]
    if code is None:
        return None
    f = sys._getframe(1)  # pylint: disable=protected-access
    while f is not None:
        if f.f_code is code:
            return f.f_locals.get("ctx")
        f = f.f_back
    return None
