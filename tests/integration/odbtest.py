"""Helpers for the multi-process integration tests: real odbd processes, real sockets."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

ROOT = Path(__file__).resolve().parents[2]
# ODB_TEST_BIN: another tree laid out as .build/ (e.g. a private build while .build/ is shared).
BIN = Path(os.environ.get("ODB_TEST_BIN", ROOT / ".build"))
ODBD = BIN / "src/daemon/odbd"
SYNTH = BIN / "client/cpp/odb_synth"
sys.path.insert(0, str(BIN / "proto"))


def require_built() -> None:
    for path in (ODBD, SYNTH, BIN / "proto/odb_pb2.py"):
        if not path.exists():
            raise RuntimeError(f"{path} is missing: run ./scripts/build.sh first")


class Daemon:
    """One odbd process with its own run_dir; stopped (and its log kept) by stop()."""

    def __init__(self, run_dir: Path, rank: int = 0, world: int = 1, config: str = "",
                 job_id: str | None = None, log_level: str = "info", extra_env: dict | None = None,
                 prefix: list[str] | None = None):
        require_built()
        self.run_dir = run_dir
        self.rank = rank
        run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = run_dir / f"odbd-{rank}.yaml"
        self.config_path.write_text(config)
        self.log_path = run_dir / f"odbd-{rank}.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        env.update(extra_env or {})
        # Under a wrapper (unshare, timeout, ...) odbd is the wrapper's child, not ours: a session of
        # its own lets stop() signal the whole process group, or the daemon outlives the test.
        self.wrapped = bool(prefix)
        self.proc = subprocess.Popen(
            (prefix or []) + [str(ODBD), "--config", str(self.config_path), "--rank", str(rank), "--world-size",
             str(world), "--run-dir", str(run_dir), "--job-id", job_id or f"t-{uuid.uuid4().hex[:8]}",
             "--log-level", log_level],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=self.wrapped)

    @property
    def ingest(self) -> str:
        return f"ipc://{self.run_dir}/odb-{self.rank}-in.sock"

    @property
    def trainer(self) -> str:
        return f"ipc://{self.run_dir}/odb-{self.rank}-out.sock"

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        sock = Path(self.ingest[len("ipc://"):])
        while time.time() < deadline:
            if sock.exists() and Path(self.trainer[len("ipc://"):]).exists():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"odbd exited early ({self.proc.returncode}):\n{self.read_log()}")
            time.sleep(0.05)
        raise TimeoutError(f"odbd rank {self.rank} not ready after {timeout}s:\n{self.read_log()}")

    def read_log(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float = 60.0) -> None:
        """Waits until the daemon's log contains `text` (an event, not a sleep, as synchronisation)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text in self.read_log():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"odbd exited ({self.proc.returncode}) before logging {text!r}:\n"
                                   f"{self.read_log()}")
            time.sleep(0.05)
        raise TimeoutError(f"odbd rank {self.rank} did not log {text!r} within {timeout}s:\n{self.read_log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.wrapped:
            stop_group(self.proc, sig, timeout)
        elif self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _group_members(pgid: int) -> list[int]:
    """The pids of process group `pgid` (zombies excluded: they are gone but for their parent)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Stops a process started with start_new_session=True and everything in its process group
    (a wrapper's children: `unshare --pid --fork` does not pass SIGTERM on). `sig` to the group,
    then SIGKILL to whatever is left after `timeout`; returns once the group is empty."""
    pgid = proc.pid
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while _group_members(pgid) and time.monotonic() < deadline:
        proc.poll()  # reaps the wrapper
        time.sleep(0.05)  # polling for exits of processes that are not our children
    if _group_members(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while _group_members(pgid):
            proc.poll()
            time.sleep(0.05)
    proc.wait()


@contextlib.contextmanager
def network_namespaces(names: tuple[str, str], addrs: tuple[str, str], veth: str):
    """Two hosts on one machine: network namespaces `names` joined by a veth pair
    (`<veth>0`, `<veth>1`) with `addrs` (/24), removed on exit. Needs root."""
    import pytest

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI runs as root)")
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    try:
        for ns in names:
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", f"{veth}0", "netns", names[0], "type", "veth", "peer", "name", f"{veth}1",
           "netns", names[1])
        for i, ns in enumerate(names):
            ip("-n", ns, "addr", "add", f"{addrs[i]}/24", "dev", f"{veth}{i}")
            ip("-n", ns, "link", "set", f"{veth}{i}", "up")
        yield
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def produce(endpoint: str, producer_id: str, count: int, seed: int, id_offset: int = 0,
            extra: list[str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [str(SYNTH), "produce", "--endpoint", endpoint, "--producer-id", producer_id, "--count",
         str(count), "--seed", str(seed), "--id-offset", str(id_offset)] + (extra or []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def consume(endpoint: str, expected_producers: int, extra: list[str] | None = None,
            step_records: bool = False) -> subprocess.Popen:
    """A verifying odb_synth consumer; with step_records, each epoch JSON carries "steps_detail"
    (see step_records()) for check_step_invariants."""
    return subprocess.Popen(
        [str(SYNTH), "consume", "--endpoint", endpoint, "--expected-producers",
         str(expected_producers), "--timeout-ms", "60000"] + (["--step-records"] if step_records else [])
        + (extra or []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120.0) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def epochs(stdout: str) -> list[dict]:
    """Each epoch's JSON; "step_records" (odb_synth --step-records) become dicts in "steps_detail"."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            if "step_records" in e:
                e["steps_detail"] = [StepRecord(index=i, idle=idle, weight=w, real_tokens=t, global_real_tokens=g,
                                                lengths=lengths, epoch=e["epoch"], window=win[0], window_steps=win[1],
                                                window_loss_tokens=win[2], closes_window=win[3], loss_tokens=win[4])
                                     for i, idle, w, t, g, lengths, win in e.pop("step_records")]
            out.append(e)
    return out


@dataclass
class StepRecord:
    """One step as the trainer of one rank received it (header fields only)."""
    index: int
    idle: bool
    weight: float
    real_tokens: int          # the header's real_tokens of this rank
    # The header's T_tok: all ranks' real tokens of this step. None: the trainer never saw the
    # header (an IDLE step the Python loader drained itself under its "join" policy).
    global_real_tokens: int | None
    lengths: list             # tokens of each of this rank's samples (the step's own lengths)
    epoch: int = 0
    # The accumulation window (optimizer.tokens_per_step; None: not recorded, or a drained IDLE step):
    # its index in the epoch, its micro-step count, all ranks' loss tokens over it, whether this step
    # closes it, and this rank's loss tokens of the step.
    window: int | None = None
    window_steps: int | None = None
    window_loss_tokens: int | None = None
    closes_window: bool | None = None
    loss_tokens: int | None = None


def check_step_invariants(per_rank_steps: list[list[StepRecord]], world: int) -> None:
    """Asserts the alignment invariants of one epoch on every step, across all ranks:

    * every rank ran the same steps: step indices 0..N-1, in order, on every rank (the steps
      carry no round index, so equal sequences stand for "the same T every round");
    * IDLE steps have weight 0 and no samples;
    * t_r = sum of the step's own lengths (and the header's real_tokens agrees);
    * T_tok (global_real_tokens) is the same on every rank and equals sum_r t_r > 0;
    * w_r = W * t_r / T_tok and sum_r w_r = W, within 1e-9 relative (one step, one window);
    * with accumulation windows (records carry window fields): every rank has the same window,
      micro-step count and closing flag at every step, w_r = W * loss_tokens_r / window_loss_tokens,
      the weights sum to W over each window, only its last micro-step closes it, and the epoch's
      last step closes its window.

    Raises AssertionError naming the step and rank; also used on hand-made lists by
    test_step_invariants.py, which proves that it can fail."""
    assert len(per_rank_steps) == world, f"{len(per_rank_steps)} ranks' steps for world size {world}"
    counts = [len(steps) for steps in per_rank_steps]
    assert len(set(counts)) == 1, f"ranks ran different numbers of steps: {counts}"
    for r, steps in enumerate(per_rank_steps):
        indices = [s.index for s in steps]
        assert indices == list(range(len(steps))), \
            f"rank {r}: step indices are not 0..{len(steps) - 1} in order: {_first_gap(indices)}"
        assert len({s.epoch for s in steps}) <= 1, f"rank {r}: steps of several epochs {sorted({s.epoch for s in steps})}"
    tol = 1e-9 * world
    window_weight, window_tokens, window_first = 0.0, 0, 0
    for k in range(counts[0] if counts else 0):
        row = [steps[k] for steps in per_rank_steps]
        where = f"step {k}"
        t = []
        for r, s in enumerate(row):
            tr = sum(s.lengths)
            if s.idle:
                assert not s.lengths and s.real_tokens == 0, f"{where} rank {r}: IDLE step with samples {s.lengths}"
                assert s.weight == 0.0, f"{where} rank {r}: IDLE step with weight {s.weight!r}"
            else:
                assert s.lengths and all(n > 0 for n in s.lengths), f"{where} rank {r}: real step lengths {s.lengths}"
                assert s.real_tokens == tr, f"{where} rank {r}: real_tokens {s.real_tokens} != sum of lengths {tr}"
            t.append(tr)
        total = sum(t)
        assert total > 0, f"{where}: no rank has a real token (every rank IDLE)"
        globals_ = [s.global_real_tokens for s in row]
        assert all(g == total for g in globals_ if g is not None), \
            f"{where}: global_real_tokens per rank {globals_} != sum of the ranks' tokens {total} (t_r = {t})"
        seen = [s for s in row if s.window is not None]
        if not seen or all(s.window_steps == 1 for s in seen) and all(s.loss_tokens == tr for s, tr in
                                                                     zip(row, t) if s.window is not None):
            # One step, one window (no optimizer.tokens_per_step): the per-step weights.
            for r, s in enumerate(row):
                want = world * t[r] / total
                assert abs(s.weight - want) <= tol, \
                    f"{where} rank {r}: weight {s.weight!r} != W*t_r/T_tok = {world}*{t[r]}/{total} = {want!r}"
            weight_sum = sum(s.weight for s in row)
            assert abs(weight_sum - world) <= tol, \
                f"{where}: weights {[s.weight for s in row]} sum to {weight_sum!r}, not W = {world}"
        if not seen:
            continue
        # Accumulation windows: the same window, micro-step count and closing flag on every rank;
        # w_r = W * loss_tokens_r / window_loss_tokens; the weights sum to W over the window.
        first = seen[0]
        for r, s in enumerate(row):
            if s.window is None:
                assert s.idle, f"{where} rank {r}: a real step without its window fields"
                continue
            got = (s.window, s.window_steps, s.window_loss_tokens, s.closes_window)
            want_w = (first.window, first.window_steps, first.window_loss_tokens, first.closes_window)
            assert got == want_w, f"{where} rank {r}: window (index, steps, loss tokens, closes) {got} != rank 0's {want_w}"
            assert s.loss_tokens is not None and s.loss_tokens <= t[r], \
                f"{where} rank {r}: loss_tokens {s.loss_tokens} over its {t[r]} tokens"
            want = world * s.loss_tokens / first.window_loss_tokens if first.window_loss_tokens else 0.0
            assert abs(s.weight - (0.0 if s.idle else want)) <= tol, \
                f"{where} rank {r}: weight {s.weight!r} != W*loss_tokens/window_loss_tokens = " \
                f"{world}*{s.loss_tokens}/{first.window_loss_tokens}"
        window_weight += sum(s.weight for s in row)
        window_tokens += sum(s.loss_tokens or 0 for s in seen)
        if first.closes_window:
            assert k + 1 - window_first == first.window_steps, \
                f"{where}: window {first.window} closes after {k + 1 - window_first} steps, header says {first.window_steps}"
            assert abs(window_weight - world) <= tol or first.window_loss_tokens == 0, \
                f"{where}: window {first.window}'s weights sum to {window_weight!r}, not W = {world}"
            assert window_tokens == first.window_loss_tokens, \
                f"{where}: window {first.window}'s loss tokens sum to {window_tokens}, header says {first.window_loss_tokens}"
            window_weight, window_tokens, window_first = 0.0, 0, k + 1
    if counts and counts[0]:
        last = [s for s in (steps[-1] for steps in per_rank_steps) if s.window is not None]
        assert not last or last[0].closes_window, "the epoch's last step leaves its window open"


def _first_gap(indices: list[int]) -> str:
    for i, x in enumerate(indices):
        if x != i:
            return f"position {i} holds step {x}"
    return "ok"


def run_epoch(daemons: list[Daemon], counts: list[int], consumer_extra: list[str] | None = None,
              max_len: int = 1024) -> list[dict]:
    """Runs one epoch on already-started daemons: one verifying consumer and one producer per
    rank (rank r sends counts[r] samples with ids r*1e6 + k; an empty stream still ends), and
    returns each rank's epoch JSON. Fails with the daemon log on any error; with several ranks,
    also unless every step meets check_step_invariants."""
    for d in daemons:
        d.wait_ready(timeout=60)
    consumers = [consume(d.trainer, expected_producers=1, step_records=len(daemons) > 1,
                         extra=["--rank", str(d.rank)] + (consumer_extra or [])) for d in daemons]
    for d in daemons:
        rc, _, err = finish(produce(d.ingest, f"r{d.rank}", counts[d.rank], seed=d.rank,
                                    id_offset=d.rank * 1_000_000, extra=["--max-len", str(max_len)]))
        assert rc == 0, err
    return collect_epochs(daemons, consumers)


def collect_epochs(daemons: list[Daemon], consumers: list[subprocess.Popen]) -> list[dict]:
    """Each rank's one epoch JSON from its consumer; fails with the daemon log on any error.
    When the consumers ran with step_records (every multi-rank test's should), every step of the
    epoch is checked across ranks (check_step_invariants)."""
    results = []
    for d, c in zip(daemons, consumers):
        rc, out, err = finish(c, timeout=120)
        assert rc == 0, f"rank {d.rank}: {err}\n{d.read_log()}"
        (e,) = epochs(out)
        results.append(e)
    if len(results) > 1 and all("steps_detail" in e for e in results):
        check_step_invariants([e["steps_detail"] for e in results], len(results))
    return results


def raw_trainer_msg(**kind) -> bytes:
    """A raw trainer message: credit=N steps and/or start=EPOCH (one producer expected)."""
    import odb_pb2

    m = odb_pb2.TrainerMessage(version=1)
    if "credit" in kind:
        m.credit.steps = kind["credit"]
    if "start" in kind:
        m.start_epoch.epoch = kind["start"]
        m.start_epoch.expected_producers = 1
    return m.SerializeToString()


def raw_trainer_next(sock) -> tuple[list[bytes], "odb_pb2.DaemonMessage"]:
    """The next daemon message on a raw trainer socket (a zmq DEALER), with its
    frames, as a client sees it: a step arena offer is declined (a raw test
    trainer reads frames, and says so) and a session check is skipped."""
    import odb_pb2

    while True:
        frames = sock.recv_multipart()
        m = odb_pb2.DaemonMessage()
        m.ParseFromString(frames[0])
        if m.HasField("step_arena"):
            reply = odb_pb2.TrainerMessage(version=1)
            reply.step_arena_reply.generation = m.step_arena.generation
            reply.step_arena_reply.error = "a raw test trainer reads frames"
            sock.send(reply.SerializeToString())
            continue
        if not m.HasField("session_ack"):
            return frames, m


# A daemon config line that opens its metrics endpoint on a free port (read back by metric()).
METRICS_CONFIG = 'metrics_endpoint: "tcp://127.0.0.1:*"\n'


def parse_metrics(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """The samples of a Prometheus text exposition, parsed by the reference parser
    (Debian's python3-prometheus-client), which raises on malformed text: {(name, sorted labels): value}.
    A sample named twice with the same labels is an error."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in samples:
                raise AssertionError(f"metric sample {key} appears twice:\n{text}")
            samples[key] = float(sample.value)
    return samples


def metric_value(text: str, name: str, rank: int = 0) -> float:
    """The value of sample `name{rank="R"}` in an exposition (parse_metrics)."""
    samples = parse_metrics(text)
    key = (name, (("rank", str(rank)),))
    if key not in samples:
        raise AssertionError(f"metric {name}{{rank=\"{rank}\"}} is not exposed:\n{text}")
    return samples[key]


def scrape(address: str) -> str:
    """GET http://address/metrics: the exposition text."""
    import urllib.request

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def metric(daemon: Daemon, name: str) -> float:
    """The value of the counter or gauge `name` on `daemon`'s metrics endpoint (its config has
    METRICS_CONFIG), through the Prometheus text parser."""
    import re

    daemon.wait_log("metrics endpoint tcp://")
    address = re.search(r"metrics endpoint tcp://([0-9.]+:\d+)", daemon.read_log()).group(1)
    return metric_value(scrape(address), name, daemon.rank)


def wait_metric(daemon: Daemon, name: str, at_least: float, timeout: float = 60.0) -> float:
    """Waits until `daemon`'s metric `name` reaches `at_least` (an event the test needs before acting,
    instead of a sleep); fails with the daemon's log when it does not within `timeout`."""
    deadline = time.time() + timeout
    while True:
        value = metric(daemon, name)
        if value >= at_least:
            return value
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"odbd rank {daemon.rank} exited ({daemon.proc.returncode}) with {name}={value} "
                               f"< {at_least}:\n{daemon.read_log()}")
        if time.time() > deadline:
            raise TimeoutError(f"odbd rank {daemon.rank}: {name}={value} < {at_least} after {timeout}s:\n"
                               f"{daemon.read_log()}")
        time.sleep(0.05)



def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (some VM kernels ship without sch_netem: `tc` then
    answers "Specified qdisc kind is unknown"). Probed on a throwaway veth in a throwaway namespace."""
    ns = f"odbprobe-{uuid.uuid4().hex[:6]}"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        subprocess.run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], check=True,
                       capture_output=True)
        return subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1us"],
                              capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def tbf_burst_bytes(rate_mbit: float) -> int:
    """The token bucket bridged_hosts gives tbf: 10 us of the rate, at least 16 KiB (a few packets)."""
    return max(16384, int(rate_mbit * 1e6 / 8 * 10e-6))


@contextlib.contextmanager
def bridged_hosts(prefix: str, count: int, subnet: str, delay_us: float = 0.0, rate_mbit: float = 0.0):
    """`count` hosts on one machine: network namespaces `<prefix>-<i>` (address `<subnet>.<i+1>`/24),
    each with a veth link to one bridge in namespace `<prefix>-hub` (a switch). Each host's side of
    its link shapes what the host sends: with delay_us, `tc netem` (one-way latency delay_us between
    any two hosts, and rate_mbit if given; fails clearly where the kernel has no netem, see
    netem_available); without it, rate_mbit alone through `tc tbf` (bucket tbf_burst_bytes). Yields
    the list of (namespace, address); everything is removed on exit. Needs root
    (bench/real_rounds.py)."""
    def run(*args: str) -> None:
        done = subprocess.run(list(args), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")

    if os.geteuid() != 0:
        raise PermissionError("network namespaces need root")
    if len(prefix) > 8 or count > 250:
        raise ValueError("prefix <= 8 characters (interface names), count <= 250 (one /24)")
    hub = f"{prefix}-hub"
    names = [f"{prefix}-{i}" for i in range(count)]
    for ns in [hub] + names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    try:
        run("ip", "netns", "add", hub)
        run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", hub, "link", "set", "br0", "up")
        hosts = []
        for i, ns in enumerate(names):
            run("ip", "netns", "add", ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
            a, b = f"{prefix}{i}a", f"{prefix}{i}b"
            run("ip", "link", "add", a, "netns", ns, "type", "veth", "peer", "name", b, "netns", hub)
            run("ip", "-n", hub, "link", "set", b, "master", "br0")
            run("ip", "-n", hub, "link", "set", b, "up")
            addr = f"{subnet}.{i + 1}"
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", a)
            run("ip", "-n", ns, "link", "set", a, "up")
            qdisc = ["tc", "-n", ns, "qdisc", "add", "dev", a, "root"]
            if delay_us > 0:
                run(*qdisc, "netem", "limit", "100000", "delay", f"{delay_us:g}us",
                    *(["rate", f"{rate_mbit:g}mbit"] if rate_mbit > 0 else []))
            elif rate_mbit > 0:
                run(*qdisc, "tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(tbf_burst_bytes(rate_mbit)),
                    "latency", "50ms")
            hosts.append((ns, addr))
        yield hosts
    finally:
        for ns in names + [hub]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
