"""`lockstep report` (issue 19): the HTML page of a real recorded pair, opened in a real
browser (Debian's chromium, headless, driven over the DevTools protocol by cdp.py).

- The page of a 60-step pair whose candidate drifts from step 30: the verdict is the
  one `lockstep compare` gives, the heatmap and the curves drew, the initial weights
  (compared at step 0 only) are one line of text instead of grey heatmap rows, a click
  on a heatmap cell opens that tensor's history, no request left the page, a screenshot is saved
  into the build dir (LOCKSTEP_REPORT_OUT).
- The report from a collector's data dir, and its exit codes.
- Size and speed: a 1,000-step x 500-tensor pair makes a file under 5 MB; the time
  chromium takes to open and draw it is printed (and bounded generously).
"""
import json
import os
import pathlib
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from cdp import Browser, find_chromium
from report_lib import TIME_SCALE, Collector

OUT_DIR = os.environ.get("LOCKSTEP_REPORT_OUT", "")
DRIFT_AFTER = 30
INIT_TENSORS = 6  # kind param, compared at step 0 only: a line of text, not heatmap rows


def report(exe, *args):
    return subprocess.run([exe, "report", *args], capture_output=True, text=True, timeout=120 * TIME_SCALE)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pair")
    with Collector(tmp) as col:
        logs = col.run_pair("rep", tensors=24, steps=60, drift_after=DRIFT_AFTER,
                            init_tensors=INIT_TENSORS)
        col.wait_goodbye(["rep-base", "rep-cand"])
    return col, logs, tmp


def chromium_or_skip():
    exe = find_chromium()
    if exe is None:
        pytest.skip("chromium is not installed (scripts/setup installs Debian's chromium): the page was not "
                    "opened in a browser")
    return exe


def open_page(browser, path):
    url = pathlib.Path(path).resolve().as_uri()
    t0 = time.monotonic()
    browser.navigate(url)
    deadline = time.monotonic() + 30
    while browser.eval("document.body.dataset.ready || ''") != "1":
        assert time.monotonic() < deadline, "the page never finished drawing: %s" % browser.console_errors()
        time.sleep(0.01)
    return url, time.monotonic() - t0


def test_report_page_in_a_browser(pair):
    col, (base, cand), tmp = pair
    html = str(tmp / "report.html")
    out = report(col.exe, base, cand, "-o", html)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("report: " + html), out.stdout
    cmp_out = subprocess.run([col.exe, "compare", "--json", base, cand], capture_output=True, text=True, timeout=60 * TIME_SCALE)
    expected = json.loads(cmp_out.stdout)
    assert expected["first_divergence"]["step"] == DRIFT_AFTER, cmp_out.stdout[:2000]

    text = open(html, encoding="utf-8").read()
    # Self-contained: nothing to fetch, and the browser is told so.
    assert "default-src 'none'" in text and "connect-src 'none'" in text
    for needle in ("http://", "https://", "src=", "@import", "url("):
        assert needle not in text.replace("http://www.w3.org/2000/svg", ""), needle

    exe = chromium_or_skip()
    with Browser(exe) as b:
        url, secs = open_page(b, html)
        assert b.console_errors() == []
        verdict = b.eval("document.querySelector('.verdict').innerText")
        assert "FAIL" in verdict and expected["verdict"]["lines"][0] in verdict, verdict
        assert "step %d" % DRIFT_AFTER in verdict, verdict
        # The heatmap drew: coloured pixels, and more red (drift) on the right half of
        # the drifting tensors than on the left.
        drawn = b.eval("""(() => { const c = document.getElementById('heatmap'); const x = c.getContext('2d');
            const d = x.getImageData(0, 0, c.width, c.height).data; let n = 0;
            for (let i = 0; i < d.length; i += 4) if (!(d[i] === 255 && d[i+1] === 255 && d[i+2] === 255)) n++;
            return [n, c.width, c.height]; })()""")
        assert drawn[0] > 0.3 * drawn[1] * drawn[2] * 0.5, drawn
        # The initial weights are not heatmap rows (each would be grey but for one cell):
        # one line says how many and how they compared; the table still lists them.
        rows_drawn = b.eval("+document.getElementById('heatmap').dataset.rows")
        assert rows_drawn == 24, rows_drawn
        once = b.eval("document.getElementById('once').innerText")
        assert once.startswith("%d tensors compared at one step only (step 0: param)" % INIT_TENSORS) \
            and "all within tolerance" in once, once
        # The last tensor (drifting) is red at the last step, not at the first.
        corner = b.eval("""(() => { const c = document.getElementById('heatmap'), x = c.getContext('2d');
            const lw = +c.dataset.lw, cw = +c.dataset.cw, rh = +c.dataset.rh, rows = +c.dataset.rows, cols = D.ds.cols;
            const px = (col) => Array.from(x.getImageData(lw + col * cw + 1, (rows - 1) * rh + 1, 1, 1).data);
            return [px(0), px(cols - 1)]; })()""")
        assert corner[1][0] > 150 and corner[1][1] < 120, corner
        assert not (corner[0][0] > 150 and corner[0][1] < 120), corner
        # Curves: both runs' loss and step time, each path with many points.
        paths = b.eval("[...document.querySelectorAll('#curves path.series')].map(p => (p.getAttribute('d').match(/L/g) || []).length)")
        assert len(paths) >= 6 and min(paths[:2]) >= 50, paths
        assert "candidate takes" in b.eval("document.getElementById('steptime').innerText")
        # Click the last column of the last row (a drifting tensor): its history shows.
        pos = b.eval("""(() => { const c = document.getElementById('heatmap'), r = c.getBoundingClientRect();
            c.scrollIntoView(); const r2 = c.getBoundingClientRect();
            const lw = +c.dataset.lw, cw = +c.dataset.cw, rh = +c.dataset.rh, rows = +c.dataset.rows, cols = D.ds.cols;
            return [r2.left + lw + (cols - 1) * cw + cw / 2, r2.top + (rows - 1) * rh + rh / 2, D.rows[rows - 1][0]]; })()""")
        b.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=pos[0], y=pos[1])
        tip = b.eval("document.getElementById('tip').innerText")
        assert pos[2] in tip and "step 59" in tip and "l2 candidate" in tip, tip  # hover: the numbers
        b.click(pos[0], pos[1])
        hist = b.eval("document.getElementById('history').innerText")
        assert pos[2] in hist and "drift" in hist, hist
        hpaths = b.eval("[...document.querySelectorAll('#history path.series')].map(p => p.getAttribute('d').length)")
        assert len(hpaths) >= 3 and min(hpaths) > 100, hpaths
        # The table sorts and filters.
        n_rows = b.eval("document.querySelectorAll('#tbl tbody tr').length")
        assert n_rows == 24 + INIT_TENSORS
        b.eval("(() => { const i = document.getElementById('tfilter'); i.value = 'layers.5.'; i.dispatchEvent(new Event('input')); })()")
        assert b.eval("document.querySelectorAll('#tbl tbody tr').length") == 4
        # No request left the page: the page itself only.
        assert b.requests() == [url], b.requests()
        assert b.eval("performance.getEntriesByType('resource').length") == 0
        if OUT_DIR:
            os.makedirs(OUT_DIR, exist_ok=True)
            b.screenshot(os.path.join(OUT_DIR, "report.png"))
            assert os.path.getsize(os.path.join(OUT_DIR, "report.png")) > 10000
        print("report page: %d bytes, opened and drawn in %.2f s" % (len(text), secs))


def test_report_from_data_dir_and_exit_codes(pair):
    col, (base, cand), tmp = pair
    html = str(tmp / "dd.html")
    out = report(col.exe, "--data-dir", col.data_dir, "--experiment", "rep", "-o", html)
    assert out.returncode == 0, out.stderr
    text = open(html, encoding="utf-8").read()
    assert '"baseline":"rep-base"' in text and '"candidate":"rep-cand"' in text
    out = report(col.exe, "--data-dir", col.data_dir, "--experiment", "nope", "-o", html)
    assert out.returncode == 3 and "experiments there: 'rep'" in out.stderr, out.stderr
    out = report(col.exe, base, "-o", html)
    assert out.returncode == 2 and "give two run logs" in out.stderr, out.stderr
    out = report(col.exe, base, cand)
    assert out.returncode == 2 and "-o FILE" in out.stderr, out.stderr
    out = report(col.exe, base, str(tmp / "missing.lslog"), "-o", html)
    assert out.returncode == 3 and "missing.lslog" in out.stderr, out.stderr


def test_large_pair_is_small_and_fast(tmp_path):
    with Collector(tmp_path) as col:
        base, cand = col.run_pair("big", tensors=500, steps=1000, drift_after=100)
        col.wait_goodbye(["big-base", "big-cand"])
    html = str(tmp_path / "big.html")
    t0 = time.monotonic()
    out = report(col.exe, base, cand, "-o", html)
    gen_s = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    size = os.path.getsize(html)
    text = open(html, encoding="utf-8").read()
    assert size < 5 * 1024 * 1024, size
    assert '"ds":{"stride":' in text and '"stride":1,' not in text, text[:300]
    exe = chromium_or_skip()
    with Browser(exe) as b:
        _, secs = open_page(b, html)
        note = b.eval("document.querySelector('.note').innerText")
        assert "Downsampled" in note and "columns of" in note, note
        rows = b.eval("D.rows.length")
        assert rows == 500
        # The first divergence's neighbourhood, every step, below the merged heatmap.
        assert "neighbourhood every step" in note, note
        near = b.eval("JSON.stringify([D.near.anchor, D.near.cols[0], D.near.cols.length])")
        assert json.loads(near) == [100, 84, 33], near
        drawn = b.eval("""(() => { const c = document.getElementById('heatmap-near'); if (!c) return -1;
            const px = c.getContext('2d').getImageData(150, 0, c.width - 150, c.height - 16).data;
            let red = 0; for (let i = 0; i < px.length; i += 4) red += px[i] > 200 && px[i + 1] < 120;
            return red; })()""")
        assert drawn > 0, drawn
        head = b.eval("document.querySelector('#app h3').innerText")
        assert head == "Around the first divergence (step 100), every step: 84–116", head
    print("1000 steps x 500 tensors: report written in %.2f s, %.2f MB, opened and drawn by chromium in %.2f s"
          % (gen_s, size / 1e6, secs))
    assert secs < 10, secs


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode("utf-8")


def test_live_report_from_the_collector(tmp_path):
    with Collector(tmp_path, metrics=True) as col:
        assert col.http and col.http.startswith("127.0.0.1:"), col.http  # loopback by default
        base = "http://" + col.http
        status, _, index = get(base + "/")
        assert status == 200 and "No experiment has a compared pair yet" in index, index
        col.run_pair("live", tensors=16, steps=40, drift_after=20)
        col.wait_goodbye(["live-base", "live-cand"])
        status, _, index = get(base + "/")
        assert '<a href="/report?experiment=live">live</a>' in index, index
        status, ctype, data = get(base + "/report.json?experiment=live")
        assert ctype.startswith("application/json")
        d = json.loads(data)
        assert d["live"] and d["summary"]["steps_compared"] >= 39 and d["first_divergence"]["step"] == 20, data[:1500]
        assert len(d["rows"]) == 16 and d["ds"]["cols"] == 40
        status, ctype, page = get(base + "/report?experiment=live&refresh=1")
        assert ctype.startswith("text/html") and "connect-src 'self'" in page
        assert '"url":"/report.json?experiment=live","every_s":1' in page
        with pytest.raises(urllib.error.HTTPError) as e:
            get(base + "/report.json?experiment=nope")
        assert e.value.code == 404
        assert "lockstep_build_info" in get(base + "/metrics")[2]
        exe = chromium_or_skip()
        with Browser(exe) as b:
            url = base + "/report?experiment=live&refresh=1"
            b.navigate(url)
            deadline = time.monotonic() + 20
            while b.eval("document.body.dataset.ready || ''") != "1":
                assert time.monotonic() < deadline, b.console_errors()
                time.sleep(0.02)
            assert "live, refreshed every 1 s" in b.eval("document.getElementById('livebadge').innerText")
            # It fetches its data again (and only from the collector).
            deadline = time.monotonic() + 10
            while not [u for u in b.requests() if "/report.json" in u]:
                assert time.monotonic() < deadline, b.requests()
                b.eval("1")  # pumps the event stream
                time.sleep(0.1)
            assert all(u.startswith(base + "/") for u in b.requests()), b.requests()
            assert b.console_errors() == []
