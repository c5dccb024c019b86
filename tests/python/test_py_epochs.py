"""Several epochs through one OdbDataLoader per rank, as a training script runs them: set_epoch,
fresh DataLoader workers each epoch, a shuffled sampler, both IDLE policies and both planners.
Every epoch trains every sample exactly once, on the same number of steps on both ranks, and
the order differs between epochs."""
from __future__ import annotations

import pytest
import torch

import odb
import tiny_lm
from odbtest_py import check_step_invariants, run_ranks, start_daemons, step_record, stop_all, with_dropped_idle

N, EPOCHS = 120, 3


def _rank(rank: int, world: int, run_dir: str, idle_policy: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    lengths = tiny_lm.long_tail_lengths(N, seed=5, min_len=4, max_len=120, median=30)
    torch.manual_seed(0)
    model = tiny_lm.TinyCausalLM(vocab=64, d_model=16, layers=1, heads=2, max_len=128)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loader = odb.OdbDataLoader(tiny_lm.SyntheticCorpus(lengths, vocab=64), shuffle=True, seed=3, num_workers=1,
                               idle_policy=idle_policy, timeout_s=60)
    per_epoch = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        trained, steps, records = [], 0, []

        def run() -> None:
            nonlocal steps
            for step in loader:
                b = step.batch
                loss = odb.weighted_cross_entropy(ddp(b["input_ids"], b["attention_mask"]), b["labels"],
                                                  step.loss_weight, step.real_tokens)
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
                trained.extend(step.sample_ids)
                records.append(step_record(step))

        if idle_policy == "join":
            with ddp.join():
                run()
            loader.wait_epoch_end()
            records = with_dropped_idle(records, loader)
        else:
            run()
        per_epoch.append({"records": records, "trained": trained, "steps": steps, "dropped_idle": loader.dropped_trailing_idle,
                          "summary": loader.last_summary, "indices": loader.indices()})
    return {"epochs": per_epoch}


@pytest.mark.parametrize("idle_policy,planner", [("join", "local"), ("zero_step", "global")])
def test_three_epochs_each_cover_every_sample_once(run_dir, job_id, idle_policy, planner) -> None:
    config = tiny_lm.daemon_config(max_tokens=256, alignment={"planner": planner})
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        r0, r1 = run_ranks(_rank, 2, run_dir, timeout=300, idle_policy=idle_policy)
    finally:
        stop_all(daemons)
    orders = []
    for e in range(EPOCHS):
        a, b = r0["epochs"][e], r1["epochs"][e]
        assert a["summary"]["epoch"] == b["summary"]["epoch"] == e
        assert sorted(a["trained"] + b["trained"]) == list(range(N)), f"epoch {e}: a sample missing or twice"
        assert a["summary"]["steps"] == b["summary"]["steps"]
        check_step_invariants([a["records"], b["records"]], 2)
        assert {s.epoch for s in a["records"] + b["records"]} == {e}
        for r in (a, b):
            assert r["steps"] + r["dropped_idle"] == r["summary"]["steps"]
        orders.append(a["indices"] + b["indices"])
    # set_epoch reshuffles: each epoch feeds the ranks a different order.
    assert orders[0] != orders[1] != orders[2]
