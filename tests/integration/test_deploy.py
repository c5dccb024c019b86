"""Every file under deploy/ is exercised here (issue 23, "a deployment that finishes"):

* odbd with emit.exit_when_trainer_done (--exit-when-trainer-done) exits 0 once its
  trainer session has ended between epochs, at W = 1 and W = 2, and non-zero when the
  trainer was lost mid-epoch;
* deploy/k8s-pod-sidecar.yaml passes a strict offline check against the Kubernetes API
  schema (k8s_schema.py), which is shown to refuse a misspelled field and a wrong enum
  value; odbd is a native sidecar, the PID namespace is shared, and its command line parses;
* deploy/odbd@.service's ExecStart computes the global rank and starts odbd
  (`systemd-analyze verify` runs in tests/python/test_py_docs.py);
* deploy/slurm_example.sbatch runs through a harness standing in for srun/scontrol: two
  tasks, each `python -m odb.launch` with a real odbd and a real OdbDataLoader trainer;
* deploy/odbd.yaml parses; deploy/odb_launch.py runs the same launcher (the Slurm test
  runs the module, test_py_docs.py runs the script).
"""
from __future__ import annotations

import copy
import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

import k8s_schema
from odbtest import BIN, ODBD, ROOT, Daemon, run_epoch

EXIT_FLAG = ["/bin/sh", "-c", 'exec "$0" "$@" --exit-when-trainer-done']  # Daemon(prefix=...): the flag last


# ----------------------------------------------------------------- odbd exits when its trainer is done

def test_odbd_exits_0_once_its_trainer_session_ended(tmp_path: Path) -> None:
    d = Daemon(tmp_path, config="emit: {exit_when_trainer_done: true, trainer_timeout_ms: 200}\n")
    try:
        (e,) = run_epoch([d], [40])
        assert e["failures"] == 0 and len(e["ids"]) == 40
        rc = d.proc.wait(timeout=60)  # on its own: no signal is sent
        log = d.read_log()
        assert rc == 0, log
        assert "ended between epochs and no trainer came back within 2000 ms" in log, log
        assert "received signal" not in log
        # The trainer's last credit, read after its connection closed, is no reconnect (it was
        # taken for one about half the time, restarting the wait for a trainer to come back).
        assert "reconnected" not in log, log
    finally:
        d.stop()


def test_odbd_without_the_option_keeps_serving_after_its_trainer_left(tmp_path: Path) -> None:
    d = Daemon(tmp_path, config="emit: {trainer_timeout_ms: 200}\n")
    try:
        run_epoch([d], [10])
        # The option's own log line is the event that would end it: it must never come, and the
        # daemon must still answer a new trainer after the grace (one more epoch).
        with pytest.raises(subprocess.TimeoutExpired):
            d.proc.wait(timeout=3)
        assert "exit_when_trainer_done" not in d.read_log()
    finally:
        assert d.stop() == 0


def test_odbd_exits_nonzero_when_its_trainer_is_lost_mid_epoch(tmp_path: Path) -> None:
    import odb_pb2
    import zmq

    d = Daemon(tmp_path, config="emit: {exit_when_trainer_done: true, trainer_timeout_ms: 200}\n")
    try:
        d.wait_ready()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(d.trainer)
        msg = odb_pb2.TrainerMessage(version=1)
        msg.start_epoch.epoch = 0
        msg.start_epoch.expected_producers = 1
        sock.send(msg.SerializeToString())
        assert sock.poll(30_000), "no session_ack"
        sock.recv_multipart()
        d.wait_log("trainer started epoch 0")
        sock.close(linger=0)  # the trainer dies with its epoch open
        ctx.term()
        rc = d.proc.wait(timeout=60)
        log = d.read_log()
        assert rc != 0, log
        assert "disconnected mid-epoch" in log and "ended between epochs" not in log, log
    finally:
        d.stop()


def test_two_ranks_both_exit_0_after_the_epoch(tmp_path: Path) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    config = "grouping: {window: 16}\nemit: {trainer_timeout_ms: 200}\n"
    daemons = [Daemon(tmp_path, rank=r, world=2, config=config, job_id=job, prefix=EXIT_FLAG) for r in range(2)]
    try:
        results = run_epoch(daemons, [60, 15])
        assert sorted(i for e in results for i in e["ids"]) == sorted(
            [k for k in range(60)] + [1_000_000 + k for k in range(15)])
        for d in daemons:
            rc = d.proc.wait(timeout=60)
            assert rc == 0, d.read_log()
            assert "ended between epochs" in d.read_log()
    finally:
        for d in daemons:
            d.stop()


# ----------------------------------------------------------------- Kubernetes

POD = ROOT / "deploy/k8s-pod-sidecar.yaml"


def _pod() -> dict:
    return yaml.safe_load(POD.read_text())


def test_pod_manifest_passes_the_strict_kubernetes_schema() -> None:
    assert k8s_schema.validate(_pod()) == []


@pytest.mark.parametrize("mutate, expected", [
    # misspelled fields, at three depths
    (lambda p: p["spec"].__setitem__("sharedProcessNamespace", True), "/spec/sharedProcessNamespace: unknown field"),
    (lambda p: p["spec"]["initContainers"][0].__setitem__("volumeMount", []),
     "/spec/initContainers/0/volumeMount: unknown field"),
    (lambda p: p["spec"]["initContainers"][0]["startupProbe"]["exec"].__setitem__("cmd", ["true"]),
     "/spec/initContainers/0/startupProbe/exec/cmd: unknown field"),
    # wrong enum values
    (lambda p: p["spec"]["initContainers"][0].__setitem__("restartPolicy", "OnFailure"),
     "/spec/initContainers/0/restartPolicy: 'OnFailure' is not one of ['Always']"),
    (lambda p: p["spec"].__setitem__("restartPolicy", "Sometimes"), "/spec/restartPolicy: 'Sometimes' is not one of"),
    (lambda p: p["spec"]["volumes"][0]["emptyDir"].__setitem__("medium", "Ram"), "/spec/volumes/0/emptyDir/medium"),
    # restartPolicy belongs to init containers only; wrong types
    (lambda p: p["spec"]["containers"][0].__setitem__("restartPolicy", "Always"),
     "/spec/containers/0/restartPolicy: unknown field"),
    (lambda p: p["spec"].__setitem__("shareProcessNamespace", "true"), "/spec/shareProcessNamespace: 'true' is not of type"),
    (lambda p: p["spec"]["containers"][0].pop("name"), "/spec/containers/0: required field 'name' is missing"),
])
def test_the_schema_check_refuses_misspellings_and_wrong_values(mutate, expected) -> None:
    pod = copy.deepcopy(_pod())
    mutate(pod)
    problems = k8s_schema.validate(pod)
    assert any(expected in p for p in problems), problems


def _schema_at(node: dict, root: dict) -> dict:
    while "$ref" in node:
        node = root["definitions"][node["$ref"].removeprefix("#/definitions/")]
    return node


def _nodes(value, node: dict, root: dict, path: str = ""):
    """(path, value, its schema node) of every object, array and leaf of the manifest."""
    node = _schema_at(node, root)
    yield path, value, node
    if isinstance(value, dict):
        for key, item in value.items():
            sub = node.get("properties", {}).get(key)
            if sub is None and isinstance(node.get("additionalProperties"), dict):
                sub = node["additionalProperties"]
            assert sub is not None, f"{path}/{key} has no schema (the manifest passes the check, so it must)"
            yield from _nodes(item, sub, root, f"{path}/{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nodes(item, node["items"], root, f"{path}/{i}")


def _at(doc, path: str):
    for part in [p for p in path.split("/") if p]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def test_the_schema_check_refuses_a_misspelling_in_every_object_and_a_wrong_value_in_every_enum() -> None:
    """Not only the cases listed above: every object of the manifest (bar string maps such as
    labels) refuses a field it does not have, and every field with an enum refuses a value
    outside it, each error at its own path."""
    root = k8s_schema.load_schema()
    objects = enums = 0
    for path, value, node in list(_nodes(_pod(), root, root)):
        if isinstance(value, dict) and not isinstance(node.get("additionalProperties"), dict):
            pod = copy.deepcopy(_pod())
            _at(pod, path)["odbMisspelt"] = True
            problems = k8s_schema.validate(pod)
            assert any(p.startswith(f"{path}/odbMisspelt: unknown field") for p in problems), (path, problems)
            objects += 1
        if "enum" in node:
            pod = copy.deepcopy(_pod())
            parent, key = path.rsplit("/", 1)
            _at(pod, parent)[int(key) if key.isdigit() else key] = "NotInTheEnum"
            problems = k8s_schema.validate(pod)
            assert any(p.startswith(f"{path}: 'NotInTheEnum' is not one of") for p in problems), (path, problems)
            enums += 1
    # 23 objects (the Pod, metadata, spec, volumes, containers, env, mounts, the probe...) and 5 enums today
    assert objects >= 20 and enums >= 5, (objects, enums)


def test_pod_runs_odbd_as_a_native_sidecar_that_keeps_the_shared_memory_paths() -> None:
    spec = _pod()["spec"]
    assert spec["restartPolicy"] == "Never"  # the Pod completes with its trainer
    # Arena liveness is checked by the creator's pid: both sides must see each other's pids.
    assert spec["shareProcessNamespace"] is True
    (odbd,) = [c for c in spec["initContainers"] if "odbd" in c["command"][0]]
    assert odbd["restartPolicy"] == "Always"
    assert not [c for c in spec["containers"] if "odbd" in c["command"][0]], "odbd must not be a regular container"
    assert "--exit-when-trainer-done" in odbd["command"]
    run_dir = odbd["command"][odbd["command"].index("--run-dir") + 1]
    (trainer,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["ODB_RUN_DIR"] == run_dir
    mounts = lambda c: {m["name"]: m["mountPath"] for m in c["volumeMounts"]}  # noqa: E731
    shared = [v["name"] for v in spec["volumes"] if "emptyDir" in v]
    assert any(mounts(odbd).get(n) == run_dir and mounts(trainer).get(n) == run_dir for n in shared)
    odbd_env = {e["name"]: e.get("value") for e in odbd["env"]}
    assert odbd_env["RANK"] == env["RANK"] and odbd_env["WORLD_SIZE"] == env["WORLD_SIZE"]


def test_pod_odbd_command_line_parses_with_the_shipped_config(tmp_path: Path) -> None:
    odbd = [c for c in _pod()["spec"]["initContainers"] if c["name"] == "odbd"][0]
    env = {e["name"]: e["value"] for e in odbd["env"] if "value" in e}
    args = [a.replace("$(JOB_ID)", env["JOB_ID"]) for a in odbd["command"][1:]]
    args[args.index("--config") + 1] = str(ROOT / "deploy/odbd.yaml")  # the ConfigMap's content
    args[args.index("--run-dir") + 1] = str(tmp_path)
    proc = subprocess.run([str(ODBD), *args, "--print-config"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env, ODB_GLOO_HOSTNAME="127.0.0.1"))
    assert proc.returncode == 0, proc.stderr
    assert "rank=0/16 " in proc.stdout and "job_id=train-2026-11-29" in proc.stdout, proc.stdout


# ----------------------------------------------------------------- systemd

def _exec_start() -> str:
    lines, cont = [], False
    for line in (ROOT / "deploy/odbd@.service").read_text().splitlines():
        if line.startswith("ExecStart=") or cont:
            lines.append(line.removeprefix("ExecStart=").rstrip("\\").strip())
            cont = line.endswith("\\")
    return " ".join(lines)


def test_systemd_exec_start_computes_the_global_rank_and_starts_odbd(tmp_path: Path) -> None:
    argv = shlex.split(_exec_start())
    assert argv[:2] == ["/bin/sh", "-c"]
    script = argv[2].replace("/usr/local/bin/odbd", str(ODBD)).replace("%i", "1")
    config = tmp_path / "odbd.yaml"
    config.write_text("alignment: {store: file}\n")
    script = script.replace("/etc/odb/odbd.yaml", str(config)).replace("/run/odb", str(tmp_path / "run"))
    env = dict(os.environ, ODB_JOB_ID="job-1234", WORLD_SIZE="4", NODE_RANK="1", LOCAL_WORLD_SIZE="2",
               LOCAL_RANK="1")
    proc = subprocess.run(["/bin/sh", "-c", script + " --print-config"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    described = proc.stdout
    assert "job-1234" in described and str(tmp_path / "run") in described, described
    # NODE_RANK * LOCAL_WORLD_SIZE + %i = 1 * 2 + 1
    assert "rank=3/4 " in described, described


# ----------------------------------------------------------------- Slurm

SRUN = textwrap.dedent("""\
    #!/usr/bin/python3
    # Stands in for srun on one node: runs the command once per task, in parallel, with the
    # SLURM_* variables srun sets; with --kill-on-bad-exit=1 a task that fails ends the others.
    import os, subprocess, sys, time
    args = sys.argv[1:]
    kill = False
    while args and args[0].startswith("--"):
        kill |= args.pop(0) == "--kill-on-bad-exit=1"
    n = int(os.environ["SLURM_NTASKS"])
    procs = [subprocess.Popen(args, env=dict(os.environ, SLURM_PROCID=str(i), SLURM_LOCALID=str(i),
                                             SLURM_NODEID="0"), start_new_session=True) for i in range(n)]
    rc = 0
    while any(p.poll() is None for p in procs):
        bad = [p for p in procs if p.poll() not in (None, 0)]
        if bad and kill:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
        time.sleep(0.05)
    codes = [p.returncode for p in procs]
    sys.exit(next((c for c in codes if c != 0), 0) and 1)
""")

SCONTROL = textwrap.dedent("""\
    #!/bin/sh
    # Stands in for `scontrol show hostnames <nodelist>`: this one node.
    [ "$1 $2" = "show hostnames" ] || { echo "scontrol stand-in: unexpected $*" >&2; exit 2; }
    echo localhost
""")

TRAIN = textwrap.dedent("""\
    import json, os, sys
    sys.path.insert(0, {examples!r})
    import odb, tiny_lm
    lengths = tiny_lm.long_tail_lengths(48, seed=3, min_len=4, max_len=60, median=16)
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus(lengths, vocab=64), num_workers=0, timeout_s=60)
    ids = [i for step in loader for i in step.sample_ids]
    rank = int(os.environ["RANK"])
    json.dump({{"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "local": os.environ["LOCAL_RANK"],
               "ids": ids}}, open(os.path.join({out!r}, f"rank{{rank}}.json"), "w"))
    sys.exit(int(os.environ.get("FAIL_RANK", "-1") == str(rank)) * 3)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_sbatch(tmp_path: Path, extra_env: dict) -> subprocess.CompletedProcess:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    (bindir / "python3").symlink_to("/usr/bin/python3")  # the script's `python3`: Debian's, with torch
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(examples=str(ROOT / "examples"), out=str(out)))
    config = tmp_path / "odbd.yaml"
    config.write_text(yaml.safe_dump({"grouping": {"max_tokens": 256}, "alignment": {"store": "file"},
                                      "collate": {"fields": [{"name": "labels", "pad_value": -100}]}}))
    job = f"9{uuid.uuid4().int % 10**8}"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", PYTHONPATH=str(ROOT / "client/python"),
               ODBD=str(ODBD), SLURM_JOB_ID=job, SLURM_JOB_NODELIST="node001", SLURM_NTASKS="2",
               SLURM_NTASKS_PER_NODE="2", ODB_CONFIG=str(config), TRAIN_SCRIPT=str(script),
               MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1", **extra_env)
    try:
        return subprocess.run(["bash", str(ROOT / "deploy/slurm_example.sbatch")], capture_output=True, text=True,
                              timeout=300, env=env, cwd=ROOT)
    finally:
        subprocess.run(["rm", "-rf", f"/tmp/odb-{job}"])


def test_slurm_script_runs_both_ranks_through_the_srun_harness(tmp_path: Path) -> None:
    proc = _run_sbatch(tmp_path, {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"], r["local"]) for r in ranks] == [(0, 2, "0"), (1, 2, "1")]
    assert sorted(i for r in ranks for i in r["ids"]) == list(range(48))  # every sample once, globally


def test_slurm_script_fails_when_a_rank_fails(tmp_path: Path) -> None:
    proc = _run_sbatch(tmp_path, {"FAIL_RANK": "1"})
    assert proc.returncode != 0, proc.stdout + proc.stderr


# ----------------------------------------------------------------- the example config

def test_deploy_config_parses() -> None:
    proc = subprocess.run([str(ODBD), "--config", str(ROOT / "deploy/odbd.yaml"), "--rank", "0", "--world-size", "2",
                           "--job-id", "j", "--run-dir", "/tmp", "--print-config"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, ODB_GLOO_HOSTNAME="127.0.0.1"))
    assert proc.returncode == 0, proc.stderr
    assert "store=10.0.0.1:6379" in proc.stdout and "max_tokens=8192" in proc.stdout, proc.stdout


# ----------------------------------------------------------------- PID namespaces (the Pod's shareProcessNamespace)

PRODUCE_SHM = textwrap.dedent("""\
    import sys
    sys.path.insert(0, {python!r})
    from odb._native import native
    try:
        native().Producer({endpoint!r}, "p", data_plane="shm")
        print("ACCEPTED")
    except Exception as e:
        print("REFUSED", e)
""")


def _shm_producer(endpoint: str, prefix: list) -> str:
    if os.geteuid() != 0:
        pytest.fail("PID namespaces (unshare --pid) need root (CI runs as root)")
    code = PRODUCE_SHM.format(python=str(ROOT / "client/python"), endpoint=endpoint)
    proc = subprocess.run([*prefix, "/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("daemon_in_child", [True, False], ids=["odbd-in-own-pid-ns", "producer-in-own-pid-ns"])
def test_shared_memory_across_pid_namespaces_is_refused_naming_the_namespace(tmp_path: Path,
                                                                             daemon_in_child: bool) -> None:
    """What the Pod's shareProcessNamespace prevents: odbd and a producer in different PID
    namespaces (two containers of a Pod without it; here `unshare --pid`). The arena is refused
    (the producer then sends over the socket, or raises with data_plane="shm") and the reason
    names the PID namespace and the way out, not a misleading "stale arena" alone."""
    unshare = ["unshare", "--pid", "--fork"]
    d = Daemon(tmp_path, prefix=unshare if daemon_in_child else None)
    try:
        d.wait_ready()
        out = _shm_producer(d.ingest, [] if daemon_in_child else unshare)
        assert "REFUSED" in out, out
        assert "another PID namespace" in out and "shareProcessNamespace: true" in out, out
        if not daemon_in_child:
            # The same producer in the daemon's namespace gets its arena: the refusal is the namespace's.
            same = _shm_producer(d.ingest, [])
            assert "ACCEPTED" in same, same
    finally:
        d.stop()


# ----------------------------------------------------------------- every file under deploy/

def test_every_file_under_deploy_is_exercised_by_a_test() -> None:
    """A file added to deploy/ must come with its test: each is named (as deploy/<file>) by this
    file or by tests/python/test_py_docs.py, and docs/deploy.md's table lists it."""
    tests = (Path(__file__).read_text() + (ROOT / "tests/python/test_py_docs.py").read_text())
    table = (ROOT / "docs/deploy.md").read_text()
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "deploy").rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    assert len(files) >= 5, files
    untested = [f for f in files if f'"{f}"' not in tests]
    assert not untested, f"files under deploy/ that no test names: {untested}"
    unlisted = [f for f in files if f"| `{f}` |" not in table]
    assert not unlisted, f"files under deploy/ missing from docs/deploy.md's table: {unlisted}"
