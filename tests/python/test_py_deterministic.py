"""Reproducible epochs (alignment.deterministic, docs/resume.md): the step
sequence (sample ids per rank per step, loss weights) depends only on the seed
and the data, never on how fast the data workers are; and a job killed after a
checkpoint and resumed from it trains exactly the steps the uninterrupted run
would have trained after that checkpoint, step for step.

Real daemons, real DataLoader worker processes, real torch DDP over gloo. The
workers' speed is varied by a seeded random preprocessing delay per sample
(different seeds in different runs): that is the timing the plan must ignore."""
from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest
import torch

import odb
import tiny_lm
from odbtest_py import kill_rank, report, run_ranks, run_until_preempted, start_daemons, stop_all

N = 160


class SlowCorpus(torch.utils.data.Dataset):
    """tiny_lm's corpus with a random preprocessing delay per sample (seeded
    per run and per sample: two runs with different seeds deliver in a
    different order)."""

    def __init__(self, delay_seed: int) -> None:
        self.inner = tiny_lm.SyntheticCorpus(
            tiny_lm.long_tail_lengths(N, seed=4, min_len=4, max_len=120, median=30), vocab=64)
        self.delay_seed = delay_seed

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        if self.delay_seed >= 0:
            time.sleep(random.Random(self.delay_seed * 100003 + i).random() * 0.006)
        return self.inner[i]


def _config(planner: str, target: int = 0, partition: int = 0) -> dict:
    # A small window, so an epoch takes many rounds (and a resume lands in the middle of one);
    # target: optimizer.tokens_per_step (accumulation windows; 0 = none); partition:
    # alignment.partition_ranks (blocks of that many ranks, one rank per node).
    extra = {"local_world_size": 1} if partition else {}
    return tiny_lm.daemon_config(max_tokens=128, grouping={"window": 12},
                                 alignment={"planner": planner, "deterministic": True, "partition_ranks": partition},
                                 optimizer={"tokens_per_step": target}, **extra)


def _train(rank: int, world: int, run_dir: str, delay_seed: int, state: dict | None, checkpoint_at: int | None,
           then: int, out: str, sampler: bool = False) -> dict:
    """Trains one epoch and returns every step this rank yielded as (index, sample ids, weight). With
    `checkpoint_at`: saves the loader state after that step, trains `then` more and SIGKILLs itself.
    sampler: a custom sampler (this rank's share of a seeded permutation) instead of shuffle=True."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = tiny_lm.TinyCausalLM(vocab=64, d_model=16, layers=1, heads=2, max_len=128)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    corpus = SlowCorpus(delay_seed)
    if sampler:
        mine = torch.randperm(N, generator=torch.Generator().manual_seed(17)).tolist()[rank::world]
        loader = odb.OdbDataLoader(corpus, sampler=mine, num_workers=2, timeout_s=90)
    else:
        loader = odb.OdbDataLoader(corpus, shuffle=True, seed=7, num_workers=2, timeout_s=90)
    if state is not None:
        loader.load_state_dict(state)
    steps: list = []
    for count, step in enumerate(loader):
        b = step.batch
        for sid, row, length in zip(step.sample_ids, b["input_ids"], step.lengths):
            assert torch.equal(row[:length], corpus.inner[sid]["input_ids"]), f"sample {sid}: payload changed"
        logits = ddp(b["input_ids"], b["attention_mask"])
        loss = odb.weighted_cross_entropy(logits, b["labels"], step.loss_weight, step.real_tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps.append([step.step_index, list(step.sample_ids), round(step.loss_weight, 12),
                      [step.window_steps, step.closes_window, step.window_loss_tokens, step.window_short]])
        if checkpoint_at is not None and count == checkpoint_at:
            saved = {"state": loader.state_dict(), "steps": list(steps)}  # a collective: every rank
            Path(out.format(rank=rank)).write_text(json.dumps(saved))
            report("checkpointed")
        if checkpoint_at is not None and count >= checkpoint_at + then:
            kill_rank()  # preempted: nothing after this is kept
    return {"steps": steps}


def _run(tmp: Path, name: str, job_id: str, planner: str, world: int, target: int = 0, partition: int = 0,
         **args) -> list:
    run_dir = tmp / name
    daemons = start_daemons(run_dir, world, job_id + name, _config(planner, target, partition))
    try:
        results = run_ranks(_train, world, run_dir, timeout=300, **args)
    finally:
        stop_all(daemons)
    return [r["steps"] for r in results]


def _kill_after_checkpoint(tmp: Path, job_id: str, planner: str, world: int, checkpoint_at: int, then: int,
                           delay_seed: int, target: int = 0, sampler: bool = False, partition: int = 0) -> list:
    run_dir = tmp / "killed"
    daemons = start_daemons(run_dir, world, job_id + "k", _config(planner, target, partition))
    try:
        run_until_preempted(_train, world, run_dir, 240, delay_seed=delay_seed, state=None,
                            checkpoint_at=checkpoint_at, then=then, out=str(tmp / "ckpt-{rank}.json"), sampler=sampler)
    finally:
        for d in daemons:  # the daemons die with the job
            d.proc.send_signal(signal.SIGKILL)
        stop_all(daemons)
    return [json.loads((tmp / f"ckpt-{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("planner", ["local", "global"])
def test_worker_timing_does_not_change_the_steps(tmp_path, job_id, planner) -> None:
    first = _run(tmp_path, "a", job_id, planner, 2, delay_seed=1, state=None, checkpoint_at=None, then=0, out="")
    second = _run(tmp_path, "b", job_id, planner, 2, delay_seed=2, state=None, checkpoint_at=None, then=0, out="")
    for rank in range(2):
        assert first[rank] == second[rank], f"rank {rank}: the step sequence depends on the workers' timing"
    trained = sorted(i for steps in first for _, ids, _, _ in steps for i in ids)
    assert trained == list(range(N))
    assert len(first[0]) > 8, "the epoch should take many steps (and rounds)"


@pytest.mark.parametrize("planner,seed,target,sampler,partition", [
    ("local", 11, 0, False, 0), ("global", 12, 0, False, 0), ("global", 13, 300, False, 0), ("global", 14, 0, True, 0),
    ("global", 15, 300, False, 2)])
def test_a_resumed_run_trains_the_uninterrupted_runs_steps(tmp_path, job_id, planner, seed, target, sampler,
                                                           partition) -> None:
    """With target: accumulation windows; a checkpoint inside a window resumes the same window (its
    remaining micro-steps, their weights over the whole window, the same closing step). With sampler:
    a custom sampler (the state keys positions in each rank's list: docs/resume.md). With partition:
    partitioned planning (W = 4 in blocks of 2), whose windows are cut from the world-wide totals."""
    world = 4 if partition else 2
    reference = _run(tmp_path, "ref", job_id, planner, world, target=target, delay_seed=3, state=None,
                     checkpoint_at=None, then=0, out="", sampler=sampler, partition=partition)
    if target:
        windows = [w for _, _, _, w in reference[0]]
        assert any(w[0] > 1 for w in windows), "no window of several micro-steps"
        seed += next(k for k in range(100) if not windows[random.Random(seed + k).randrange(2, len(windows) - 4)][1])
    rng = random.Random(seed)
    checkpoint_at = rng.randrange(2, len(reference[0]) - 4)
    then = rng.randrange(0, 3)
    saved = _kill_after_checkpoint(tmp_path, job_id, planner, world, checkpoint_at, then, delay_seed=4,
                                   target=target, sampler=sampler, partition=partition)
    state = saved[0]["state"]
    assert all(s["state"] == state for s in saved), "every rank saves the same (all-rank) state"
    assert state["replay"] is not None and state["replay"]["next_step"] == reference[0][checkpoint_at][0] + 1
    for rank in range(world):  # the killed run was the reference run up to its checkpoint
        assert saved[rank]["steps"] == reference[rank][:checkpoint_at + 1]

    resumed = _run(tmp_path, "resumed", job_id, planner, world, target=target, delay_seed=5, state=state,
                   checkpoint_at=None, then=0, out="", sampler=sampler, partition=partition)
    for rank in range(world):
        assert resumed[rank] == reference[rank][checkpoint_at + 1:], (
            f"rank {rank}: after a checkpoint at step {checkpoint_at} the resumed steps differ from the "
            f"uninterrupted run's")
    before = [i for s in saved for _, ids, _, _ in s["steps"] for i in ids]
    after = [i for steps in resumed for _, ids, _, _ in steps for i in ids]
    assert sorted(before + after) == list(range(N)), "a sample missing or trained twice"


def test_a_sample_without_seq_is_refused_by_a_deterministic_daemon(run_dir, job_id) -> None:
    from odb._native import native

    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=_config("local"))
    try:
        consumer = odb.Consumer(daemon.trainer, 20000)
        consumer.start_epoch(0, 1)
        producer = odb.Producer(daemon.ingest, "noseq", 0)
        int64 = native().DTYPES["int64"]
        for sid, seq in ((10, None), (11, 0), (12, 0), (13, 1)):  # no seq; seq 0; seq 0 again; seq 1
            ids = torch.arange(5, dtype=torch.int64).numpy()
            producer.send(sid, 0, 5, 0, 0, [("input_ids", int64, (5,), ids)], seq=seq)
        producer.end_stream(0)
        trained, rejections = [], []
        while True:
            delivery = consumer.next()
            if not delivery.is_step:
                break
            trained += list(delivery.step.sample_ids)
            rejections += list(delivery.step.rejections)
        assert sorted(trained) == [11, 13]
        by_id = {r.sample_id: r for r in rejections}
        assert sorted(by_id) == [10, 12]
        assert by_id[10].code == "MALFORMED_HEADER" and "has no seq" in by_id[10].message
        assert by_id[12].code == "DUPLICATE_ID" and "seq 0" in by_id[12].message
        del producer
    finally:
        daemon.stop()


class BigSamples(torch.utils.data.Dataset):
    """Samples of 8 KiB of payload each (a 1024-row int64 input_ids)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        ids = torch.full((1024,), i % 50 + 1, dtype=torch.int64)
        return {"input_ids": ids, "labels": ids.clone()}


def test_a_buffer_too_small_for_the_window_is_a_clear_error_not_a_hang(run_dir, job_id) -> None:
    # One window in order (17 samples x 8 KiB) cannot fit a 64 KiB buffer: the rank
    # can never plan. The daemon must say so (STALLED) instead of waiting for ever.
    config = tiny_lm.daemon_config(max_tokens=4096, grouping={"window": 16},
                                   buffer={"max_bytes": 64 << 10, "max_samples": 256},
                                   alignment={"deterministic": True})
    daemon = odb.spawn_daemon(0, 1, run_dir, job_id=job_id, config=config, log_level="warn")
    try:
        loader = odb.OdbDataLoader(BigSamples(), rank=0, world_size=1, run_dir=str(run_dir), num_workers=2,
                                   timeout_s=60)
        with pytest.raises(odb.OdbError) as info:
            for _ in loader:
                pass
        message = str(info.value)
        assert "STALLED" in message or "deterministic" in message, message
        # Names what to raise: the STALLED error, not the loader's own receive timeout.
        assert "buffer.max_bytes" in message and "grouping.window" in message, message
    finally:
        daemon.stop()
