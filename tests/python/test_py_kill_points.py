"""Many kill points in one epoch (docs/resume.md): a 2-rank DDP job checkpoints
its loader at a random step, trains a random few steps more and is SIGKILLed
with its daemons; a fresh job resumes from the checkpoint and is killed the
same way again, KILL_POINTS times, and the last one finishes the epoch. Over
every interruption, the samples trained before each checkpoint plus those of
the final run are every sample of the epoch, exactly once, bytes intact
(`_train` checks every row against the dataset). Run for each planner and
IDLE policy, and in reproducible mode.

ODB_KILL_POINTS overrides the count (e.g. 50 for a longer local sweep)."""
from __future__ import annotations

import json
import os
import random
import signal

import pytest

import tiny_lm
from odbtest_py import run_ranks, start_daemons, stop_all
from test_py_resume import _spawn_until_killed, _train

KILL_POINTS = int(os.environ.get("ODB_KILL_POINTS", "20"))
N = 960  # enough steps that KILL_POINTS segments of 1-3 steps stay clear of the epoch's tail


@pytest.mark.parametrize("idle_policy,planner,deterministic,target,partition", [
    ("zero_step", "local", False, 0, 0),
    ("zero_step", "global", False, 0, 0),
    ("join", "local", False, 0, 0),
    ("join", "global", False, 0, 0),
    ("zero_step", "global", True, 0, 0),
    ("zero_step", "global", False, 300, 0),  # accumulation windows: open windows handed back, then killed
    # The same under partitioned planning (blocks of one rank): windows cut from the world-wide totals.
    ("zero_step", "global", False, 300, 1),
])
def test_every_sample_exactly_once_across_many_kill_points(tmp_path, job_id, idle_policy, planner,
                                                            deterministic, target, partition) -> None:
    rng = random.Random(f"{idle_policy}-{planner}-{deterministic}" + (f"-{target}" if target else "") +
                        (f"-p{partition}" if partition else ""))
    alignment = {"planner": planner, "deterministic": deterministic, "partition_ranks": partition}
    extra = {"local_world_size": 1} if partition else {}
    config = tiny_lm.daemon_config(max_tokens=128, grouping={"window": 16}, alignment=alignment,
                                   optimizer={"tokens_per_step": target}, **extra)
    world = 2
    state = None
    trained: list = []
    kills = 0
    for segment in range(KILL_POINTS):
        checkpoint_at, then = rng.randrange(0, 2), rng.randrange(0, 2)
        run_dir = tmp_path / f"seg{segment}"
        daemons = start_daemons(run_dir, world, f"{job_id}s{segment}", config)
        out = str(tmp_path / f"seg{segment}-{{rank}}.json")
        try:
            _spawn_until_killed(world, run_dir, timeout=240, idle_policy=idle_policy, state=state,
                                checkpoint_at=checkpoint_at, then=then, out=out, n=N)
        finally:
            for d in daemons:  # the daemons die with the job
                d.proc.send_signal(signal.SIGKILL)
            stop_all(daemons)
        saved = [json.loads(open(out.format(rank=r)).read()) for r in range(world)]
        if saved[0]["state"] is None:  # the epoch ended before this checkpoint: nothing lost
            trained += [i for s in saved for i in s["trained"]]
            state = "finished"
            break
        assert all(s["state"] == saved[0]["state"] for s in saved), "every rank saves the same state"
        trained += [i for s in saved for i in s["trained"]]
        state = saved[0]["state"]
        kills += 1
    if state != "finished":
        daemons = start_daemons(tmp_path / "last", world, f"{job_id}last", config)
        try:
            results = run_ranks(_train, world, tmp_path / "last", timeout=300, idle_policy=idle_policy, state=state,
                                checkpoint_at=None, then=0, out="", n=N)
        finally:
            stop_all(daemons)
        trained += [i for r in results for i in r["trained"]]
    assert kills >= min(KILL_POINTS, 20) or state == "finished"
    assert kills == KILL_POINTS, f"the epoch ended after {kills} kill points; raise N"
    missing = sorted(set(range(N)) - set(trained))
    twice = sorted({i for i in trained if trained.count(i) > 1})
    assert not missing and not twice, f"after {kills} kill points: missing {missing[:10]}, twice {twice[:10]}"
