"""Schedules and budgets over accumulation windows (docs/python.md, "Schedules and budgets"), with real
daemons and 2 DDP ranks:

* optimizer_steps_per_epoch(): an estimate before the first epoch, then the count of the epoch seen, the
  same on every rank; loss_tokens_per_epoch() exact after it;
* odb.lr_by_tokens: LambdaLR factors that follow the loss tokens of the windows trained, the same on every
  rank, continued (not restarted) after a kill and a resume from the loader's state;
* stop_at_loss_tokens: every rank stops after the same window, the one that reaches the budget, and a
  resumed job stops there too; stop_at_samples: exactly that many samples trained, across a kill;
* the window index continues after a resume (new daemons count from 0);
* under the join policy, the windows a joined rank drains in the background count too."""
from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from typing import List, Optional

import torch

import odb
import tiny_lm
from odbtest_py import kill_rank, report, run_ranks, run_until_preempted, start_daemons, stop_all

N = 200
TARGET = 600  # loss tokens per optimizer step, all ranks
BASE_LR = 0.1


def _corpus() -> tiny_lm.SyntheticCorpus:  # 8370 tokens, every one a loss token
    return tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(N, seed=5, max_len=64), vocab=64)


def _config() -> dict:
    return tiny_lm.daemon_config(max_tokens=128, grouping={"window": 32}, optimizer={"tokens_per_step": TARGET})


def _job(rank: int, world: int, run_dir: str, epochs: int, state: Optional[dict], total_tokens: int,
         checkpoint_at: Optional[int] = None, then: int = 0, out: str = "", **loader_args) -> dict:
    """Trains `epochs` epochs with windows and an LR schedule by tokens; with `checkpoint_at`, saves the
    loader state after that optimizer step, trains `then` more micro-steps and is preempted."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = tiny_lm.TinyCausalLM(vocab=64, d_model=16, layers=1, heads=2, max_len=128)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=BASE_LR)
    loader = odb.OdbDataLoader(_corpus(), shuffle=True, seed=11, num_workers=1, timeout_s=90,
                               tokens_per_optimizer_step=TARGET, **loader_args)
    if state is not None:
        loader.load_state_dict(state)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, odb.lr_by_tokens(loader, total_tokens, warmup_tokens=2 * TARGET, decay="cosine", final_ratio=0.1))
    estimate = loader.optimizer_steps_per_epoch()
    estimated_tokens = loader.loss_tokens_per_epoch()
    steps, per_epoch, saved, micro = [], [], None, 0
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for step in loader:
            lr = opt.param_groups[0]["lr"]
            with odb.window_sync(ddp, step):
                b = step.batch
                logits = ddp(b["input_ids"], b["attention_mask"])
                ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), b["labels"].reshape(-1).long(),
                                                       ignore_index=-100, reduction="sum")
                odb.window_loss(ce, step).backward()
            steps.append({"epoch": step.epoch, "index": step.step_index, "window": step.window,
                          "closes": step.closes_window, "window_tokens": step.window_loss_tokens, "lr": lr,
                          "ids": list(step.sample_ids)})
            if step.closes_window:
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
            micro += 1
            if checkpoint_at is not None and saved is None and loader.job_optimizer_steps == checkpoint_at:
                saved = {"state": loader.state_dict(), "steps": steps}
                Path(out.format(rank=rank)).write_text(json.dumps(saved))
                report("checkpointed")
                micro = 0
            elif saved is not None and micro > then:
                kill_rank()
        per_epoch.append({"epoch": epoch, "steps_per_epoch": loader.optimizer_steps_per_epoch()
                          if not loader.budget_reached else None,
                          "tokens_per_epoch": list(loader.loss_tokens_per_epoch()),
                          "budget_reached": loader.budget_reached})
    return {"estimate": estimate, "estimated_tokens": list(estimated_tokens), "steps": steps,
            "per_epoch": per_epoch, "job_loss_tokens": loader.job_loss_tokens,
            "job_optimizer_steps": loader.job_optimizer_steps, "budget_reached": loader.budget_reached}


def _factor(seen: int, total: int) -> float:
    """The schedule the job asked for, written out again: warmup over 2 windows, cosine to 0.1."""
    warm = 2 * TARGET
    if seen < warm:
        return (seen + 1) / (warm + 1)
    p = min(1.0, (seen - warm) / (total - warm))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))


def _check_lrs(steps: List[dict], total: int, seen: int = 0) -> int:
    """Each micro-step ran at the LR of the loss tokens of the windows closed before it; returns the tokens."""
    for s in steps:
        assert math.isclose(s["lr"], BASE_LR * _factor(seen, total), rel_tol=1e-9), (s, seen)
        if s["closes"]:
            seen += s["window_tokens"]
    return seen


def test_optimizer_steps_per_epoch_and_lr_by_tokens(tmp_path, job_id) -> None:
    daemons = start_daemons(tmp_path, 2, job_id, _config())
    try:
        total = 3 * 8370
        results = run_ranks(_job, 2, tmp_path, timeout=240, epochs=3, state=None, total_tokens=total)
    finally:
        stop_all(daemons)
    a, b = results
    assert [s for s in a["steps"] if s["closes"]] and a["per_epoch"] == b["per_epoch"]
    closes = {e: [s for s in a["steps"] if s["closes"] and s["epoch"] == e] for e in range(3)}
    counts = [len(closes[e]) for e in range(3)]
    tokens = [sum(s["window_tokens"] for s in closes[e]) for e in range(3)]
    assert tokens[0] == tokens[1] == tokens[2], "every epoch trains the same samples"
    # Before any epoch: the probe covers this small dataset, so the tokens are exact and the window count
    # is off only by the windows' sizes (their mean within 2% of the target, a short last one).
    assert a["estimated_tokens"] == [tokens[0], False]
    assert abs(a["estimate"] - counts[0]) <= 0.03 * counts[0] + 1, (a["estimate"], counts)
    # After epoch 0: its count and its tokens, exact, on every rank.
    assert a["per_epoch"][0]["steps_per_epoch"] == counts[0]
    assert a["per_epoch"][0]["tokens_per_epoch"] == [tokens[0], True]
    assert all(abs(c - counts[0]) <= 1 for c in counts), counts
    # The schedule follows tokens, the same on every rank; the window index runs 0.. in each epoch.
    assert [s["lr"] for s in a["steps"]] == [s["lr"] for s in b["steps"]]
    assert _check_lrs(a["steps"], total) == a["job_loss_tokens"] == sum(tokens)
    assert a["job_optimizer_steps"] == sum(counts)
    for e in range(3):
        assert [s["window"] for s in closes[e]] == list(range(counts[e]))


def _preempted(tmp_path: Path, job_id: str, name: str, **args) -> dict:
    run_dir = tmp_path / name
    daemons = start_daemons(run_dir, 2, f"{job_id}{name}", _config())
    out = str(tmp_path / f"{name}-{{rank}}.json")
    try:
        run_until_preempted(_job, 2, run_dir, 240, out=out, **args)
    finally:
        for d in daemons:  # the daemons die with the job
            d.proc.send_signal(signal.SIGKILL)
        stop_all(daemons)
    saved = [json.loads(Path(out.format(rank=r)).read_text()) for r in range(2)]
    assert saved[0]["state"] == saved[1]["state"]
    return saved[0]


def _resumed(tmp_path: Path, job_id: str, state: dict, **args) -> list:
    daemons = start_daemons(tmp_path / "after", 2, f"{job_id}after", _config())
    try:
        return run_ranks(_job, 2, tmp_path / "after", timeout=240, state=state, **args)
    finally:
        stop_all(daemons)


def test_token_budget_stops_every_rank_after_the_same_window_across_a_kill(tmp_path, job_id) -> None:
    budget, total = 12000, 12000  # about 1.4 epochs of loss tokens (8370 each)
    saved = _preempted(tmp_path, job_id, "before", epochs=5, state=None, total_tokens=total, checkpoint_at=4,
                       then=3, stop_at_loss_tokens=budget)
    state, before = saved["state"], saved["steps"]
    assert state["job"]["optimizer_steps"] == 4 and not state["epoch_complete"]
    seen = _check_lrs(before, total)
    assert state["job"]["loss_tokens"] == seen
    a, b = _resumed(tmp_path, job_id, state, epochs=5, total_tokens=total, stop_at_loss_tokens=budget)
    assert a["steps"] == b["steps"] or [(s["epoch"], s["index"]) for s in a["steps"]] == [
        (s["epoch"], s["index"]) for s in b["steps"]], "the ranks ran different steps"
    last = a["steps"][-1]
    assert last["closes"] and (last["epoch"], last["index"]) == (b["steps"][-1]["epoch"], b["steps"][-1]["index"])
    # The schedule and the window index continue where the checkpoint left them.
    assert _check_lrs(a["steps"], total, seen) == a["job_loss_tokens"] == b["job_loss_tokens"]
    assert a["steps"][0]["window"] == 4, "the first window after the resume is the epoch's 5th"
    # Stopped at the window that reached the budget, on every rank; later epochs empty.
    assert a["job_loss_tokens"] >= budget > a["job_loss_tokens"] - last["window_tokens"]
    assert a["budget_reached"] and b["budget_reached"]
    assert last["epoch"] == 1 and {s["epoch"] for s in a["steps"]} == {0, 1}


def test_sample_budget_trains_exactly_that_many_across_a_kill(tmp_path, job_id) -> None:
    budget = N + N // 2 + 1  # the second epoch's first 101 samples of its order
    # Checkpoint inside the second epoch (an epoch is ~14 windows of 8370 loss tokens).
    saved = _preempted(tmp_path, job_id, "before", epochs=4, state=None, total_tokens=20000, checkpoint_at=17,
                       then=2, stop_at_samples=budget)
    state = saved["state"]
    assert state["epoch"] == 1 and not state["epoch_complete"], "pick a checkpoint inside the second epoch"
    a, b = _resumed(tmp_path, job_id, state, epochs=4, total_tokens=20000, stop_at_samples=budget)
    before = [i for s in saved["steps"] for i in s["ids"]]  # rank 0's steps before the checkpoint
    # rank 1's steps before the checkpoint are in its file: the same state, its own steps
    other = json.loads(Path(str(tmp_path / "before-1.json")).read_text())["steps"]
    trained = before + [i for s in other for i in s["ids"]] + [i for r in (a, b) for s in r["steps"] for i in s["ids"]]
    assert len(trained) == budget, f"trained {len(trained)} samples, the budget is {budget}"
    epoch1 = sorted([i for s in saved["steps"] + other if s["epoch"] == 1 for i in s["ids"]] +
                    [i for r in (a, b) for s in r["steps"] for i in s["ids"]])
    order = odb.OdbDataLoader(_corpus(), shuffle=True, seed=11, rank=0, world_size=2,
                              ingest_endpoint="ipc:///nonexistent", trainer_endpoint="ipc:///nonexistent")
    order.set_epoch(1)
    assert epoch1 == sorted(order._order.global_order()[:budget - N].tolist()), "the epoch order's first samples"
    assert a["budget_reached"] and b["budget_reached"]
    assert a["per_epoch"][0]["epoch"] == 1 and a["per_epoch"][0]["budget_reached"], "said once the cut epoch ended"
    assert {s["epoch"] for r in (a, b) for s in r["steps"]} == {1}


def _join_job(rank: int, world: int, run_dir: str) -> dict:
    """Two epochs under the join policy: a rank that is done leaves the loop early and its remaining
    (IDLE) steps are drained in the background; their windows must still count."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(tiny_lm.TinyCausalLM(vocab=64, d_model=16, layers=1, heads=2, max_len=128))
    # Uneven shares (rank 0 gets the long samples): rank 1 is done first and joins.
    ids = list(range(N))
    mine = [i for i in ids if (i < N // 3) == (rank == 0)]
    loader = odb.OdbDataLoader(_corpus(), sampler=mine, num_workers=1, timeout_s=90, idle_policy="join",
                               tokens_per_optimizer_step=TARGET)
    out = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        yielded = 0
        with ddp.join():
            for step in loader:
                with odb.window_sync(ddp, step):
                    b = step.batch
                    logits = ddp(b["input_ids"], b["attention_mask"])
                    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), b["labels"].reshape(-1).long(),
                                                           ignore_index=-100, reduction="sum")
                    odb.window_loss(ce, step).backward()
                yielded += 1
        loader.wait_epoch_end()
        out.append({"yielded": yielded, "dropped": loader.dropped_trailing_idle,
                    "job_loss_tokens": loader.job_loss_tokens, "job_optimizer_steps": loader.job_optimizer_steps})
    out.append({"steps_per_epoch": loader.optimizer_steps_per_epoch(), "tokens": list(loader.loss_tokens_per_epoch())})
    return out


def test_join_policy_counts_the_drained_windows_on_every_rank(tmp_path, job_id) -> None:
    config = tiny_lm.daemon_config(max_tokens=128, grouping={"window": 32}, alignment={"planner": "local"},
                                   optimizer={"tokens_per_step": TARGET})
    daemons = start_daemons(tmp_path, 2, job_id, config)
    try:
        a, b = run_ranks(_join_job, 2, tmp_path, timeout=240)
    finally:
        stop_all(daemons)
    assert any(r["dropped"] for r in a[:2] + b[:2]), "no rank left its loop early: the test shows nothing"
    for ea, eb in zip(a[:2], b[:2]):
        assert (ea["job_loss_tokens"], ea["job_optimizer_steps"]) == (eb["job_loss_tokens"], eb["job_optimizer_steps"])
    assert a[2] == b[2] and a[2]["tokens"] == [sum(tiny_lm.long_tail_lengths(N, seed=5, max_len=64)), True]
