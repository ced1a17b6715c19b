"""The load harness shared by load_bench.py (the 2-minute benchmark) and
test_load_smoke.py (its short ctest form): one real `lockstep collect` on loopback and
N real `lockstep-loadgen` processes (the C++ agent library), paced to a schedule.

Shape of the load: the N agents are the ranks of two runs of one experiment, a
baseline and a candidate (N/2 ranks each, identical values, so the aligner and the
detectors do their full work and no alert fires), all stepping together from a common
wall-clock start, as the ranks of a data-parallel job do (the worst case: every rank's
batch arrives in the same instant). Each rank records TENSORS tensor statistics per
step (sketch K=32 and the 16-bin histogram: ~330 bytes each on the wire) and one
step-scalars record, at RATE steps/s for SECONDS seconds.

What is measured while it runs (a sampler thread, once a second): the collector's
RSS (VmRSS in /proc/PID/status) and CPU time (utime+stime in /proc/PID/stat); every
5 s it scrapes /metrics as a Prometheus would (the scrape is part of the load).

What "zero loss" means (check_zero_loss): for every (run, rank), both in the live
collector's registry (its /metrics) and in its run log (`lockstep inspect --summary`):
no sequence gap, no duplicate, no bad message, the agent reported no dropped record or
message, the Goodbye arrived, and the tensor records logged equal the records the
loadgen attempted (so nothing was refused at the agent's queue either), the scalar
records equal its steps. The loadgens' own counters must agree (records_sent ==
attempts, nothing dropped)."""
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

LOCKSTEP = os.environ.get("LOCKSTEP_BIN", "lockstep")
# scripts/bench sets LOCKSTEP_BIN only; the loadgen is built beside it.
LOADGEN = os.environ.get("LOCKSTEP_LOADGEN") or os.path.join(
    os.path.dirname(LOCKSTEP) or ".", "lockstep-loadgen")
EXPERIMENT = "load"
RUNS = (("load-base", "baseline"), ("load-cand", "candidate"))
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Collector:
    """`lockstep collect` with a temp data dir, /metrics on a free port, the view feed
    on (as by default) and its log in a file (a pipe nobody reads could block it)."""

    def __init__(self, work_dir, extra_args=()):
        self.data_dir = os.path.join(work_dir, "data")
        self.ready = os.path.join(work_dir, "ready.json")
        self.log_path = os.path.join(work_dir, "collect.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [LOCKSTEP, "collect", "--listen", "tcp://127.0.0.1:*", "--data-dir", self.data_dir,
             "--ready-file", self.ready, "--status-interval-s", "10", "--log-level", "info",
             "--metrics-listen", "127.0.0.1:0", "--view-listen", "tcp://127.0.0.1:*",
             *extra_args],
            stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.ready):
            if self.proc.poll() is not None:
                raise AssertionError(f"collector exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError("collector did not write its ready file in 20 s")
            time.sleep(0.01)
        with open(self.ready) as f:
            ready = json.load(f)
        self.endpoint = ready["listen"][0]
        self.metrics_url = f"http://{ready['metrics']}/metrics"
        self.pid = self.proc.pid

    def log_tail(self, n=20):
        self._log.flush()
        with open(self.log_path) as f:
            return "".join(f.readlines()[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(timeout=60)
            assert rc == 0, f"collector exited {rc}: {self.log_tail()}"
        self._log.close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)
        self._log.close()


def scrape(url):
    """/metrics as {(name, frozenset(labels.items())): value}."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r'^(\w+)(?:\{(.*)\})? (\S+)$', line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def per_rank(metrics, name):
    """{(run, rank): value} of a per-rank family."""
    res = {}
    for (n, labels), v in metrics.items():
        if n == name:
            d = dict(labels)
            res[(d["run"], int(d["rank"]))] = v
    return res


class Sampler(threading.Thread):
    """Samples a process's RSS (KiB) and CPU time (s) every `period` seconds:
    self.samples = [(monotonic t, rss_kib, cpu_s)], from /proc (costs the process
    nothing). With `metrics_url`, also scrapes /metrics every `scrape_every` samples, as
    a Prometheus would: self.scrapes = [(t, records/s gauge, analyzer buffered steps)]."""

    def __init__(self, pid, period=1.0, metrics_url=None, scrape_every=5):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.metrics_url, self.scrape_every = metrics_url, scrape_every
        self.samples = []
        self.scrapes = []
        self._halt = threading.Event()

    def read(self):
        with open(f"/proc/{self.pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        with open(f"/proc/{self.pid}/stat") as f:
            # Fields after the ")" that ends the command name: utime, stime are 14, 15.
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        return rss, cpu

    def run(self):
        next_t = time.monotonic()
        while not self._halt.is_set():
            try:
                rss, cpu = self.read()
            except (OSError, StopIteration):
                return
            self.samples.append((time.monotonic(), rss, cpu))
            if self.metrics_url and len(self.samples) % self.scrape_every == 0:
                try:
                    m = scrape(self.metrics_url)
                except OSError:
                    m = {}
                get = lambda name: next((v for (n, _), v in m.items() if n == name), float("nan"))
                self.scrapes.append((time.monotonic(), get("lockstep_collector_records_per_second"),
                                     get("lockstep_analyzer_buffered_steps")))
            next_t += self.period
            self._halt.wait(max(0.0, next_t - time.monotonic()))

    def stop(self):
        self._halt.set()
        self.join()

    def between(self, t0, t1):
        return [s for s in self.samples if t0 <= s[0] <= t1]


def machine_cpu():
    """(busy jiffies, total jiffies) of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def run_load(agents, tensors, rate, seconds, work_dir, log=print, drain_timeout_s=120):
    """Runs the load and returns a dict of figures, per-rank accounting and problems
    (a list of sentences; empty when nothing was lost). Leaves no process behind."""
    assert agents >= 2 and agents % 2 == 0, "agents: an even number (two runs of N/2 ranks)"
    steps = int(round(rate * seconds))
    ranks = agents // 2
    col = Collector(work_dir)
    procs = []
    try:
        sampler = Sampler(col.pid, metrics_url=col.metrics_url)
        sampler.start()
        # Every loadgen steps from the same instant, after all have started and
        # registered their tensors (0.1 s per process on a loaded 2-core box is plenty).
        start_unix = time.time() + 1.0 + 0.1 * agents
        start_ms = int(start_unix * 1000)
        for run, role in RUNS:
            for rank in range(ranks):
                procs.append(subprocess.Popen(
                    [LOADGEN, "--endpoint", col.endpoint, "--run", run, "--role", role,
                     "--experiment", EXPERIMENT, "--rank", str(rank), "--world-size", str(ranks),
                     "--tensors", str(tensors), "--steps", str(steps), "--steps-per-s", str(rate),
                     "--start-at-unix-ms", str(start_ms), "--close-timeout-ms", "30000"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        t_start = time.monotonic() + (start_unix - time.time())
        cpu_start = None
        busy0 = None
        agents_out = []
        while time.monotonic() < t_start:
            time.sleep(0.01)
        cpu_start = sampler.read()[1]
        busy0 = machine_cpu()
        log(f"load: {agents} agents x {tensors} tensors x {rate} steps/s for {seconds} s "
            f"({agents * (tensors + 1) * rate:.0f} records/s offered) into {col.endpoint}")
        for p in procs:
            out, err = p.communicate(timeout=seconds + 120)
            if p.returncode != 0:
                raise AssertionError(f"a loadgen exited {p.returncode}: {err.strip()}")
            agents_out.append(json.loads(out.strip().splitlines()[-1]))
        t_agents_done = time.monotonic()
        expected = {(a["run"], a["rank"]): a for a in agents_out}
        # Wait until the collector holds every rank's Goodbye (no fixed sleep): a rank's
        # messages arrive in order, so after its Goodbye nothing more of it will come.
        deadline = time.monotonic() + drain_timeout_s
        while True:
            m = scrape(col.metrics_url)
            fin = per_rank(m, "lockstep_rank_finished")
            if all(fin.get(k) == 1 for k in expected):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        t_all_in = time.monotonic()
        cpu_end = sampler.read()[1]
        busy1 = machine_cpu()
        sampler.stop()
        m = scrape(col.metrics_url)
        col.stop()
        summaries = {}
        for run, _ in RUNS:
            out = subprocess.run([LOCKSTEP, "inspect", "--summary",
                                  os.path.join(col.data_dir, f"{run}.lslog")],
                                 capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise AssertionError(f"inspect --summary {run}: {out.stderr.strip()}")
            for line in out.stdout.splitlines():
                if line.strip():
                    r = json.loads(line)
                    summaries[(r["run"], r["rank"])] = r
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        col.kill()
        raise

    problems = check_zero_loss(expected, m, summaries, steps)
    # The load lasts `seconds` (steps at s/RATE for s < RATE*SECONDS, each one period
    # long), or longer when the collector held the last record only after that.
    load_s = max(float(seconds), t_all_in - t_start)
    records_logged = sum(s["records"] for s in summaries.values())
    attempted = sum(a["attempts"] for a in agents_out) + steps * agents
    # RSS: mean of the samples in the first W seconds of the load against the mean of the
    # last W seconds (W = 60 s for the 2-minute bench: "last minute over first minute";
    # half the load for a shorter one).
    w = min(60.0, seconds / 2.0)
    t_end = t_start + seconds
    first = [s[1] for s in sampler.between(t_start, t_start + w)]
    last = [s[1] for s in sampler.between(t_end - w, t_end)]
    rss_first = sum(first) / max(1, len(first))
    rss_last = sum(last) / max(1, len(last))
    db = busy1[0] - busy0[0]
    dt = busy1[1] - busy0[1]
    res = {
        "agents": agents, "tensors": tensors, "rate": rate, "seconds": seconds,
        "offered_records_per_s": agents * (tensors + 1) * rate,
        "records_attempted": attempted,
        "records_logged": records_logged,
        "lost_records": attempted - records_logged,
        # Records in the collector's logs over the load's duration (load_s): the
        # offered rate when all arrive in time, less when the collector lags behind.
        "records_per_s": records_logged / load_s,
        "load_s": load_s,
        "drain_s": t_all_in - t_agents_done,
        "rss_first_mib": rss_first / 1024, "rss_last_mib": rss_last / 1024,
        "rss_peak_mib": max((s[1] for s in sampler.samples), default=0) / 1024,
        "rss_growth_pct": 100.0 * (rss_last - rss_first) / rss_first if rss_first else float("nan"),
        # CPU time of the collector over the load, in percent of one core.
        "collector_cpu_pct": 100.0 * (cpu_end - cpu_start) / (t_all_in - t_start),
        # The whole machine's busy share over the load (all cores; 100 = saturated).
        "machine_busy_pct": 100.0 * db / dt if dt else float("nan"),
        # The aligner's share: (rank, step)s compared between the two runs (all of
        # them: ranks x steps, when analysis kept up) and any evicted by its memory bound.
        "pair_compared_steps": int(sum(v for (n, _), v in m.items()
                                       if n == "lockstep_pair_compared_steps_total")),
        "pair_evicted_steps": int(sum(v for (n, _), v in m.items()
                                      if n == "lockstep_pair_evicted_steps_total")),
        "late_steps": sum(a["late_steps"] for a in agents_out),
        "max_lag_ms": max(a["max_lag_ms"] for a in agents_out),
        "samples": sampler.samples, "scrapes": sampler.scrapes, "t_start": t_start,
        "problems": problems, "agents_out": agents_out, "summaries": summaries,
    }
    return res


def check_zero_loss(expected, metrics, summaries, steps):
    """Returns a list of problems (sentences); empty when every record arrived."""
    problems = []
    live = {name: per_rank(metrics, f"lockstep_rank_{name}")
            for name in ("records_total", "missing_messages", "duplicate_messages_total",
                         "bad_messages_total", "agent_dropped_records_total",
                         "agent_dropped_messages_total", "finished")}
    for key, a in sorted(expected.items()):
        who = f"{key[0]} rank {key[1]}"
        for f in ("refused", "records_dropped", "messages_dropped", "other_dropped", "errors"):
            if a[f]:
                problems.append(f"{who}: the loadgen reports {f}={a[f]}")
        if a["records_sent"] != a["attempts"] or not a["closed"]:
            problems.append(f"{who}: the loadgen sent {a['records_sent']} of {a['attempts']} "
                            f"records (closed={a['closed']})")
        want = a["attempts"] + steps
        if live["records_total"].get(key) != want:
            problems.append(f"{who}: /metrics counts {live['records_total'].get(key)} records, "
                            f"{want} were sent")
        for name in ("missing_messages", "duplicate_messages_total", "bad_messages_total",
                     "agent_dropped_records_total", "agent_dropped_messages_total"):
            if live[name].get(key, 0) != 0:
                problems.append(f"{who}: /metrics lockstep_rank_{name} = {live[name][key]}")
        if live["finished"].get(key) != 1:
            problems.append(f"{who}: the collector saw no Goodbye")
        s = summaries.get(key)
        if s is None:
            problems.append(f"{who}: not in the run log")
            continue
        if s["stat_records"] != a["attempts"] or s["scalar_records"] != steps:
            problems.append(f"{who}: the log holds {s['stat_records']} tensor and "
                            f"{s['scalar_records']} scalar records, {a['attempts']} and {steps} "
                            f"were sent")
        if s["messages"] != a["messages_sent"] or s["first_seq"] != 0 or \
                s["last_seq"] != a["messages_sent"] - 1:
            problems.append(f"{who}: the log holds {s['messages']} messages (seq "
                            f"{s['first_seq']}..{s['last_seq']}), {a['messages_sent']} were sent")
        for f in ("gaps", "duplicates", "bad_messages", "agent_records_dropped",
                  "agent_messages_dropped"):
            if s[f]:
                problems.append(f"{who}: the log's summary has {f}={s[f]}")
        if not s["goodbye"]:
            problems.append(f"{who}: no Goodbye in the log")
    return problems


def remove_work_dir(path):
    shutil.rmtree(path, ignore_errors=True)
