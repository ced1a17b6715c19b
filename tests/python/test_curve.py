"""CURVE between the Python agent and a real `lockstep collect --curve-key
--curve-authorized-keys` (docs/security.md): keys made by `lockstep keygen`; an
authorized agent's training loop lands in the log; an agent with an unlisted key or
without CURVE is refused and counted (on /metrics), and its training loop does not
notice."""
import os
import re
import subprocess
import time
import urllib.request

import pytest
import torch

import lockstep
from conftest import lockstep_bin, start_collector, stop_collector
from model_zoo import TinyTransformer, synthetic_batches


def keygen(tmp_path, name):
    out = subprocess.run([lockstep_bin(), "keygen", str(tmp_path / name)], capture_output=True,
                         text=True, timeout=30, check=True)
    assert "public key:" in out.stdout
    assert oct(os.stat(tmp_path / (name + ".key")).st_mode & 0o777) == "0o600"
    return tmp_path / (name + ".key"), tmp_path / (name + ".pub")


def refused(metrics_addr, reason):
    text = urllib.request.urlopen("http://%s/metrics" % metrics_addr, timeout=5).read().decode()
    m = re.search(r'^lockstep_collector_refused_connections_total\{reason="%s"\} (\S+)$' % reason,
                  text, re.M)
    return float(m.group(1)) if m else None


def train(mon, steps=2):
    torch.manual_seed(0)
    model = TinyTransformer()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon.watch(model, optimizer=opt)
    for x, y in synthetic_batches(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss=loss)


@pytest.fixture
def curve_collector(tmp_path):
    if lockstep_bin() is None:
        pytest.skip("build/lockstep not built (LOCKSTEP_BIN unset)")
    col_key, col_pub = keygen(tmp_path, "collector")
    agent_key, agent_pub = keygen(tmp_path, "agent")
    c, info = start_collector(tmp_path, "--curve-key", str(col_key), "--curve-authorized-keys",
                              str(agent_pub), "--metrics-listen", "127.0.0.1:0",
                              "--view-listen", "off")
    yield c, info["metrics"], col_pub, agent_key
    stop_collector(c)


def test_authorized_agent_lands_in_the_log(curve_collector):
    c, _, col_pub, agent_key = curve_collector
    mon = lockstep.Monitor(run="curve-ok", role="solo", endpoint=c.endpoint,
                           curve_server_key=str(col_pub), curve_key=str(agent_key), strict=True)
    train(mon)
    assert mon.close(timeout=10.0)
    records = c.inspect("curve-ok")
    assert any(r["type"] == "Goodbye" for r in records)
    assert any(r["type"] == "StepStats" for r in records)


def test_unlisted_and_plain_agents_are_refused_and_counted(curve_collector, tmp_path, monkeypatch):
    c, metrics, col_pub, _ = curve_collector
    server_key = [l.split('"')[1] for l in col_pub.read_text().splitlines()
                  if l.startswith("public-key")][0]
    # A fresh key pair (no curve_key) holding the right server key, from the environment.
    monkeypatch.setenv("LOCKSTEP_CURVE_SERVER_KEY", server_key)
    stranger = lockstep.Monitor(run="curve-stranger", endpoint=c.endpoint, strict=True)
    monkeypatch.delenv("LOCKSTEP_CURVE_SERVER_KEY")
    plain = lockstep.Monitor(run="curve-plain", endpoint=c.endpoint, strict=True)
    t0 = time.monotonic()
    train(stranger)
    train(plain)
    # A plain peer is `no_curve` when the collector sees the mismatch first, `other`
    # when the peer does and hangs up; the unlisted key is always `unauthorized_key`.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if refused(metrics, "unauthorized_key") >= 1 and \
                refused(metrics, "no_curve") + refused(metrics, "other") >= 1:
            break
        time.sleep(0.1)
    assert refused(metrics, "unauthorized_key") >= 1
    assert refused(metrics, "no_curve") + refused(metrics, "other") >= 1
    # Refused agents never block the job: close gives up after its timeout.
    stranger.close(timeout=1.0)
    plain.close(timeout=1.0)
    assert time.monotonic() - t0 < 30
    assert not os.path.exists(c.log_path("curve-stranger"))
    assert not os.path.exists(c.log_path("curve-plain"))


def test_curve_configuration_mistakes_are_one_sentence(tmp_path):
    with pytest.raises(ValueError, match="needs curve_server_key"):
        lockstep.Monitor(run="x", curve_key=str(tmp_path / "a.key"), strict=True)
    with pytest.raises(ValueError, match="neither a 40-character Z85 key"):
        lockstep.Monitor(run="x", curve_server_key="short", strict=True)
    pub = tmp_path / "c.pub"
    pub.write_text('public-key = "short"\n')
    with pytest.raises(ValueError, match="line 1"):
        lockstep.Monitor(run="x", curve_server_key=str(pub), strict=True)
    # Without strict: a warning and a disabled monitor, never an exception.
    with pytest.warns(Warning):
        mon = lockstep.Monitor(run="x", curve_server_key="short")
    assert not mon.enabled
