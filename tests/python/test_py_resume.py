"""Resume after preemption (docs/resume.md): a job checkpoints its loader state
at a random step, trains a few more steps, and is SIGKILLed together with its
daemons; a fresh job (fresh daemons, possibly another world size) loads the
state and finishes the epoch. The samples trained up to the checkpoint and
those trained after the resume are every sample of the epoch, exactly once,
with payload bytes intact."""
from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
import torch

import odb
import tiny_lm
from odb.loader import compress_ints, expand_ints
from odbtest_py import kill_rank, report, run_ranks, run_until_preempted, start_daemons, stop_all

N = 160


def _corpus(n: int = N) -> "tiny_lm.SyntheticCorpus":
    return tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(n, seed=4, min_len=4, max_len=120, median=30), vocab=64)


def _train(rank: int, world: int, run_dir: str, idle_policy: str, state: dict | None, checkpoint_at: int | None,
           then: int, out: str, n: int = N) -> dict:
    """Trains the epoch; with `checkpoint_at`, saves the loader state after that step, trains `then`
    more steps (lost with the job) and kills itself (SIGKILL) like a preempted trainer."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = tiny_lm.TinyCausalLM(vocab=64, d_model=16, layers=1, heads=2, max_len=128)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    corpus = _corpus(n)
    loader = odb.OdbDataLoader(corpus, shuffle=True, seed=7, num_workers=1, idle_policy=idle_policy, timeout_s=90)
    if state is not None:
        loader.load_state_dict(state)
    trained: list = []
    saved = None
    steps = 0

    def one(step: odb.Step) -> None:
        b = step.batch
        for sid, row, length in zip(step.sample_ids, b["input_ids"], step.lengths):
            assert torch.equal(row[:length], corpus[sid]["input_ids"]), f"sample {sid}: payload changed"
        logits = ddp(b["input_ids"], b["attention_mask"])
        loss = odb.weighted_cross_entropy(logits, b["labels"], step.loss_weight, step.real_tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def run() -> None:
        nonlocal saved, steps
        for step in loader:
            one(step)
            trained.extend(step.sample_ids)
            if checkpoint_at is not None and steps == checkpoint_at:
                saved = {"state": loader.state_dict(), "trained": list(trained)}  # a collective: every rank
                Path(out.format(rank=rank)).write_text(json.dumps(saved))
                report("checkpointed")
            steps += 1
            if checkpoint_at is not None and steps > checkpoint_at + then:
                kill_rank()  # preempted: nothing after this is kept

    if idle_policy == "join":
        with ddp.join():
            run()
        if checkpoint_at is None:
            loader.wait_epoch_end()
    else:
        run()
    if checkpoint_at is not None:  # a run to be killed whose loop ended first (join: this rank's samples are done)
        if saved is None:  # the epoch ended before the checkpoint step
            Path(out.format(rank=rank)).write_text(json.dumps({"state": None, "trained": trained}))
            report("checkpointed")
        kill_rank()
    return {"trained": trained}


def _spawn_until_killed(world: int, run_dir: Path, timeout: float, **args) -> None:
    run_until_preempted(_train, world, run_dir, timeout, **args)


@pytest.mark.parametrize("idle_policy,planner,world_before,world_after", [
    ("zero_step", "local", 4, 2),
    ("join", "local", 2, 3),
    ("zero_step", "global", 2, 2),
    ("join", "global", 3, 2),
])
def test_kill_and_resume_trains_every_sample_exactly_once(tmp_path, job_id, idle_policy, planner, world_before,
                                                          world_after) -> None:
    rng = random.Random(f"{idle_policy}-{planner}-{world_before}-{world_after}")
    checkpoint_at, then = rng.randrange(1, 8), rng.randrange(0, 4)
    config = tiny_lm.daemon_config(max_tokens=128, alignment={"planner": planner})
    before, after = tmp_path / "before", tmp_path / "after"
    daemons = start_daemons(before, world_before, job_id + "a", config)
    try:
        _spawn_until_killed(world_before, before, timeout=240, idle_policy=idle_policy, state=None,
                            checkpoint_at=checkpoint_at, then=then, out=str(tmp_path / "ckpt-{rank}.json"))
    finally:
        for d in daemons:  # the daemons die with the job
            d.proc.send_signal(signal.SIGKILL)
        stop_all(daemons)
    saved = [json.loads((tmp_path / f"ckpt-{r}.json").read_text()) for r in range(world_before)]
    state = saved[0]["state"]
    assert state is not None, "the epoch ended before the checkpoint step; pick an earlier one"
    assert all(s["state"] == state for s in saved), "every rank saves the same (all-rank) state"
    trained_before = sorted(i for s in saved for i in s["trained"])
    assert len(trained_before) == len(set(trained_before))
    assert len(json.dumps(state)) < 4096  # small: a cursor and the exceptions, never tensors

    daemons = start_daemons(after, world_after, job_id + "b", config)
    try:
        results = run_ranks(_train, world_after, after, timeout=300, idle_policy=idle_policy, state=state,
                            checkpoint_at=None, then=0, out="")
    finally:
        stop_all(daemons)
    trained_after = [i for r in results for i in r["trained"]]
    assert sorted(trained_before + trained_after) == list(range(N)), (
        f"checkpoint at step {checkpoint_at}, killed {then} steps later: a sample missing or trained twice")


def _loader(**kw) -> "odb.OdbDataLoader":
    return odb.OdbDataLoader(_corpus(), rank=0, world_size=1, run_dir="/tmp/odb-unused", **kw)


def test_state_is_compact_and_round_trips() -> None:
    packed = compress_ints([0, 1, 2, 3, 7, 9])
    assert packed == {"cursor": 4, "extra": [7, 9]}
    assert expand_ints(packed).tolist() == [0, 1, 2, 3, 7, 9]
    loader = _loader(shuffle=True, seed=3)
    loader._log.reset(0)
    loader._log.add(loader.indices()[:50])
    state = loader.state_dict()
    assert state["consumed"] == {"cursor": 50, "extra": []}  # positions in the epoch's order: a prefix
    fresh = _loader(shuffle=True, seed=3)
    fresh.load_state_dict(state)
    assert sorted(fresh.indices() + loader.indices()[:50]) == list(range(N))
    # At another world size, the rest is split over the new ranks, each sample once.
    shares = []
    for rank in range(3):
        other = odb.OdbDataLoader(_corpus(), rank=rank, world_size=3, shuffle=True, seed=3,
                                  run_dir="/tmp/odb-unused")
        other.load_state_dict(state)
        shares += other.indices()
    assert sorted(shares + loader.indices()[:50]) == list(range(N))


def test_a_resume_at_another_world_size_does_not_continue_the_states_round() -> None:
    """A reproducible state resumed at another world size is not replayed: the new daemons number their
    rounds from 0, so a round of the new run that has the state's round number is another round, and
    the state's in-round samples are not part of it (else a later replay would send them again)."""
    first = _loader(shuffle=True, seed=3)
    first._log.reset(0)
    first._log.add(first.indices()[:10], step=0)
    first._log.last_step = (0, 0, 0, 3, True)  # step 0 of round 0 (3 steps)
    state = first.state_dict()
    assert expand_ints(state["replay"]["round_consumed"]).size == 10
    state["replay"]["world_size"] = 2  # taken at 2 ranks, resumed at 1
    second = _loader(shuffle=True, seed=3)
    second.load_state_dict(state)
    mine = second.indices()[:5]
    second._log.reset(0)
    second._log.add(mine, step=0)
    second._log.last_step = (0, 0, 0, 3, True)  # the new run's round 0
    again = second.state_dict()
    order = second._order.global_order().tolist()
    assert sorted(expand_ints(again["replay"]["round_consumed"]).tolist()) == sorted(order.index(i) for i in mine)


@pytest.mark.parametrize("damage,message", [
    (lambda s: s.pop("consumed"), "truncated"),
    (lambda s: s.update(version=99), "version 99"),
    (lambda s: s.update(format="something else"), "not an odb loader state"),
    (lambda s: s.update(consumed={"cursor": 3, "extra": [2]}), "malformed"),
    (lambda s: s.update(consumed={"cursor": "x", "extra": []}), "malformed"),
    (lambda s: s.update(dataset_len=5), "dataset of 5"),
    (lambda s: s.update(seed=4), "seed=4"),
    (lambda s: s.update(scope="this_rank"), "one rank's samples only"),
    (lambda s: s.update(consumed={"cursor": 0, "extra": [N + 5]}), "names position"),
])
def test_a_corrupt_truncated_or_foreign_state_is_a_clear_error(damage, message) -> None:
    loader = _loader(shuffle=True, seed=3)
    loader._log.reset(0)
    loader._log.add(loader.indices()[:10])
    state = loader.state_dict()
    damage(state)
    with pytest.raises(ValueError, match=message):
        _loader(shuffle=True, seed=3).load_state_dict(state)
