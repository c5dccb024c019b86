"""Nothing outside the job can stop or poison it (issue 18, DESIGN guarantee
13), tried from the network side: outsiders on every TCP port a two-host job
opens, a process that runs out of file descriptors, and slow metrics clients.
Real odbd processes, real sockets; "hosts" are network namespaces joined by a
veth pair (as in test_multi_host.py, with names of their own)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest

from odbtest import BIN, Daemon, consume, epochs, finish, metric_value, produce, run_epoch, network_namespaces, scrape

NS = ("odb-hna", "odb-hnb")
ADDR = ("10.213.9.1", "10.213.9.2")
ATTACKER = os.path.join(os.path.dirname(__file__), "netattack.py")


@pytest.fixture
def two_hosts():
    with network_namespaces(NS, ADDR, "odbhnveth"):
        yield


def listening_tcp(ns: str) -> list[str]:
    """Every TCP port listening in a namespace ("host"): only odbd runs there."""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnH"], check=True, capture_output=True,
                         text=True).stdout
    return sorted({line.split()[3] for line in out.splitlines() if line.strip()})


def test_outsiders_on_every_tcp_port_of_a_two_host_job_change_nothing(tmp_path, two_hosts):
    """From the other host, an outside process attacks every TCP port of each
    daemon (payload exchange, Gloo, metrics) for the whole epoch: ZeroMQ
    clients that claim to be a peer rank and send garbage and forged,
    well-formed payloads of that rank's samples, raw garbage, and a flood of
    silent connections held open. The exchange refuses them all (only keys the
    job's daemons announced get in), and the epoch arrives whole: every sample
    exactly once, every byte as produced (the consumers verify the payloads),
    samples moved between the hosts."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    daemons, attackers = [], []
    stop = tmp_path / "stop-attack"
    try:
        for rank in range(2):
            config = (f"local_world_size: 1\nmetrics_endpoint: \"tcp://{ADDR[rank]}:*\"\n"
                      f"alignment: {{gloo_hostname: {ADDR[rank]}, planner: global}}\ngrouping: {{window: 64}}\n")
            daemons.append(Daemon(tmp_path, rank=rank, world=2, config=config, job_id=job,
                                  prefix=["ip", "netns", "exec", NS[rank]]))
        for d in daemons:
            d.wait_log("payload exchange ready")
        ports = [listening_tcp(ns) for ns in NS]
        for rank, d in enumerate(daemons):
            # Every port odbd listens on is attacked: the payload exchange and
            # metrics (Gloo's pairs listen only while the mesh forms; once it
            # is up they are connected sockets, and nothing of Gloo listens).
            log = d.read_log()
            exchange = re.search(r"peer endpoint tcp://(\S+)", log).group(1)
            metrics = re.search(r"metrics endpoint tcp://(\S+)", log).group(1)
            assert {exchange, metrics} <= set(ports[rank]), (ports[rank], exchange, metrics)
        env = dict(os.environ, ODB_PROTO_DIR=str(BIN / "proto"))
        for rank in range(2):
            attackers.append(subprocess.Popen(
                ["ip", "netns", "exec", NS[1 - rank], sys.executable, ATTACKER, str(stop), *ports[rank]],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        # The attack is under way (each exchange has refused an outsider)
        # before the epoch starts, and goes on until it ends.
        for d in daemons:
            d.wait_log("payload exchange: refused a connection")
        results = run_epoch(daemons, [600, 300])
        stop.touch()
        reports = []
        for a in attackers:
            out, err = a.communicate(timeout=120)
            assert a.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
        for d in daemons:
            assert d.proc.poll() is None, d.read_log()
    finally:
        stop.touch()
        for a in attackers:
            if a.poll() is None:
                a.kill()
        for d in daemons:
            d.stop()
    got = sorted(i for e in results for i in e["ids"])
    assert got == list(range(600)) + list(range(1_000_000, 1_000_300))
    assert all(e["duplicates"] == 0 for e in results)
    assert sum(e["moved_in"] for e in results) > 0  # payloads crossed the link during the attack
    for r in reports:
        assert r["forged"] > 0 and r["zmq_garbage"] > 0 and r["flood"] > 0, r
    for d in daemons:
        log = d.read_log() if not d.log.closed else d.log_path.read_text()
        assert "CURVE-authenticated" in log


def test_running_out_of_descriptors_refuses_connections_and_serves_the_connected(tmp_path):
    """odbd under a limit of 256 descriptors, its trainer and a producer
    connected mid-epoch, then 600 more connections to its ingest socket: odbd
    logs the exhausted resource and refuses what it cannot hold (it used to
    abort in libzmq's ipc listener), counts it in a metric that can still be
    scraped, and serves the connected on; once the flood is gone a new
    producer gets in, and the epoch arrives whole."""
    d = Daemon(tmp_path, config='metrics_endpoint: "tcp://127.0.0.1:*"\n',
               prefix=["prlimit", "--nofile=256:256", "--"], log_level="debug")
    flood: list[socket.socket] = []
    try:
        d.wait_ready()
        # Two producers expected: the epoch stays open while producer a waits.
        c = consume(d.trainer, expected_producers=2)
        p = produce(d.ingest, "a", 2000, seed=1, extra=["--max-len", "64"])
        d.wait_log("producer 'a' connected")  # its hello (a debug line)
        path = d.ingest[len("ipc://"):]
        exhausted = "file descriptors exhausted: refused a connection on ipc://"
        deadline = time.time() + 120
        # 600 connections held open, more than the limit allows (a full
        # backlog refuses a connect before odbd sees it: that one is retried).
        while len(flood) < 600 and time.time() < deadline:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            try:
                s.connect(path)
                flood.append(s)
            except OSError:
                s.close()
                if exhausted in d.read_log():
                    break
                time.sleep(0.01)  # the backlog drains at odbd's pace
        d.wait_log(exhausted)
        assert d.proc.poll() is None, d.read_log()
        # The counters stay readable while producers exhaust descriptors.
        host, port = re.search(r"metrics endpoint tcp://([0-9.]+):(\d+)", d.read_log()).groups()
        assert metric_value(scrape(f"{host}:{port}"), "odb_connections_refused_no_descriptors_total") > 0
        assert finish(p)[0] == 0  # producer a, connected before the flood, ended its stream
        for s in flood:
            s.close()
        flood.clear()
        p = produce(d.ingest, "b", 1000, seed=2, id_offset=100000, extra=["--max-len", "64"])
        assert finish(p)[0] == 0
        rc, out, err = finish(c, timeout=180)
        assert rc == 0, err + d.read_log()
        (e,) = epochs(out)
        assert sorted(e["ids"]) == list(range(2000)) + list(range(100000, 101000))
        assert e["duplicates"] == 0
        assert d.proc.poll() is None
        assert "file descriptors: limit 256 " in d.read_log()  # the budget was logged at start
    finally:
        for s in flood:
            s.close()
        d.stop()


def test_slow_and_silent_metrics_clients_never_blind_the_endpoint(tmp_path):
    """Three clients trickle a request a byte at a time, forever, and forty
    more connect and say nothing (more than the server keeps open): scrapes
    are still answered at once, an epoch runs, and the tricklers are cut off
    by the per-connection deadline however steadily they send."""
    d = Daemon(tmp_path, config='metrics_endpoint: "tcp://127.0.0.1:*"\n')
    stop = threading.Event()
    cut_off = []
    threads = []
    silent: list[socket.socket] = []
    try:
        d.wait_ready()
        d.wait_log("metrics endpoint tcp://")
        host, port = re.search(r"metrics endpoint tcp://([0-9.]+):(\d+)", d.read_log()).groups()
        port = int(port)

        def trickle():
            s = socket.create_connection((host, port), timeout=10)
            request = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100000
            for i in range(len(request)):
                if stop.is_set():
                    break
                try:
                    s.send(request[i:i + 1])
                except OSError:
                    cut_off.append(1)
                    break
                time.sleep(0.2)  # the client's pace: slow, never silent for 2 s
            s.close()

        threads = [threading.Thread(target=trickle) for _ in range(3)]
        for t in threads:
            t.start()
        silent = [socket.create_connection((host, port), timeout=10) for _ in range(40)]
        c = consume(d.trainer, expected_producers=1)
        p = produce(d.ingest, "a", 500, seed=1)
        for _ in range(5):
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
                assert r.status == 200 and metric_value(r.read().decode(), "odb_samples_received_total") >= 0  # whole and valid
        assert finish(p)[0] == 0
        rc, out, err = finish(c)
        assert rc == 0, err + d.read_log()
        (e,) = epochs(out)
        assert sorted(e["ids"]) == list(range(500))
        deadline = time.time() + 60
        while len(cut_off) < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert len(cut_off) == 3
        assert metric_value(scrape(f"{host}:{port}"), "odb_metrics_connections_dropped_total") >= 3
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for s in silent:
            s.close()
        d.stop()
