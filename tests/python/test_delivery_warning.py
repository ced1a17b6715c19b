"""An agent that reaches no collector says so, once, naming the endpoint: one pointed at
a closed port, one at the collector's view feed (a PUB socket: the ZeroMQ handshake
fails on the socket type), and none for one at the real ingest port. Real sockets, a
real `lockstep collect`; the training loop is never blocked or raised into."""
import socket
import time
import warnings

import lockstep
from conftest import start_collector, stop_collector

WARN_AFTER_S = 5.0  # the agent's delivery_warn_after default


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_warning_per_endpoint_that_reaches_no_collector(tmp_path):
    col, info = start_collector(tmp_path, "--view-listen", "tcp://127.0.0.1:*")
    try:
        endpoints = {
            "closed": "tcp://127.0.0.1:%d" % closed_port(),
            "view": info["view"],
            "ingest": col.endpoint,
        }
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mons = {k: lockstep.Monitor(run="deliv-" + k, role="solo", endpoint=ep)
                    for k, ep in endpoints.items()}
            assert all(m.enabled for m in mons.values())
            t0 = time.monotonic()

            def said(ep):
                return [w for w in caught if ep in str(w.message)]

            # Steps go on as in training; the warning comes on a step() after the window.
            deadline = t0 + WARN_AFTER_S + 10
            while time.monotonic() < deadline:
                for m in mons.values():
                    t = time.perf_counter()
                    m.step(loss=0.5)
                    assert time.perf_counter() - t < 0.5  # never blocks
                if said(endpoints["closed"]) and said(endpoints["view"]):
                    break
                time.sleep(0.02)
            # Long enough past the window for the good agent's check too, then more steps:
            # still one warning each.
            end = max(time.monotonic(), t0 + WARN_AFTER_S) + 2.5
            while time.monotonic() < end:
                for m in mons.values():
                    m.step(loss=0.5)
                time.sleep(0.02)
            counters = {k: m.counters() for k, m in mons.items()}
            for m in mons.values():
                m.close(timeout=1.0)
        closed, view = said(endpoints["closed"]), said(endpoints["view"])
        assert len(closed) == 1, [str(w.message) for w in caught]
        assert len(view) == 1, [str(w.message) for w in caught]
        assert all(issubclass(w.category, RuntimeWarning) for w in closed + view)
        assert "no connection could be made" in str(closed[0].message)
        assert "refused the ZeroMQ handshake" in str(view[0].message), str(view[0].message)
        assert not said(endpoints["ingest"]), [str(w.message) for w in caught]
        assert counters["view"]["handshake_failures"] >= 1 and counters["view"]["delivery_problem"]
        assert counters["closed"]["handshakes"] == 0 and counters["closed"]["delivery_problem"]
        assert counters["ingest"]["handshakes"] >= 1 and not counters["ingest"]["delivery_problem"]
    finally:
        stop_collector(col)
