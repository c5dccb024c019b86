"""Every file under deploy/ is exercised here (issue 23, "a deployment that finishes"):

* odbd with emit.exit_when_trainer_done (--exit-when-trainer-done) exits 0 once its
  trainer session has ended between epochs, at W = 1 and W = 2, and non-zero when the
  trainer was lost mid-epoch;
* docs/deploy.md's install blocks run as written (issue 31): systemd's into a temporary
  tree (deploy/install_systemd.sh with DESTDIR; `systemctl` stands in, the installed unit
  passes `systemd-analyze verify`, names only files of the tree, and its ExecStart starts
  odbd with the installed config and environment); Kubernetes' with `kubectl apply -k`
  standing in as the real `kubectl kustomize`: the rendered Pod (deploy/k8s/pod.yaml
  through deploy/k8s/kustomization.yaml) finds every ConfigMap it names, both containers
  take the rank and world size from one ConfigMap, and the multi-node overlay's Redis is
  a Service it creates;
* the rendered Pod passes a strict offline check against the Kubernetes API
  schema (k8s_schema.py), which is shown to refuse a misspelled field and a wrong enum
  value; odbd is a native sidecar, the PID namespace is shared, and its command line parses;
* deploy/odbd@.service's ExecStart computes the global rank and starts odbd
  (`systemd-analyze verify` runs in tests/python/test_py_docs.py);
* deploy/slurm_example.sbatch runs through a harness standing in for srun/scontrol: two
  tasks, each `python -m odb.launch` with a real odbd and a real OdbDataLoader trainer;
* deploy/odbd.yaml (a link to deploy/k8s/odbd.yaml) parses as a one-node FileStore config,
  deploy/k8s-multinode/odbd.yaml as Redis at odb-redis; the Slurm script on several nodes
  with the one-node config stops, naming the setting; deploy/odb_launch.py runs the same
  launcher (the Slurm test runs the module, test_py_docs.py runs the script).
"""
from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Dict, List

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

K8S = ROOT / "deploy/k8s"  # "deploy/k8s/kustomization.yaml" renders "deploy/k8s/pod.yaml" and "deploy/k8s/odbd.yaml"
# docs/deploy.md's multi-node block renders "deploy/k8s-multinode/kustomization.yaml" with
# "deploy/k8s-multinode/odbd.yaml" and "deploy/k8s-multinode/redis.yaml".


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # scripts/install_deps.sh installs Debian's kubernetes-client where none is
        pytest.fail("kubectl is not installed (apt install kubernetes-client): the manifests are rendered with it")
    return kubectl


def _render(folder: Path) -> List[dict]:
    """`kubectl kustomize folder`: the documents it renders."""
    p = subprocess.run([_kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def _pod(docs: List[dict] | None = None) -> dict:
    (pod,) = [d for d in (docs if docs is not None else _render(K8S)) if d["kind"] == "Pod"]
    return pod


def _config_maps(docs: List[dict]) -> Dict[str, dict]:
    return {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}


def _env(container: dict, maps: Dict[str, dict]) -> Dict[str, str]:
    """A container's environment as the kubelet would set it (values and configMapKeyRefs resolved)."""
    env = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref is not None:
            assert ref["name"] in maps and ref["key"] in maps[ref["name"]], (e, sorted(maps))
            env[e["name"]] = maps[ref["name"]][ref["key"]]
        elif "value" in e:
            env[e["name"]] = e["value"]
    return env


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
    # 33 objects (the Pod, metadata, spec, volumes, containers, env and its configMapKeyRefs, mounts, the probe...)
    # and 5 enums today
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
    # The rank and the world size come to both containers from one place: the same ConfigMap keys.
    refs = lambda c: {e["name"]: e.get("valueFrom", {}).get("configMapKeyRef") for e in c["env"]}  # noqa: E731
    for name in ("RANK", "WORLD_SIZE"):
        assert refs(odbd)[name] is not None and refs(odbd)[name] == refs(trainer)[name], (name, odbd, trainer)


def _pod_odbd_config(docs: List[dict], tmp_path: Path) -> str:
    """odbd's command line from the rendered Pod, run with --print-config: its environment from the rendered
    ConfigMaps, its --config the rendered odbd-config's odbd.yaml."""
    pod, maps = _pod(docs), _config_maps(docs)
    odbd = [c for c in pod["spec"]["initContainers"] if c["name"] == "odbd"][0]
    env = _env(odbd, maps)
    (volume,) = [v for v in pod["spec"]["volumes"] if "configMap" in v]
    (mount,) = [m for m in odbd["volumeMounts"] if m["name"] == volume["name"]]
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    for key, text in maps[volume["configMap"]["name"]].items():
        (config_dir / key).write_text(text)
    args = [a.replace("$(JOB_ID)", env["JOB_ID"]) for a in odbd["command"][1:]]
    config = args[args.index("--config") + 1]
    assert config.startswith(mount["mountPath"] + "/"), (config, mount)
    args[args.index("--config") + 1] = str(config_dir / config[len(mount["mountPath"]) + 1:])
    args[args.index("--run-dir") + 1] = str(tmp_path)
    proc = subprocess.run([str(ODBD), *args, "--print-config"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env, ODB_GLOO_HOSTNAME="127.0.0.1"))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_pod_odbd_command_line_parses_with_the_shipped_config(tmp_path: Path) -> None:
    described = _pod_odbd_config(_render(K8S), tmp_path)
    # One node by default: one rank, the FileStore in the run dir (no Redis to reach).
    assert "rank=0/1 " in described and f"store={tmp_path}/store " in described, described


# ----------------------------------------------------------------- docs/deploy.md's install blocks (issue 31)

def _deploy_block(name: str) -> str:
    """The sh block right after docs/deploy.md's `<!-- deploy-test: name -->` marker."""
    lines = (ROOT / "docs/deploy.md").read_text().splitlines()
    (mark,) = [i for i, line in enumerate(lines) if line.strip() == f"<!-- deploy-test: {name} -->"]
    assert lines[mark + 1].strip() == "```sh", lines[mark + 1]
    end = next(i for i in range(mark + 2, len(lines)) if lines[i].strip().startswith("```"))
    return "\n".join(lines[mark + 2:end]) + "\n"


def _stand_in(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n" + body)
    (bindir / name).chmod(0o755)


def _run_block(name: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The block, as written, with bash from the checkout; the stand-ins of tmp_path/bin first on PATH."""
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", _deploy_block(name)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT,
                          env=dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", **env))
    assert proc.returncode == 0, f"docs/deploy.md block {name!r} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _kubectl_apply_stand_in(tmp_path: Path) -> Path:
    """`kubectl apply -k DIR` without a cluster: the real `kubectl kustomize DIR`, written to tmp_path/applied.yaml."""
    out = tmp_path / "applied.yaml"
    _stand_in(tmp_path / "bin", "kubectl",
              f'[ "$1 $2" = "apply -k" ] && [ $# -eq 3 ] || {{ echo "kubectl stand-in: unexpected $*" >&2; exit 2; }}\n'
              f'exec {_kubectl()} kustomize "$3" > {out}\n')
    return out


def test_kubernetes_block_creates_the_pod_and_every_config_map_it_reads(tmp_path: Path) -> None:
    out = _kubectl_apply_stand_in(tmp_path)
    _run_block("kubernetes", tmp_path)
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    pod, maps = _pod(docs), _config_maps(docs)
    assert k8s_schema.validate(pod) == []
    # Every ConfigMap the Pod names is created: the mounted config, the one the env reads from.
    (volume,) = [v for v in pod["spec"]["volumes"] if "configMap" in v]
    assert maps[volume["configMap"]["name"]] == {"odbd.yaml": (ROOT / "deploy/odbd.yaml").read_text()}
    containers = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    envs = [_env(c, maps) for c in containers]  # asserts each configMapKeyRef's map and key exist
    # One place for the rank and the world size: both containers read them from the same map.
    (job,) = [m for m in maps.values() if "RANK" in m]
    assert [e["RANK"] for e in envs] == [job["RANK"]] * 2 and [e["WORLD_SIZE"] for e in envs] == ["1"] * 2, envs


def test_kubernetes_multinode_block_names_a_redis_it_creates(tmp_path: Path) -> None:
    out = _kubectl_apply_stand_in(tmp_path)
    _run_block("kubernetes-multinode", tmp_path)
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    assert k8s_schema.validate(_pod(docs)) == []
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    template = {"apiVersion": "v1", "kind": "Pod", **deployment["spec"]["template"]}
    assert k8s_schema.validate(template) == []
    described = _pod_odbd_config(docs, tmp_path)
    assert "rank=0/2 " in described and "job_id=train-2026-11-29" in described, described
    store = described.split("store=")[1].split()[0]
    host, port = store.split(":")
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert host == service["metadata"]["name"] == "odb-redis", (store, service)
    assert int(port) in [p["port"] for p in service["spec"]["ports"]], service
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def _unit_paths(exec_start: str) -> List[str]:
    return sorted({w for w in re.findall(r"(/[\w./@-]+)", exec_start) if not w.startswith("/run/")})


def test_systemd_block_installs_into_a_tree_that_verifies_and_starts_odbd(tmp_path: Path) -> None:
    """The block runs "deploy/install_systemd.sh" (DESTDIR: the tree) and `systemctl enable --now odbd@0`."""
    calls = tmp_path / "systemctl.calls"
    _stand_in(tmp_path / "bin", "systemctl", f'echo "$*" >> {calls}\n')
    dest = tmp_path / "root"
    out = _run_block("systemd", tmp_path, DESTDIR=str(dest), ODBD=str(ODBD))
    assert calls.read_text().split("\n")[0] == "enable --now odbd@0", calls.read_text()
    assert f"under {dest}" in out.stdout, out.stdout
    unit = dest / "etc/systemd/system/odbd@.service"
    # systemd-analyze verify of the installed unit (an instance of the template).
    check = tmp_path / "verify"
    check.mkdir()
    (check / "odbd@.service").write_text(unit.read_text())
    (check / "odbd@0.service").symlink_to("odbd@.service")
    verify = subprocess.run(["systemd-analyze", "verify", str(check / "odbd@0.service")], capture_output=True,
                            text=True, timeout=60)
    assert verify.returncode == 0 and "odbd@" not in verify.stderr, verify.stderr
    text = unit.read_text()
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    # Every file the unit names is in the tree: its environment file, odbd, its config; its user too.
    exec_start = " ".join(ln.rstrip("\\").strip() for ln in text.split("ExecStart=", 1)[1].split("\n")[:2])
    named = [fields["EnvironmentFile"].lstrip("-")] + [p for p in _unit_paths(exec_start) if p != "/bin/sh"]
    assert "/usr/local/bin/odbd" in named and "/etc/odb/odbd.yaml" in named, named
    missing = [p for p in named if not (dest / p.lstrip("/")).exists()]
    assert not missing, f"the unit names files the install did not put in the tree: {missing}"
    passwd = (dest / "etc/passwd").read_text()
    assert any(line.split(":")[0] == fields["User"] for line in passwd.splitlines()), passwd
    assert (dest / "etc/odb/odbd.yaml").read_text() == (ROOT / "deploy/odbd.yaml").read_text()
    # The instance's ExecStart with the tree's files: odbd serves one rank with the installed config and env.
    script = shlex.split(exec_start)[2].replace("%i", "0").replace("/run/odb", str(tmp_path / "run"))
    for p in named:
        script = script.replace(p, str(dest / p.lstrip("/")))
    env = dict(os.environ)
    for line in (dest / "etc/odb/odbd.env").read_text().splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value
    (tmp_path / "run").mkdir()
    log = open(tmp_path / "odbd.log", "w")
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        socket_path = tmp_path / "run" / "odb-0-out.sock"
        deadline = time.monotonic() + 60
        while not socket_path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the socket, the daemon's "ready" event
        assert socket_path.exists(), (tmp_path / "odbd.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "odbd.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    # A second install keeps what the admin edited.
    (dest / "etc/odb/odbd.yaml").write_text("grouping: {max_tokens: 512}\n")
    _run_block("systemd", tmp_path, DESTDIR=str(dest), ODBD=str(ODBD))
    assert (dest / "etc/odb/odbd.yaml").read_text() == "grouping: {max_tokens: 512}\n"


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


def test_slurm_script_on_several_nodes_with_the_one_node_config_stops_naming_the_setting(tmp_path: Path) -> None:
    env = dict(os.environ, SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="node[001-002]", SLURM_NTASKS="16",
               PATH=f"{tmp_path}:{os.environ['PATH']}")
    env.pop("ODB_CONFIG", None)
    _stand_in(tmp_path, "srun", f'echo "srun ran" > {tmp_path / "srun.ran"}\n')
    proc = subprocess.run(["bash", str(ROOT / "deploy/slurm_example.sbatch")], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ODB_CONFIG" in proc.stderr and "alignment.store: redis" in proc.stderr, proc.stderr
    assert not (tmp_path / "srun.ran").exists()


# ----------------------------------------------------------------- the example config

@pytest.mark.parametrize("config, store", [("deploy/odbd.yaml", "/tmp/store"),
                                           ("deploy/k8s/odbd.yaml", "/tmp/store"),
                                           ("deploy/k8s-multinode/odbd.yaml", "odb-redis:6379")])
def test_deploy_config_parses(config: str, store: str) -> None:
    """One node by default (a FileStore in the run dir, nothing to reach); several nodes: the Redis named."""
    proc = subprocess.run([str(ODBD), "--config", str(ROOT / config), "--rank", "0", "--world-size", "2",
                           "--job-id", "j", "--run-dir", "/tmp", "--print-config"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, ODB_GLOO_HOSTNAME="127.0.0.1"))
    assert proc.returncode == 0, proc.stderr
    assert f"store={store} " in proc.stdout and "max_tokens=8192" in proc.stdout, proc.stdout
    assert "10.0.0.1" not in (ROOT / config).read_text()


def test_deploy_odbd_yaml_is_the_kustomizations_config() -> None:
    assert (ROOT / "deploy/odbd.yaml").resolve() == (ROOT / "deploy/k8s/odbd.yaml").resolve()


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
