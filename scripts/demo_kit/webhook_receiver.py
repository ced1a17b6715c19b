#!/usr/bin/env python3
"""A local webhook receiver for the lockstep demo: prints each alert it is sent.

Listens on 127.0.0.1 (a free port unless --port), writes the port to --port-file once
listening, prints one line per alert POSTed to it (lockstep's generic JSON format) and
appends the raw JSON to --out. Stops on SIGTERM/SIGINT.
"""
import argparse
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--out", required=True, help="append every alert received as a JSON line")
    p.add_argument("--quiet", action="store_true", help="do not print alerts")
    args = p.parse_args()

    out = open(args.out, "a", buffering=1)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"ok":true}')
            try:
                alert = json.loads(body)
            except ValueError:
                print(f"[webhook] received {n} bytes that are not JSON", flush=True)
                return
            out.write(json.dumps(alert, sort_keys=True) + "\n")
            if not args.quiet:
                sev = str(alert.get("severity", "?")).upper()
                print(f"[webhook] {sev:8s} {alert.get('rule', '?')}: {alert.get('message', '')}",
                      flush=True)

        def log_message(self, *a):  # no per-request access log
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    try:
        srv.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass


if __name__ == "__main__":
    main()
