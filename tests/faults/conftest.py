"""The fault tests share the scenarios' helpers (tests/scenarios/scenario_lib.py: the
collector process, the model, the training loop) and the metrics format checker
(tests/metrics/expfmt.py); this puts both on the import path."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _d in ("../scenarios", "../metrics"):
    sys.path.insert(0, os.path.normpath(os.path.join(_HERE, _d)))
