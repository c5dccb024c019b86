"""Resume with a custom sampler (docs/resume.md): the state keys what was trained by position in each
rank's list, so a sampler that repeats indices (with replacement, weighted) resumes exactly: every
position of the epoch is trained once over the interruptions, repeats included. Real daemons, real
DataLoader workers; the job (trainers with their workers, and the daemons) is SIGKILLed a few steps
after each checkpoint, as a preempted job is, and a fresh one loads the state.

Also: a state of odb < 4 (a custom sampler's `key: id`) still loads, with its meaning."""
from __future__ import annotations

import json
import random
import signal
from collections import Counter
from pathlib import Path

import pytest
import torch

import odb
import tiny_lm
from odbtest_py import kill_rank, report, run_ranks, run_until_preempted, start_daemons, stop_all

N_DATASET = 12  # a small dataset, oversampled: every index comes back many times
PER_RANK = 60


def _lengths() -> list:
    return tiny_lm.long_tail_lengths(N_DATASET, seed=5, min_len=4, max_len=60, median=20)


def _weighted(rank: int, world: int, n: int) -> list:
    """This rank's list: indices drawn with replacement, weighted towards a few (the same list on every
    draw: a seeded generator)."""
    weights = torch.tensor([8.0, 1, 1, 4, 1, 1, 1, 2, 1, 1, 3, 1][:n])
    g = torch.Generator().manual_seed(4321 + rank)
    return [int(i) for i in torch.utils.data.WeightedRandomSampler(weights, PER_RANK, replacement=True,
                                                                      generator=g)]


def _shard(rank: int, world: int, n: int) -> list:
    """A sampler without repeats: a seeded permutation of the dataset, this rank's share [rank::world]."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(99)).tolist()
    return order[rank::world]


SAMPLERS = {"weighted": _weighted, "shard": _shard}


def _train(rank: int, world: int, run_dir: str, sampler: str, n: int, state: dict | None,
           checkpoint_at: int | None, then: int, out: str) -> dict:
    """Trains the epoch from `state`; with `checkpoint_at`, saves the loader state after that step,
    trains `then` more steps (lost with the job) and is preempted."""
    corpus = tiny_lm.SyntheticCorpus(_lengths() if n == N_DATASET else
                                     tiny_lm.long_tail_lengths(n, seed=5, min_len=4, max_len=60, median=20), vocab=64)
    loader = odb.OdbDataLoader(corpus, sampler=SAMPLERS[sampler](rank, world, n), num_workers=1,
                               idle_policy="zero_step", timeout_s=90)
    if state is not None:
        loader.load_state_dict(state)
    trained: list = []
    steps = 0
    saved = False
    for step in loader:
        b = step.batch
        for sid, row, length in zip(step.sample_ids, b["input_ids"], step.lengths):
            assert torch.equal(row[:length], corpus[sid]["input_ids"]), f"sample {sid}: payload changed"
        trained.extend(int(i) for i in step.sample_ids)
        if checkpoint_at is not None and steps == checkpoint_at:
            Path(out.format(rank=rank)).write_text(json.dumps({"state": loader.state_dict(), "trained": trained}))
            saved = True
            report("checkpointed")
        steps += 1
        if checkpoint_at is not None and steps > checkpoint_at + then:
            kill_rank()  # preempted: nothing after this is kept
    if checkpoint_at is not None:
        if not saved:
            raise AssertionError(f"the epoch ended after {steps} steps, before the checkpoint at {checkpoint_at}")
        kill_rank()
    return {"trained": trained}


def _run_interrupted(tmp_path: Path, job_id: str, config: dict, sampler: str, n: int, worlds: list,
                     seed: str) -> Counter:
    """Runs the epoch through len(worlds) - 1 preemptions (world size worlds[k] in run k); returns what
    was trained over all runs (the samples up to each checkpoint, and the last run's)."""
    rng = random.Random(seed)
    state = None
    trained: Counter = Counter()
    for k, world in enumerate(worlds):
        run_dir = tmp_path / f"run{k}"
        daemons = start_daemons(run_dir, world, f"{job_id}{k}", config)
        last = k == len(worlds) - 1
        try:
            if last:
                results = run_ranks(_train, world, run_dir, timeout=240, sampler=sampler, n=n, state=state,
                                    checkpoint_at=None, then=0, out="")
                trained.update(i for r in results for i in r["trained"])
                continue
            out = str(tmp_path / f"ckpt{k}-{{rank}}.json")
            run_until_preempted(_train, world, run_dir, 240, sampler=sampler, n=n, state=state,
                                checkpoint_at=rng.randrange(0, 3), then=rng.randrange(0, 3), out=out)
        finally:
            if not last:
                for d in daemons:  # the daemons die with the job
                    d.proc.send_signal(signal.SIGKILL)
            stop_all(daemons)
        saved = [json.loads(Path(out.format(rank=r)).read_text()) for r in range(world)]
        state = saved[0]["state"]
        assert all(s["state"] == state for s in saved), "every rank saves the same (all-rank) state"
        assert state["key"] == "rank_position" and len(state["consumed"]) == world
        trained.update(i for s in saved for i in s["trained"])
    return trained


@pytest.mark.parametrize("planner,deterministic", [("local", False), ("global", False), ("global", True)])
def test_a_sampler_with_replacement_resumes_every_position_once(tmp_path, job_id, planner, deterministic) -> None:
    """Two preemptions at 2 ranks: each of the 120 positions (12 indices, one of them ~1/3 of the list)
    is trained once over the three runs. Keyed by index (odb < 4), an index trained before a checkpoint
    was skipped at every later position of it: most of the epoch was lost."""
    config = tiny_lm.daemon_config(max_tokens=128, grouping={"window": 12},
                                   alignment={"planner": planner, "deterministic": deterministic})
    trained = _run_interrupted(tmp_path, job_id, config, "weighted", N_DATASET, [2, 2, 2],
                               f"{planner}-{deterministic}")
    chosen = Counter(_weighted(0, 2, N_DATASET) + _weighted(1, 2, N_DATASET))
    assert max(chosen.values()) > 10, "the sampler was meant to repeat indices"
    assert trained == chosen, (f"trained - chosen {sorted((trained - chosen).items())}, "
                               f"chosen - trained {sorted((chosen - trained).items())}")


def _train_steps(rank: int, world: int, run_dir: str, state: dict | None, checkpoint_at: int | None, then: int,
                 out: str) -> dict:
    """The weighted sampler's epoch, every step this rank yields as (index, sample ids, weight, owner ranks,
    seqs); with `checkpoint_at` as _train (saves the state after that step, is preempted `then` later)."""
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus(_lengths(), vocab=64),
                               sampler=_weighted(rank, world, N_DATASET), num_workers=1, timeout_s=90)
    if state is not None:
        loader.load_state_dict(state)
    steps: list = []
    for count, step in enumerate(loader):
        if step.idle:
            continue
        steps.append([step.step_index, list(step.sample_ids), round(step.loss_weight, 12), list(step.owner_ranks),
                      list(step.seqs)])
        if checkpoint_at is not None and count == checkpoint_at:
            Path(out.format(rank=rank)).write_text(json.dumps({"state": loader.state_dict(), "steps": steps}))
            report("checkpointed")
        if checkpoint_at is not None and count >= checkpoint_at + then:
            kill_rank()
    return {"steps": steps}


def test_a_reproducible_resume_with_repeats_replays_step_for_step(tmp_path, job_id) -> None:
    """Reproducible mode, global planner, a sampler with replacement: each step names its samples' seqs
    (their positions in the owner rank's list; moved samples keep theirs), so the state names the exact
    copies trained and the resumed run trains the uninterrupted run's remaining steps, step for step.
    Without the seqs the copy of a repeated index was a guess and the state fell back to replay: null
    (exactly once, but other steps)."""
    world = 2
    config = tiny_lm.daemon_config(max_tokens=128, grouping={"window": 12},
                                   alignment={"planner": "global", "deterministic": True})
    lists = [_weighted(r, world, N_DATASET) for r in range(world)]

    def run(name: str, **args) -> list:
        daemons = start_daemons(tmp_path / name, world, job_id + name, config)
        try:
            return [r["steps"] for r in run_ranks(_train_steps, world, tmp_path / name, timeout=240, **args)]
        finally:
            stop_all(daemons)

    reference = run("ref", state=None, checkpoint_at=None, then=0, out="")
    # Step.seqs arrives: every sample names its position in its owner's list, every position exactly once,
    # also the samples the global planner moved to another rank.
    positions = [(owner, seq) for steps in reference for step in steps for owner, seq in zip(step[3], step[4])]
    assert sorted(positions) == [(r, p) for r in range(world) for p in range(len(lists[r]))]
    for steps in reference:
        for _, ids, _, owners, seqs in steps:
            assert [lists[o][q] for o, q in zip(owners, seqs)] == ids
    moved = sum(o != rank for rank, steps in enumerate(reference) for step in steps for o in step[3])
    assert moved > 0, "the global planner moved no sample: the test does not cover moved seqs"

    checkpoint_at = random.Random("repeats").randrange(2, len(reference[0]) - 4)
    daemons = start_daemons(tmp_path / "killed", world, job_id + "k", config)
    try:
        run_until_preempted(_train_steps, world, tmp_path / "killed", 240, state=None, checkpoint_at=checkpoint_at,
                            then=1, out=str(tmp_path / "ckpt-{rank}.json"))
    finally:
        for d in daemons:
            d.proc.send_signal(signal.SIGKILL)
        stop_all(daemons)
    saved = [json.loads((tmp_path / f"ckpt-{r}.json").read_text()) for r in range(world)]
    state = saved[0]["state"]
    assert state["replay"] is not None, "the state fell back to an ordinary resume"
    resumed = run("resumed", state=state, checkpoint_at=None, then=0, out="")

    def same(steps: list) -> list:
        # A step as (index, its samples with their owners, weight). With copies of one index in a step the
        # rows' order, and which copy (seq) sits in which row, may differ between runs (the rows hold the
        # same data); the resumed run's seqs index its own lists anyway.
        return [(s[0], sorted(zip(s[1], s[3])), s[2]) for s in steps]

    for rank in range(world):
        done = len(saved[rank]["steps"])
        assert same(saved[rank]["steps"]) == same(reference[rank][:done])
        assert same(resumed[rank]) == same(reference[rank][done:]), (
            f"rank {rank}: after the checkpoint the resumed steps differ from the uninterrupted run's")


def test_a_custom_sampler_resumed_at_another_world_size_trains_every_index_once(tmp_path, job_id) -> None:
    """2 -> 3 ranks: the positions of 2 lists do not name samples of 3 lists; the state's consumed
    indices do (consumed_ids), so a sampler without repeats still resumes exactly once."""
    n = 150
    config = tiny_lm.daemon_config(max_tokens=128, alignment={"planner": "local"})
    trained = _run_interrupted(tmp_path, job_id, config, "shard", n, [2, 3], "resize")
    assert trained == Counter(range(n)), (f"trained twice {sorted(i for i, c in trained.items() if c > 1)}, "
                                          f"missing {sorted(set(range(n)) - set(trained))}")


def _loader(sampler: list, rank: int = 0, world: int = 1) -> "odb.OdbDataLoader":
    return odb.OdbDataLoader(tiny_lm.SyntheticCorpus(_lengths(), vocab=64), sampler=sampler, rank=rank,
                             world_size=world, run_dir="/tmp/odb-unused")


def _taken(loader: "odb.OdbDataLoader", ids: list, seqs: "list | None" = None) -> None:
    """What the epoch loop records for one yielded step of this rank's own samples. seqs: each sample's
    seq as the step names it (its index among the positions sent); None: the step gives none (a daemon
    older than Step.seqs), -1 for each."""
    import numpy as np

    if loader._order.plan is None:
        loader._order.start_epoch()
    if loader._log.epoch != loader.epoch:
        loader._log.reset(loader.epoch)
    loader._log.add(ids, owners=np.full(len(ids), loader.rank, dtype=np.int64), seqs=seqs)


LIST = [0, 3, 0, 1, 0, 3, 7, 0, 2, 0, 3, 5]


def test_state_by_position_counts_each_copy_once_and_chains() -> None:
    first = _loader(LIST)
    _taken(first, [0, 3, 0])
    state = first.state_dict()
    assert state["version"] == 4 and state["key"] == "rank_position"
    assert state["consumed"] == [{"cursor": 3, "extra": []}]  # positions 0, 1, 2 of the list: a prefix
    second = _loader(LIST)
    second.load_state_dict(state)
    assert Counter(second.indices()) + Counter([0, 3, 0]) == Counter(LIST)
    second._order.start_epoch()
    _taken(second, [0, 1])  # a second run: its copies take the free positions left after the first's
    third = _loader(LIST)
    third.load_state_dict(second.state_dict())
    assert third.indices() == [3, 7, 0, 2, 0, 3, 5]
    # A sampler that draws another list than the checkpoint's: positions would name other samples.
    other = _loader(LIST[::-1])
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="another list: rank 0's sampler"):
        other.indices()


def test_a_state_of_odb_3_keyed_by_index_still_loads_with_its_meaning() -> None:
    """Version 3 (`key: id`, a set of dataset indices): every position of a consumed index counts as
    consumed, as odb 3 resumed it; the next checkpoint writes positions (version 4)."""
    state = _loader(LIST).state_dict()
    for k in ("consumed_ids", "lists"):
        state.pop(k)
    state.update(version=3, key="id", consumed={"cursor": 0, "extra": [0, 3]}, replay=None)
    loader = _loader(LIST)
    loader.load_state_dict(state)
    assert loader.indices() == [1, 7, 2, 5]
    loader._order.start_epoch()
    _taken(loader, [7])
    again = loader.state_dict()
    assert again["key"] == "rank_position" and again["consumed"] == [{"cursor": 3, "extra": [4, 5, 6, 7, 9, 10]}]
    fresh = _loader(LIST)
    fresh.load_state_dict(again)
    assert fresh.indices() == [1, 2, 5]


@pytest.mark.parametrize("damage,message", [
    (lambda s: s.update(key="rank_position", version=3), "key 'rank_position' \\(version 3\\)"),
    (lambda s: s.update(key="position"), "key 'position'"),
    (lambda s: s.update(consumed={"cursor": 0, "extra": []}), "malformed consumed"),
    (lambda s: s.update(consumed=[{"cursor": 1, "extra": [0]}]), "malformed consumed\\[0\\] set"),
    (lambda s: s.update(lists=["a", "b"]), "malformed lists"),
    (lambda s: s.update(consumed=[{"cursor": 0, "extra": [1 << 62]}]), "past any list"),
    (lambda s: s.pop("consumed_ids"), "missing \\['consumed_ids'\\]"),
    (lambda s: s.update(consumed_ids={"cursor": 0, "extra": [N_DATASET]}), f"dataset index {N_DATASET}"),
])
def test_a_malformed_position_state_is_a_clear_error(damage, message) -> None:
    loader = _loader(LIST)
    _taken(loader, [0, 3])
    state = loader.state_dict()
    damage(state)
    with pytest.raises(ValueError, match=message):
        _loader(LIST).load_state_dict(state)


def test_a_position_past_the_list_is_a_clear_error() -> None:
    loader = _loader(LIST)
    _taken(loader, [0])
    state = loader.state_dict()
    state["consumed"] = [{"cursor": 0, "extra": [len(LIST) + 3]}]
    state["lists"] = [None]
    fresh = _loader(LIST)
    fresh.load_state_dict(state)
    with pytest.raises(ValueError, match=f"position {len(LIST) + 3} of rank 0's list"):
        fresh.indices()


def test_a_replay_keeps_positions_and_is_dropped_when_a_copy_is_ambiguous() -> None:
    """Reproducible mode: the replayed round's list is each rank's list less the positions of the rounds
    before it. Steps without seqs (a daemon older than Step.seqs) name indices, not positions: when another
    copy of an index taken before the round is still free, which copy was taken is a guess, so the state
    resumes the ordinary (exactly-once) way."""
    plain = _loader([4, 1, 6, 0, 2])
    _taken(plain, [4, 1])  # step 0: round 0
    _taken(plain, [6])     # step 1: the first of round 1's three steps, the checkpoint
    plain._log.last_step = (1, 1, 1, 3, True)
    state = plain.state_dict()
    assert state["replay"] == {"round": 1, "first_step": 1, "next_step": 2, "world_size": 1,
                               "round_consumed": [{"cursor": 0, "extra": [2]}]}
    resumed = _loader([4, 1, 6, 0, 2])
    resumed.load_state_dict(state)
    assert resumed.indices() == [6, 0, 2]  # the round replays from its first step: 6 is planned (and skipped) again

    repeated = _loader(LIST)
    _taken(repeated, [0, 3])
    _taken(repeated, [1])
    repeated._log.last_step = (1, 1, 1, 3, True)
    state = repeated.state_dict()
    assert state["replay"] is None  # index 0 waits at 4 more positions: which one round 0 took is unknown
    assert state["consumed"] == [{"cursor": 2, "extra": [3]}]  # positions 0, 1 and 3


def test_steps_with_seqs_key_the_exact_copy_and_the_replay_stays_exact() -> None:
    """Each step names its samples' seqs (Step.seqs), so the copy of a repeated index a step took is known:
    the state names exactly those positions and a reproducible resume replays the round (no guess)."""
    repeated = _loader(LIST)
    _taken(repeated, [0, 3], seqs=[2, 1])  # round 0: the second copy of 0 (position 2) and position 1
    _taken(repeated, [1], seqs=[3])       # round 1's first step, the checkpoint
    repeated._log.last_step = (1, 1, 1, 3, True)
    state = repeated.state_dict()
    assert state["consumed"] == [{"cursor": 0, "extra": [1, 2, 3]}]  # positions 1, 2, 3: not the first 0
    assert state["replay"] == {"round": 1, "first_step": 1, "next_step": 2, "world_size": 1,
                               "round_consumed": [{"cursor": 0, "extra": [3]}]}
    resumed = _loader(LIST)
    resumed.load_state_dict(state)
    # The uninterrupted list less the positions of round 0 (1 and 2); round 1 replays from its start.
    assert resumed.indices() == [0, 1, 0, 3, 7, 0, 2, 0, 3, 5]
    # The resumed run's seqs index its own sent list (positions 0, 3, 4, 5, ...): seq 0 is position 0,
    # seq 3 position 5 (the second copy of 3).
    resumed._order.start_epoch()
    resumed._log.reset(resumed.epoch)
    _taken(resumed, [0, 3], seqs=[0, 3])
    again = resumed.state_dict()
    assert again["consumed"] == [{"cursor": 4, "extra": [5]}]
    # A step that names a seq the rank never sent, or another index than the list holds there, is an error.
    bad = _loader(LIST)
    _taken(bad, [0], seqs=[len(LIST)])
    with pytest.raises(RuntimeError, match=f"seq {len(LIST)} of this rank's list, which sent {len(LIST)}"):
        bad.state_dict()
    wrong = _loader(LIST)
    _taken(wrong, [7], seqs=[0])
    with pytest.raises(RuntimeError, match="sample 7 at seq 0, where this rank's list holds 0"):
        wrong.state_dict()
