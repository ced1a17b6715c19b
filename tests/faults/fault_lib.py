"""Helpers of the fault tests: reading a live collector's /metrics, a local webhook
receiver, and reading run logs back with `lockstep inspect`."""
import http.server
import json
import subprocess
import threading
import time

import expfmt


def metric(col, name, default=None, **labels):
    """One sample of the collector's /metrics (default when the family or sample is
    not there yet)."""
    fams = expfmt.parse(col.metrics_text())
    try:
        return expfmt.value(fams, name, **labels)
    except (KeyError, AssertionError):
        if default is None:
            raise
        return default


def poll(what, fn, timeout=20.0, interval=0.02):
    """Calls fn until it returns something true; returns it, or fails naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


class WebhookReceiver:
    """A generic-format webhook on 127.0.0.1: keeps every alert POSTed to it."""

    def __init__(self):
        self.alerts = []
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    outer.alerts.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/hook" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def inspect_records(exe, path):
    res = subprocess.run([exe, "inspect", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in res.stdout.splitlines() if x.strip()]


def inspect_summary(exe, path):
    res = subprocess.run([exe, "inspect", "--summary", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.strip()]
    assert len(rows) == 1, rows
    return rows[0]


def missing_seqs(records):
    """Sequence numbers never logged, counted independently of the collector: every
    number below the highest one seen that is not in the log (one rank, one session)."""
    seqs = {r["seq"] for r in records}
    return sorted(set(range(max(seqs) + 1)) - seqs) if seqs else []


def identity(alert):
    """What makes one alert instance (as the alerting journal keys it, plus tensor/kind)."""
    return (alert["rule"], alert["severity"], tuple(alert.get("runs") or ()), alert.get("rank", 0),
            alert.get("tensor", ""), alert.get("kind", ""), alert["step"])
