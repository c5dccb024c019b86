"""Join policy with IDLE steps in the middle of the epoch (docs/alignment.md,
"IDLE policies"): a rank whose data worker is slow gets IDLE steps while its
peer trains real ones. Its loader must not hold those IDLE steps back waiting
to see whether they are the epoch's trailing ones: the peer's real step is a
DDP collective that needs this rank, and the peer's daemon queue holds only
`emit.queue_steps` steps. Holding them hung the job (both loaders waited for a
step, the daemons waited for queue space) until the loader's timeout.

Real daemons, DataLoader worker processes and torch DDP over gloo. The slow
worker is a preprocessing delay on one rank's first and last samples (a cold
cache, a slow decode; the last ones leave the other rank IDLE at the tail with
the global planner); nothing waits on it for synchronisation, and the test
passes whatever the delay: it only makes the IDLE steps likely."""
from __future__ import annotations

import time

import pytest
import torch

import odb
import tiny_lm
from odbtest_py import run_ranks, start_daemons, stop_all

N = 200


class ColdStartCorpus(torch.utils.data.Dataset):
    """tiny_lm's corpus; on `slow_rank` the first and the last `slow_items`
    samples of the rank's share (N / 2) take `delay_s` each to preprocess."""

    def __init__(self, rank: int, slow_rank: int, slow_items: int, delay_s: float) -> None:
        self.inner = tiny_lm.SyntheticCorpus(
            tiny_lm.long_tail_lengths(N, seed=9, min_len=4, max_len=60, median=20), vocab=64)
        self.slow = rank == slow_rank
        self.slow_items, self.delay_s, self.served = slow_items, delay_s, 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        if self.slow and not self.slow_items <= self.served < N // 2 - self.slow_items:
            time.sleep(self.delay_s)  # slow preprocessing, not synchronisation
        self.served += 1
        return self.inner[i]


def _train(rank: int, world: int, run_dir: str, idle_policy: str, slow_rank: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = tiny_lm.TinyCausalLM(vocab=64, d_model=16, layers=1, heads=2, max_len=64)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    corpus = ColdStartCorpus(rank, slow_rank, slow_items=3, delay_s=1.0)
    loader = odb.OdbDataLoader(corpus, shuffle=True, seed=1, num_workers=1, idle_policy=idle_policy, timeout_s=60)
    trained, dummies = [], 0

    def run() -> None:
        nonlocal dummies
        for step in loader:
            b = step.batch
            for sid, row, length in zip(step.sample_ids, b["input_ids"], step.lengths):
                assert torch.equal(row[:length], corpus.inner[sid]["input_ids"]), f"sample {sid}: payload changed"
            loss = odb.weighted_cross_entropy(ddp(b["input_ids"], b["attention_mask"]), b["labels"],
                                              step.loss_weight, step.real_tokens)
            opt.zero_grad()
            loss.backward()
            opt.step()
            trained.extend(step.sample_ids)
            dummies += step.dummy

    if idle_policy == "join":
        with ddp.join():
            run()
        loader.wait_epoch_end()
    else:
        run()
    return {"trained": trained, "dummies": dummies, "summary": loader.last_summary}


@pytest.mark.parametrize("planner", ["local", "global"])
def test_a_slow_rank_gets_idle_steps_mid_epoch_without_a_hang(run_dir, job_id, planner) -> None:
    # A short queue and wait: the fast rank's daemon plans a few rounds with the slow rank IDLE and
    # then waits for its trainer, which waits in DDP for the slow rank.
    config = tiny_lm.daemon_config(max_tokens=64, grouping={"window": 8},
                                   alignment={"planner": planner, "max_wait_ms": 20},
                                   emit={"queue_steps": 2})
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        results = run_ranks(_train, 2, run_dir, timeout=240, idle_policy="join", slow_rank=1)
    finally:
        stop_all(daemons)
    trained = [i for r in results for i in r["trained"]]
    assert sorted(trained) == list(range(N)), "a sample missing or trained twice"
    assert all(r["summary"] is not None for r in results)
