"""Standard vs odb on a small causal transformer, 2 ranks, DDP (gloo, CPU).

Both runs train the same model from the same initialisation on the same
long-tail data (`--epochs`, default 1) with AdamW (`--lr`, a linear warmup of
`--warmup-steps` optimizer steps, then constant) and the same objective: the
mean cross-entropy over every real token of the step on all ranks (token-level
loss weights; padding never counts):
  Standard: random order, fixed batch size B = max_tokens // max_len (fits the
            longest sample under the token budget), padded to the batch max.
  odb:      OdbDataLoader -> one odbd per rank, batches by real length under
            max_tokens (padded cost), steps aligned across ranks; with the
            default --planner global the daemons group across ranks and
            deal groups of similar cost into each step (moving samples).
Prints samples/s, real tokens/s, padding fraction, steps, idle steps, the final
held-out loss and the odb/Standard throughput ratio (--json: one JSON object
instead, with each method's loss curve).

What users run instead (`--methods all`, or a comma list; examples/peers.py has
each one's published description): length_grouped (Hugging Face group_by_length,
padded), packed (padding-free rows of Standard's samples per step, attention per
sequence from cu_seqlens), bucketing (lhotse's DynamicBucketingSampler with
synchronised buckets, windows of the same loss tokens), kk_balanced (verl's
seqlen_balancing: Karmarkar-Karp over the ranks per global batch, packed
micro-batches under the token cap), and odb's packed mode (odb_packed:
collate.packed, grouping.cost_model packed). Every method runs at the same
recipe (--global-batch G: G samples, or their expected loss tokens, per
optimizer step; the same LR schedule and epochs) under the same memory budget
per rank and micro-step (--max-tokens: padded tokens for the padded layout,
real tokens for packed rows). The table has a row per method: optimizer steps,
micro-steps (of the busiest rank), IDLE micro-steps, samples/s, real tokens/s,
padding, the training clock, the held-out loss and every rank's busy time
(forward, backward and optimizer step; waits for the other ranks excluded)
as max/mean. --rounds N runs the job N times, every method once per round,
the order reversed every other round, and adds each method's medians.

Held-out loss: `--heldout` samples of the same distribution (ids drawn with the
seed from all `--samples + --heldout`) are never trained; every `--eval-every`
optimizer steps (or `--eval-every-tokens` real tokens), at the start and at the
end, the weights are copied to host memory (the clock paused meanwhile); after
training every snapshot is evaluated, each rank its share, and the token-level
mean cross-entropy over the held-out tokens is all-reduced. Each method's
`curve` holds (seconds, tokens, steps, heldout_loss, train_loss) points:
`seconds` is the training clock since the first step, evaluation excluded;
`seconds`, `samples_per_s` and `real_tokens_per_s` of the summary use the same
clock, `wall_seconds` includes evaluation (`eval_seconds`).
bench/loss_at_time.py runs this over an LR grid (time to a target held-out loss).

Preemption and resume (docs/resume.md): `--checkpoint-every K --kill-at-step S`
checkpoints model, optimizer and loader state every K steps and SIGKILLs every
trainer and daemon after step S; `--resume PATH` restarts the odb run from the
checkpoint with new daemons and trains only the samples not trained before.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "client/python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import peers  # noqa: E402
import tiny_lm  # noqa: E402

# Every method --methods knows, in the table's order: Standard, the peers (examples/peers.py), odb padded
# (the default `collate`) and odb packed (`collate.packed: true`, `grouping.cost_model: packed`).
METHODS = ("standard", "length_grouped", "packed", "bucketing", "kk_balanced", "odb", "odb_packed", "replay")
LABELS = {"standard": "Standard", "length_grouped": "length_grouped", "packed": "packed", "bucketing": "bucketing",
          "kk_balanced": "kk_balanced", "odb": "odb", "odb_packed": "odb packed", "replay": "replay"}
ODB_MODES = ("odb", "odb_packed")


def log(rank: int, quiet: bool, text: str, end: str = "\n") -> None:
    if rank == 0 and not quiet:
        print(text, end=end, file=sys.stderr, flush=True)


def progress_line(name: str, epoch: int, optimizer_steps: int, micro_steps: int, idle_steps: int,
                  step_idle: bool, ce_sum_value: float, step_tokens: int, tokens_per_s: float) -> str:
    """The progress line after a micro-step: optimizer steps and micro-steps counted apart, and the
    micro-step's own training loss (its mean cross-entropy per real token on this rank). An IDLE
    micro-step trains no sample: it has no loss to show, and says so instead of printing 0."""
    what = ("IDLE (no samples)" if step_idle or not step_tokens
            else f"train CE {ce_sum_value / step_tokens:7.4f}")
    return (f"\r[{name}] rank0 epoch {epoch} opt step {optimizer_steps:4d}  micro-step {micro_steps:5d} "
            f"({idle_steps} idle)  {what:17s}  {tokens_per_s:8.0f} real tok/s (rank 0)")


class BusyClock:
    """This rank's busy time: forward, backward and optimizer step, without the waits for the other
    ranks (DDP's gradient all-reduce) or for data. A DDP communication hook records when the last
    gradient bucket of a synchronised backward is ready (the local backward's end); the all-reduce
    after it, which waits for the slowest rank, is left out. CPU only (a GPU's queued work would need
    events)."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.ready = None

    def hook(self, process_group, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.ready = time.perf_counter()
        return default_hooks.allreduce_hook(process_group, bucket)


def sync(device: torch.device) -> None:
    """Waits for the GPU's queued work, so that wall-clock readings mean what they say."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(batch: dict, device: torch.device) -> dict:
    """A batch on the training device: pinned host memory and a non-blocking copy on a GPU
    (the copy overlaps with the work already queued), as a GPU job would do it."""
    if device.type != "cuda":
        return batch
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def ce_sum(logits, labels):
    """Cross-entropy summed over the real tokens (labels -100, the padding, are skipped)."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                             ignore_index=-100, reduction="sum")


class ShardSampler:
    """This rank's share of `ids`, reshuffled each epoch with seed + epoch (as
    DistributedSampler, over a subset of the dataset's indices). pad: repeat the
    first ids so every rank gets as many (a fixed-batch DataLoader needs it to
    run the same number of steps on every rank; odb aligns the steps itself)."""

    def __init__(self, ids, rank: int, world: int, seed: int, pad: bool) -> None:
        self.ids, self.rank, self.world, self.seed, self.pad = list(ids), rank, world, seed, pad
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _mine(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = [self.ids[i] for i in torch.randperm(len(self.ids), generator=g).tolist()]
        if self.pad and len(order) % self.world:
            order += order[:self.world - len(order) % self.world]
        return order[self.rank::self.world]

    def __iter__(self):
        return iter(self._mine())

    def __len__(self) -> int:
        return len(self._mine())


class WithIds(torch.utils.data.Dataset):
    """Standard's view of the corpus: (id, sample), so that the trained ids can be checked."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        return i, self.dataset[i]


def collate_with_ids(items):
    return [i for i, _ in items], tiny_lm.pad_collate([s for _, s in items])


def packed_collate_with_ids(items):
    return [i for i, _ in items], tiny_lm.packed_collate([s for _, s in items])


def split_ids(samples: int, heldout: int, seed: int):
    """(train ids, held-out ids) of a corpus of samples + heldout: the held-out ids
    are drawn with the seed (a stream of their own), the rest are trained."""
    import numpy as np

    total = samples + heldout
    held = sorted(np.random.default_rng([seed, 0x4E1D]).choice(total, size=heldout, replace=False).tolist())
    gone = set(held)
    return [i for i in range(total) if i not in gone], held


class HeldOut:
    """This rank's share of the held-out samples, collated once into padded batches of
    about `budget` padded tokens (sorted by length), kept on the device."""

    def __init__(self, dataset, ids, rank: int, world: int, budget: int, device) -> None:
        mine = sorted(ids[rank::world], key=lambda i: dataset.lengths[i])
        self.batches, group = [], []
        for i in mine:
            if group and (len(group) + 1) * dataset.lengths[i] > budget:
                self.batches.append(tiny_lm.pad_collate([dataset[j] for j in group]))
                group = []
            group.append(i)
        if group:
            self.batches.append(tiny_lm.pad_collate([dataset[j] for j in group]))
        self.batches = [{k: v.to(device) for k, v in b.items()} for b in self.batches]

    @torch.no_grad()
    def sums(self, model, device) -> tuple:
        """(cross-entropy summed over this rank's held-out tokens, their number): local, no collective."""
        was_training = model.training
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=device)
        tokens = 0
        for b in self.batches:
            total += ce_sum(model(b["input_ids"], b["attention_mask"]), b["labels"]).double()
            tokens += int((b["labels"] != -100).sum())
        model.train(was_training)
        return float(total), tokens


def train_run(name, rank, world, model, ddp, opt, sched, epoch_steps, epochs, args, heldout,
              device=torch.device("cpu"), clock=None) -> dict:
    """Trains epochs (a list of epoch numbers; epoch_steps(e) iterates epoch e's steps).
    Returns global counters (all ranks summed), the training clock, the wall time and the
    held-out loss curve.

    Evaluation is deferred: at each point the clock is paused while the model's weights are
    copied to host memory (a snapshot), and every snapshot is evaluated after training. The
    training clock therefore excludes evaluation entirely, and the data pipeline (odbd and
    its workers, or the DataLoader's) never gets untimed evaluation pauses to work ahead in.

    Ranks may run different numbers of micro-steps (a peer that packs each rank's share on its own);
    every rank runs the same optimizer steps, and evaluation points fall only after an optimizer
    step (the same one on every rank). `clock` (a BusyClock hooked into `ddp`) measures this rank's
    busy time."""
    dist.barrier()
    sync(device)
    start = time.perf_counter()
    resumed, train_s, pause_s = start, 0.0, 0.0
    real = padded = samples = steps = idle = global_tokens = evals_by_tokens = optimizer_steps = 0
    busy = 0.0
    # The same intervals in this thread's CPU time: on a shared machine, other jobs' load inflates the
    # wall-clock figures but not these (the CPU autograd engine runs the backward on this thread).
    busy_cpu = 0.0
    since_ce = torch.zeros((), dtype=torch.float64, device=device)  # training CE since the last point
    since_tokens = 0
    points, snapshots, trained_ids = [], [], []
    # --record-steps: [epoch, ids, real tokens, closes, idle, busy thread CPU s] per micro-step of this rank
    step_log = []

    def point() -> None:
        """Pauses the clock, snapshots the weights and this rank's counters, resumes."""
        nonlocal resumed, train_s, pause_s, since_ce, since_tokens
        sync(device)
        dist.barrier()
        paused = time.perf_counter()
        train_s += paused - resumed
        snapshots.append({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        points.append((train_s, steps, real, samples, float(since_ce), since_tokens, optimizer_steps))
        since_ce, since_tokens = torch.zeros((), dtype=torch.float64, device=device), 0
        resumed = time.perf_counter()
        pause_s += resumed - paused

    point()
    for epoch in epochs:
        for step in epoch_steps(epoch):
            b = to_device(step["batch"], device)
            # With --global-batch, micro-steps accumulate (no all-reduce) until the one that closes the
            # optimizer batch; without, every step closes its own. DDP decides in the forward pass whether
            # the backward all-reduces (no_sync must hold the forward too: around the backward alone,
            # every micro-step would all-reduce, and ranks with different micro-step counts would hang).
            with step.get("sync", contextlib.nullcontext)():
                t0, c0 = time.perf_counter(), time.thread_time()
                logits = ddp(*tiny_lm.model_inputs(b))
                ce = ce_sum(logits, b["labels"])  # summed over this rank's real tokens
                loss = step["loss_fn"](ce)  # token-level weighting: the mean over all ranks' real tokens
                t1 = time.perf_counter()
                if clock is not None:
                    clock.ready = None
                loss.backward()
            t2 = time.perf_counter()
            step_cpu = time.thread_time() - c0
            busy_cpu += step_cpu
            busy += (t1 - t0) + (((clock.ready if clock is not None else None) or t2) - t1)
            closes = step.get("closes", True)
            if closes:
                t3, c3 = time.perf_counter(), time.thread_time()
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                optimizer_steps += 1
                busy += time.perf_counter() - t3
                step_cpu += time.thread_time() - c3
                busy_cpu += time.thread_time() - c3
            steps += 1
            idle += step["idle"]
            real += step["real"]
            padded += step["padded"]
            samples += step["samples"]
            if step["real"]:
                since_ce += ce.detach().double()
                since_tokens += step["real"]
            if args.record_ids:
                trained_ids.extend(step["ids"])
            if args.record_steps:
                step_log.append([epoch, [int(i) for i in step["ids"]], int(step["real"]), bool(closes),
                                 bool(step["idle"]), round(step_cpu, 6)])
            if steps % 5 == 0 and rank == 0 and not args.quiet:
                elapsed = train_s + time.perf_counter() - resumed
                log(rank, args.quiet, progress_line(name, epoch, optimizer_steps, steps, idle, step["idle"],
                                                    float(ce), step["real"], real / max(elapsed, 1e-9)), end="")
            # the same on every rank at an optimizer step: safe to decide a collective on
            global_tokens += step["global_real"]
            if closes and ((args.eval_every and optimizer_steps % args.eval_every == 0) or
                           (args.eval_every_tokens and global_tokens // args.eval_every_tokens > evals_by_tokens)):
                evals_by_tokens = global_tokens // args.eval_every_tokens if args.eval_every_tokens else 0
                point()
    if points[-1][1] != steps:
        point()  # the final point; the clock stops at the end of training
        seconds = train_s
    else:
        sync(device)
        dist.barrier()
        seconds = train_s + time.perf_counter() - resumed
    log(rank, args.quiet, "")
    totals = torch.tensor([real, padded, samples, steps, idle], dtype=torch.float64)
    dist.all_reduce(totals)
    # max and -min of the micro-steps and optimizer steps, and every rank's busy time
    extremes = torch.tensor([steps, -steps, optimizer_steps, -optimizer_steps], dtype=torch.float64)
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    busy_all, busy_cpu_all = [0.0] * world, [0.0] * world
    dist.all_gather_object(busy_all, busy)
    dist.all_gather_object(busy_cpu_all, busy_cpu)
    g_real, g_padded, g_samples, _, g_idle = totals.tolist()
    max_steps, min_steps = int(extremes[0]), -int(extremes[1])
    if int(g_real) != global_tokens or int(extremes[2]) != optimizer_steps or -int(extremes[3]) != optimizer_steps:
        raise RuntimeError(f"[{name}] rank {rank}: {optimizer_steps} optimizer steps and {global_tokens} step "
                           f"tokens, but all ranks trained {int(g_real)} tokens in {-int(extremes[3])} to "
                           f"{int(extremes[2])} optimizer steps")

    # The held-out loss of every snapshot: each rank its share, one all-reduce for all points.
    eval_start = time.perf_counter()
    rows = []
    for snapshot, (_, _, p_real, p_samples, t_ce, t_tok, _) in zip(snapshots, points):
        model.load_state_dict(snapshot)  # the last snapshot is the final model: it stays loaded
        ce, tokens = heldout.sums(model, device) if heldout is not None else (0.0, 0)
        rows.append([ce, tokens, t_ce, t_tok, p_real, p_samples])
    sums = torch.tensor(rows, dtype=torch.float64)
    dist.all_reduce(sums)
    sync(device)
    eval_s = pause_s + time.perf_counter() - eval_start
    per_epoch = g_samples / max(len(epochs), 1)
    curve = []
    for (p_seconds, p_steps, *_, p_opt), (h_ce, h_tok, t_ce, t_tok, p_real, p_samples) in zip(points, sums.tolist()):
        curve.append({"seconds": p_seconds, "tokens": int(p_real), "samples": int(p_samples), "steps": p_steps,
                      "optimizer_steps": p_opt,
                      # epochs trained at this point, by samples
                      "epoch": (epochs[0] if epochs else 0) + (p_samples / per_epoch if per_epoch else 0.0),
                      "heldout_loss": h_ce / h_tok if h_tok else None,
                      "train_loss": t_ce / t_tok if t_tok else None})  # mean since the previous point
    wall = time.perf_counter() - start
    result = {"seconds": seconds, "real_tokens": int(g_real), "padded_tokens": int(g_padded),
              "samples": int(g_samples), "steps": max_steps, "min_steps": min_steps, "idle_steps": int(g_idle),
              "optimizer_steps": optimizer_steps, "loss_tokens_per_optimizer_step": g_real / max(optimizer_steps, 1),
              # busy time per rank (forward, backward, optimizer step; waits excluded), CPU only
              "busy_seconds": busy_all if device.type == "cpu" else None,
              "busy_max_over_mean": (max(busy_all) / (sum(busy_all) / world)
                                     if device.type == "cpu" and sum(busy_all) > 0 else None),
              # the same in thread CPU time (load-robust; waits for the other rank spend none)
              "busy_cpu_seconds": busy_cpu_all if device.type == "cpu" else None,
              "samples_per_s": g_samples / seconds, "real_tokens_per_s": g_real / seconds,
              "padding_fraction": 1.0 - g_real / max(g_padded, 1), "epochs": len(epochs),
              "eval_seconds": eval_s, "wall_seconds": wall, "lr": args.lr, "warmup_steps": args.warmup_steps,
              "final_heldout_loss": curve[-1]["heldout_loss"], "curve": curve}
    if args.record_ids:
        gathered = [None] * world
        dist.all_gather_object(gathered, trained_ids)
        result["trained_ids"] = sorted(i for g in gathered for i in g)
    if args.record_steps:  # every rank's micro-steps; rank 0 writes them (rank_main), not into the summary
        gathered = [None] * world
        dist.all_gather_object(gathered, step_log)
        result["step_log"] = gathered
    return result


def peer_steps(method: str, rank: int, world: int, args, dataset, lengths, train_ids, window_tokens: int,
               progress, ddp):
    """epoch_steps for a peer method (examples/peers.py): the epoch's plan, this rank's micro-batches
    through a DataLoader (the same workers as Standard's), one all-rank loss-token count per optimizer
    step known from the plan (no collective), DDP no_sync on all but the step's last micro-batch. A
    rank without a micro-batch where the plan has none for it runs an IDLE micro-step (one short
    sample, loss x 0) so that its gradient all-reduce still meets the others'."""
    batch = max(1, args.max_tokens // args.max_len)  # Standard's micro-batch (fits the longest sample)
    accumulate = max(1, round(args.global_batch / (batch * world))) if args.global_batch else 1
    packed = method in peers.PACKED_METHODS
    filler = min(train_ids, key=lambda i: lengths[i])  # the IDLE micro-step's sample

    def padded_tokens(ids) -> int:
        return sum(lengths[i] for i in ids) if packed else len(ids) * max(lengths[i] for i in ids)

    def epoch_steps(epoch):
        plan = peers.plan_epoch(method, train_ids, lengths, world, batch=batch, accumulate=accumulate,
                                budget=args.max_tokens, window_tokens=window_tokens, linear=6.0 * args.d_model,
                                buckets=args.buckets, seed=args.seed, epoch=epoch)
        mine = [mb or [filler] for step in plan for mb in (step[rank] or [[]])]
        loader = torch.utils.data.DataLoader(WithIds(dataset), batch_sampler=mine, num_workers=args.workers,
                                             pin_memory=args.device == "cuda",
                                             collate_fn=packed_collate_with_ids if packed else collate_with_ids)
        it = iter(loader)
        for step in plan:
            total = sum(lengths[i] for part in step for mb in part for i in mb)
            parts = step[rank] or [[]]
            for k, mb in enumerate(parts):
                ids, b = next(it)
                last = k + 1 == len(parts)
                if last:
                    progress.job_loss_tokens += total
                real = sum(lengths[i] for i in mb)
                yield {"batch": b, "idle": not mb, "real": real, "global_real": total if last else 0,
                       "padded": padded_tokens(mb) if mb else 0, "samples": len(mb), "ids": list(mb),
                       "loss_fn": (lambda ce, total=total: ce * (world / total)) if mb else (lambda ce: ce * 0.0),
                       "closes": last, "sync": contextlib.nullcontext if last else ddp.no_sync}

    return epoch_steps


def replay_steps(rank: int, world: int, args, dataset, lengths, progress, ddp):
    """epoch_steps for --replay PLAN (a diagnostic, bench/window_mix.py writes the plans): PLAN's
    optimizer steps ({"epochs": [[[ids of step k] ...] per epoch]}) trained as given, padded. A step's
    samples are dealt over the ranks longest first, round robin, and each rank's share is cut into
    micro-batches of at most --max-tokens padded tokens; the loss is the mean over the step's loss
    tokens on all ranks (Standard's and odb's objective), so only the steps' membership and order
    matter, not how they are cut into micro-batches. A rank without samples in a step runs an IDLE
    micro-step (the shortest sample, loss x 0), as peer_steps does."""
    plan = json.loads(Path(args.replay).read_text())["epochs"]
    filler = min(range(len(lengths)), key=lambda i: lengths[i])

    def micro_batches(ids):
        out, mb = [], []
        for i in sorted(ids, key=lambda i: -lengths[i]):  # longest first: the first sets the padded width
            if mb and (len(mb) + 1) * lengths[mb[0]] > args.max_tokens:
                out.append(mb)
                mb = []
            mb.append(i)
        return out + ([mb] if mb else [])

    def epoch_steps(epoch):
        for window in plan[epoch % len(plan)]:
            ordered = sorted(window, key=lambda i: -lengths[i])
            parts = micro_batches(ordered[rank::world]) or [[]]
            total = sum(lengths[i] for i in window)
            progress.job_loss_tokens += total
            for k, mb in enumerate(parts):
                last = k + 1 == len(parts)
                b = tiny_lm.pad_collate([dataset[i] for i in (mb or [filler])])
                real = sum(lengths[i] for i in mb)
                yield {"batch": b, "idle": not mb, "real": real, "global_real": total if last else 0,
                       "padded": b["input_ids"].numel() if mb else 0, "samples": len(mb), "ids": list(mb),
                       "loss_fn": (lambda ce, total=total: ce * (world / total)) if mb else (lambda ce: ce * 0.0),
                       "closes": last, "sync": contextlib.nullcontext if last else ddp.no_sync}

    return epoch_steps


def rank_main(rank: int, world: int, args, run_dir: str, job_id: str, out_path: str, parent: int) -> None:
    tiny_lm.die_with_parent(parent)
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), ODB_RUN_DIR=run_dir)
    device = torch.device("cpu")
    if args.device == "cuda":
        # Ranks share the GPUs round-robin (gloo also works with 2 ranks on one GPU).
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-init", rank=rank, world_size=world)
    import odb

    lengths = tiny_lm.long_tail_lengths(args.samples + args.heldout, seed=args.seed, max_len=args.max_len)
    dataset = tiny_lm.SyntheticCorpus(lengths, vocab=args.vocab)
    train_ids, heldout_ids = split_ids(args.samples, args.heldout, args.seed)
    # The same recipe for both (--global-batch G): Standard accumulates G samples per optimizer step,
    # odb windows of the same expected loss tokens (G x the mean training sample's tokens).
    window_tokens = (round(args.global_batch * sum(lengths[i] for i in train_ids) / len(train_ids))
                     if args.global_batch else 0)
    job_tokens = sum(lengths[i] for i in train_ids) * args.epochs  # every token is a loss token here
    daemons = []

    def start_daemon(mode: str):
        """One odbd per rank for an odb mode, in a run directory of its own (its sockets): padded (the
        default collate) or packed (`collate.packed`, budgets on real tokens: `grouping.cost_model`)."""
        packed = mode == "odb_packed"
        where = os.path.join(run_dir, "packed") if packed else run_dir
        config = tiny_lm.daemon_config(args.max_tokens, seed=args.seed,
                                       alignment={"planner": args.planner, "deterministic": args.deterministic},
                                       optimizer={"tokens_per_step": window_tokens,
                                                  **({} if args.window_spread is None
                                                     else {"window_spread": args.window_spread})},
                                       **({"collate": {"packed": True}} if packed else {}))
        if packed:
            config["grouping"]["cost_model"] = "packed"
        if args.mix_lengths != "auto":
            config["grouping"]["mix_lengths"] = {"true": True, "false": False}.get(args.mix_lengths, args.mix_lengths)
        d = odb.spawn_daemon(rank, world, where, job_id=f"{job_id}-{mode}", wait=False, log_level="warn",
                             config=config)
        daemons.append(d)
        d.wait_ready(60)
        return d, where

    heldout = (HeldOut(dataset, heldout_ids, rank, world, budget=4 * args.max_tokens, device=device)
               if heldout_ids else None)
    results = {"heldout_ids": heldout_ids}
    step_logs = {}  # --record-steps: {method: every rank's micro-steps}
    try:
        for run in (("odb",) if args.resume else args.methods):
            torch.manual_seed(args.seed)
            model = tiny_lm.TinyCausalLM(vocab=args.vocab, d_model=args.d_model, layers=args.layers, heads=4,
                                         max_len=args.max_len + 1).to(device)
            ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
            clock = None
            if device.type == "cpu":
                clock = BusyClock()
                ddp.register_comm_hook(dist.group.WORLD, clock.hook)
            opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
            warmup = max(1, args.warmup_steps)
            checkpoint = torch.load(args.resume) if (args.resume and run == "odb") else None
            if checkpoint is not None:
                model.load_state_dict(checkpoint["model"])  # (saved from the same device kind)
                opt.load_state_dict(checkpoint["opt"])

            def make_sched(progress):
                """The same schedule for both methods. "warmup": linear over --warmup-steps optimizer steps,
                then constant. "cosine": by loss tokens trained (odb.lr_by_tokens for both: `progress` is the
                odb loader, or Standard's own counter of the same figure), a warmup of --warmup-steps
                optimizer batches of tokens, then a cosine to 0.1 x at the end of the job's tokens."""
                if args.schedule == "cosine":
                    unit = window_tokens or args.max_tokens * world
                    fn = odb.lr_by_tokens(progress, job_tokens, warmup_tokens=min(job_tokens, warmup * unit),
                                          decay="cosine", final_ratio=0.1)
                else:
                    def fn(k):
                        return min(1.0, (k + 1) / warmup)
                sched = torch.optim.lr_scheduler.LambdaLR(opt, fn)
                if checkpoint is not None and "sched" in checkpoint:
                    sched.load_state_dict(checkpoint["sched"])
                return sched
            epochs = list(range(args.epochs))
            if run == "standard":
                batch = max(1, args.max_tokens // args.max_len)
                sampler = ShardSampler(train_ids, rank, world, args.seed, pad=True)
                loader = torch.utils.data.DataLoader(WithIds(dataset), batch_size=batch, sampler=sampler,
                                                     pin_memory=device.type == "cuda",
                                                     num_workers=args.workers, collate_fn=collate_with_ids)

                # Micro-batches per optimizer step and rank: G samples over W ranks of `batch` each.
                accumulate = max(1, round(args.global_batch / (batch * world))) if args.global_batch else 0
                progress = types.SimpleNamespace(job_loss_tokens=0)  # loss tokens of the optimizer steps so far
                sched = make_sched(progress)

                def accumulated(epoch):
                    """Standard with gradient accumulation: groups of `accumulate` micro-batches, the loss
                    the mean over every real token of the group on every rank (one all-reduce per group);
                    DDP all-reduces only on the group's last micro-batch."""
                    sampler.set_epoch(epoch)
                    group = []
                    it = iter(loader)
                    while True:
                        group = [x for _, x in zip(range(accumulate), it)]
                        if not group:
                            return
                        # every rank has as many micro-batches (the sampler pads): one all-reduce of
                        # each micro-batch's real tokens
                        tokens = torch.tensor([float(b["attention_mask"].sum()) for _, b in group],
                                              dtype=torch.float64)
                        dist.all_reduce(tokens)
                        total = float(tokens.sum())
                        for k, (ids, b) in enumerate(group):
                            real = int(b["attention_mask"].sum())
                            last = k + 1 == len(group)
                            if last:  # counted when the closing micro-step is handed out, as odb's loader does
                                progress.job_loss_tokens += int(total)
                            yield {"batch": b, "idle": False, "real": real, "global_real": int(tokens[k].item()),
                                   "padded": b["input_ids"].numel(), "samples": b["input_ids"].shape[0], "ids": ids,
                                   "loss_fn": lambda ce, total=total: ce * (world / total),
                                   "closes": last, "sync": contextlib.nullcontext if last else ddp.no_sync}

                def epoch_steps(epoch):
                    if accumulate:
                        yield from accumulated(epoch)
                        return
                    sampler.set_epoch(epoch)
                    for ids, b in loader:
                        real = int(b["attention_mask"].sum())
                        # Token-level weights, as odb's: this rank's summed loss over all ranks' real
                        # tokens, times W (DDP averages the W gradients), so every step minimises the
                        # mean cross-entropy over the step's real tokens.
                        tokens = torch.tensor([real], dtype=torch.float64)
                        dist.all_reduce(tokens)
                        progress.job_loss_tokens += int(tokens.item())
                        yield {"batch": b, "idle": False, "real": real, "global_real": int(tokens.item()),
                               "padded": b["input_ids"].numel(),
                               "samples": b["input_ids"].shape[0], "ids": ids,
                               "loss_fn": lambda ce, total=float(tokens): ce * (world / total)}
            elif run == "replay":
                progress = types.SimpleNamespace(job_loss_tokens=0)
                sched = make_sched(progress)
                epoch_steps = replay_steps(rank, world, args, dataset, lengths, progress, ddp)
            elif run in peers.PADDED_METHODS + peers.PACKED_METHODS:
                progress = types.SimpleNamespace(job_loss_tokens=0)
                sched = make_sched(progress)
                epoch_steps = peer_steps(run, rank, world, args, dataset, lengths, train_ids, window_tokens,
                                         progress, ddp)
            else:
                d, where = start_daemon(run)
                oloader = odb.OdbDataLoader(dataset, sampler=ShardSampler(train_ids, rank, world, args.seed,
                                                                          pad=False),
                                            num_workers=args.workers, idle_policy="zero_step", timeout_s=120,
                                            run_dir=where, packed=run == "odb_packed")
                start_step = 0
                if checkpoint is not None:
                    oloader.load_state_dict(checkpoint["loader"])  # skips what was trained before (and counts it)
                sched = make_sched(oloader)
                if checkpoint is not None:
                    start_step = checkpoint["step"]
                    epochs = list(range(oloader.epoch, args.epochs))
                    log(rank, args.quiet, f"[odb] resumed from {args.resume} at step {start_step}")
                done = start_step

                def epoch_steps(epoch):
                    nonlocal done
                    oloader.set_epoch(epoch)
                    for s in oloader:
                        yield {"batch": s.batch, "idle": s.idle, "real": s.real_tokens,
                               "global_real": s.global_real_tokens,
                               "padded": s.padded_tokens, "samples": len(s.sample_ids), "ids": s.sample_ids,
                               # w_r * (summed loss) / t_r: the mean over all ranks' loss tokens of the step,
                               # or of its accumulation window (odb.loss)
                               "loss_fn": lambda ce, s=s: odb.window_loss(ce, s),
                               "closes": s.closes_window,
                               "sync": lambda s=s: odb.window_sync(ddp, s)}
                        done += 1  # the step above is trained once the loop asks for the next one
                        if args.checkpoint_every and done % args.checkpoint_every == 0:
                            state = oloader.state_dict()  # collective: every rank, same step
                            if rank == 0:
                                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                            "sched": sched.state_dict(), "loader": state, "step": done},
                                           args.checkpoint + ".tmp")
                                os.replace(args.checkpoint + ".tmp", args.checkpoint)
                            dist.barrier()
                        if args.kill_at_step and done == args.kill_at_step:
                            log(rank, args.quiet, f"\n[odb] simulated preemption at step {done}: SIGKILL to "
                                                  f"trainers and daemons; resume with --resume {args.checkpoint}")
                            d.proc.kill()
                            os.kill(os.getpid(), signal.SIGKILL)
            results[run] = train_run(run, rank, world, model, ddp, opt, sched, epoch_steps, epochs, args,
                                     heldout, device, clock)
            results[run]["trainer_pid"] = os.getpid()  # rank 0's process (one per method unless --shared-processes)
            if args.record_steps:
                step_logs[run] = results[run].pop("step_log")
            if run in ODB_MODES:
                dist.barrier()
                daemons.pop().stop()
        if rank == 0:
            Path(out_path).write_text(json.dumps(results))
            if args.record_steps:
                Path(args.record_steps).write_text(json.dumps(
                    {"lengths": lengths, "train_ids": train_ids, "world": world, "max_tokens": args.max_tokens,
                     "global_batch": args.global_batch, "window_tokens": window_tokens, "seed": args.seed,
                     "methods": step_logs}))
    finally:
        dist.barrier()
        for d in daemons:
            d.stop()
        dist.destroy_process_group()
    tiny_lm.exit_rank()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=3000, help="training samples per epoch (both ranks together)")
    p.add_argument("--max-len", type=int, default=256, help="longest sample (tokens)")
    p.add_argument("--max-tokens", type=int, default=512, help="token budget per step and rank")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--planner", choices=("local", "global"), default="global",
                   help="odbd alignment.planner: global balances work across ranks (moves samples)")
    p.add_argument("--seed", type=int, default=0, help="the first seed (data draw, split, order, initialisation)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run the job for N seeds (--seed, --seed+1, ...): the summary gives each method's held-out "
                        "loss and training clock as mean +- half the range over the seeds")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: model on the GPU(s), batches copied from pinned memory with non_blocking, "
                        "timings synchronised (bench/gpu_run.sh)")
    p.add_argument("--window-spread", type=float, default=None,
                   help="odbd optimizer.window_spread for the odb modes (default: the daemon's, 1): how far, in "
                        "standard deviations of a random batch's loss tokens, a window may end from its target to run "
                        "fewer micro-steps; 0 = the nearest ends")
    p.add_argument("--mix-lengths", nargs="?", const="true", default="auto", choices=("auto", "true", "steps", "false"),
                   help="odbd grouping.mix_lengths for the odb modes: each step's samples drawn across lengths "
                        "(docs/config.md), so optimizer steps mix lengths as Standard's random batches do; "
                        "default auto (the daemon's); steps: length-sorted groups dealt into steps across lengths; "
                        "bare --mix-lengths = true")
    p.add_argument("--deterministic", action="store_true",
                   help="odbd alignment.deterministic: the same steps on every run, whatever the workers' timing")
    p.add_argument("--epochs", type=int, default=1, help="epochs per method (the clock runs across them)")
    p.add_argument("--methods", default="standard,odb",
                   help="which methods to train, comma-separated, or all: " + ", ".join(METHODS) +
                        " (the peers: examples/peers.py; odb_packed: collate.packed, a model reading cu_seqlens); "
                        "one alone for a budget grid (bench/loss_at_time.py), where each method's budget differs")
    p.add_argument("--buckets", type=int, default=30,
                   help="bucketing: lhotse's num_buckets (equal-token length buckets)")
    p.add_argument("--shared-processes", action="store_true",
                   help="train every method in the same two rank processes, one after the other (the default "
                        "gives each method fresh rank processes: one method's leftovers do not slow the next)")
    p.add_argument("--reverse", action="store_true",
                   help="train the methods in the reverse of the table's order (interleaved rounds run as "
                        "separate jobs: bench/peers_rounds.py)")
    p.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="run the job N times with the same seed, every method once per round, the order reversed "
                        "every other round (interleaved paired runs): the summary adds each method's median "
                        "real tokens/s and training clock over the rounds")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (both methods)")
    p.add_argument("--global-batch", type=int, default=0, metavar="G",
                   help="the same recipe for both methods: Standard accumulates micro-batches to G samples per "
                        "optimizer step, odb runs accumulation windows of G x the mean sample's tokens "
                        "(optimizer.tokens_per_step); 0: one optimizer step per step (the budget sets the batch)")
    p.add_argument("--warmup-steps", type=int, default=10,
                   help="linear LR warmup over this many optimizer steps, then constant")
    p.add_argument("--schedule", choices=("warmup", "cosine"), default="warmup",
                   help="the LR schedule of both methods: warmup (then constant, by optimizer steps) or cosine "
                        "(by loss tokens trained, odb.lr_by_tokens: a warmup of --warmup-steps optimizer batches, "
                        "then a cosine to 0.1 x the LR at the end of the job)")
    p.add_argument("--heldout", type=int, default=200,
                   help="held-out samples (same distribution, never trained), on top of --samples")
    p.add_argument("--eval-every", type=int, default=50, metavar="N",
                   help="held-out loss every N optimizer steps (0: only at the start and the end); "
                        "evaluation time is excluded from the training clock")
    p.add_argument("--eval-every-tokens", type=int, default=0, metavar="T",
                   help="also each time the real tokens trained (all ranks) pass a multiple of T: the same "
                        "spacing in tokens for both methods (bench/loss_at_time.py)")
    p.add_argument("--record-ids", action="store_true",
                   help="--json: list every trained sample id per method (trained_ids) next to heldout_ids")
    p.add_argument("--record-steps", default="", metavar="PATH",
                   help="diagnostic: write every method's micro-steps (per rank: epoch, sample ids, real tokens, "
                        "closes the optimizer step, IDLE, the thread CPU seconds of its forward + backward and "
                        "optimizer step) and the corpus lengths to PATH as JSON (bench/window_mix.py reads it)")
    p.add_argument("--replay", default="", metavar="PLAN",
                   help="diagnostic: method `replay` trains the optimizer steps of PLAN (JSON {\"epochs\": "
                        "[[[ids] per step] per epoch]}, bench/window_mix.py --write-plan) in their order")
    p.add_argument("--json", action="store_true", help="print one JSON object with the figures")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                   help="odb run: save model, optimizer and loader state every K steps (docs/resume.md)")
    p.add_argument("--checkpoint", default="/tmp/odb-demo-checkpoint.pt", help="where --checkpoint-every saves")
    p.add_argument("--kill-at-step", type=int, default=0, metavar="S",
                   help="odb run: SIGKILL every trainer and daemon after step S (a preemption)")
    p.add_argument("--resume", default="", metavar="PATH",
                   help="resume the odb run from this checkpoint (new daemons; only the untrained samples)")
    args = p.parse_args()
    args.methods = tuple(m for m in METHODS if m != "replay") if args.methods.strip() == "all" else tuple(
        m.strip() for m in args.methods.split(",") if m.strip())
    if not args.methods or any(m not in METHODS for m in args.methods) or len(set(args.methods)) != len(
            args.methods):
        p.error(f"--methods: all, or a comma-separated subset of {','.join(METHODS)}, got {args.methods!r}")
    args.methods = tuple(m for m in METHODS if m in args.methods)  # the table's order
    if ("replay" in args.methods) != bool(args.replay):
        p.error("--methods replay and --replay PLAN go together")
    if args.rounds < 1 or (args.rounds > 1 and args.seeds > 1):
        p.error("--rounds: at least 1, and not with --seeds > 1")
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.seeds > 1 and (args.resume or args.kill_at_step or args.checkpoint_every):
        p.error("--seeds > 1 does not combine with --resume / --kill-at-step / --checkpoint-every (one job each)")
    first_seed = args.seed
    per_seed, rounds = [], []
    methods = args.methods
    for k in range(args.seeds):  # each seed: its own data draw, split, order and initialisation; fresh daemons
        args.seed = first_seed + k
        for n in range(args.rounds):  # the same job again, every method once, the order reversed every other round
            args.methods = methods if (n % 2 == 0) != args.reverse else methods[::-1]
            r = run_job(args)
            if r is None:
                return 0
            rounds.append(r)
            if args.rounds > 1:
                log(0, args.quiet, f"[demo] round {n + 1}/{args.rounds} done (order {', '.join(args.methods)})")
        per_seed.append((args.seed, rounds[-args.rounds]))
        if args.seeds > 1:
            log(0, args.quiet, f"[demo] seed {args.seed} done ({k + 1}/{args.seeds})")
    args.seed, args.methods = first_seed, methods
    if args.rounds > 1:
        args.rounds_results = rounds
    r = per_seed[0][1]
    if args.resume:
        o = r["odb"]
        state = torch.load(args.resume)["loader"]
        # what the checkpoint's epoch had consumed: one packed set, or one per rank's list (a custom
        # sampler's "rank_position" key, docs/resume.md)
        packed = state["consumed"] if isinstance(state["consumed"], list) else [state["consumed"]]
        consumed = sum(c["cursor"] + len(c["extra"]) for c in packed)
        # samples of the epochs before the checkpoint's, plus what its epoch had consumed
        before = (state["epoch"] + (1 if state["epoch_complete"] else 0)) * args.samples + (
            0 if state["epoch_complete"] else consumed)
        print(f"\n== odb resumed from {args.resume}: {before} samples trained before the checkpoint + "
              f"{o['samples']} after the resume = {before + o['samples']} of {args.samples * args.epochs} "
              f"(in {o['steps']} steps, {o['idle_steps']} idle, {o['real_tokens_per_s']:.0f} real tok/s)")
        if args.json:
            print(json.dumps({"resumed": o}, indent=1))
        return 0
    return report(args, per_seed)


def run_job(args):
    """One seed's job (every method, 2 ranks, fresh daemons): the rank-0 result dict, or None when the job
    was killed on purpose (--kill-at-step: the resume command is printed). Each method trains in rank
    processes of its own (fresh trainers, in the order of args.methods), unless --shared-processes:
    methods run one after the other in the same processes measured each other's leftovers (odb packed's
    busiest rank computed 29.1 s where `packed` computed 22.6 s for the same tokens in rounds with every
    method in the same processes, 23.4 against 24.8 s with a process per method; docs/benchmarks.md, "The
    peers at the same recipe")."""
    if len(args.methods) > 1 and not args.shared_processes and not (args.resume or args.kill_at_step):
        merged, logs = {}, {}
        methods, record = args.methods, args.record_steps
        try:
            for m in methods:
                args.methods = (m,)
                if record:
                    args.record_steps = f"{record}.{m}.tmp"
                r = run_job(args)
                merged.update(r)
                if record:
                    part = json.loads(Path(args.record_steps).read_text())
                    logs.update(part.pop("methods"))
                    Path(args.record_steps).unlink()
        finally:
            args.methods, args.record_steps = methods, record
        if record:
            part["methods"] = logs
            Path(record).write_text(json.dumps(part))
        return merged
    run_dir = tempfile.mkdtemp(prefix="odbdemo-")
    out = os.path.join(run_dir, "result.json")
    job_id = f"demo-{uuid.uuid4().hex[:10]}"
    try:
        mp.spawn(rank_main, args=(args.world_size, args, run_dir, job_id, out, os.getpid()), nprocs=args.world_size,
                 join=True)
    except mp.ProcessExitedException:
        if not args.kill_at_step:
            raise
        keep, skip = [], False
        for a in sys.argv[1:]:  # the same job, minus the preemption
            if skip:
                skip = False
            elif a in ("--kill-at-step", "--checkpoint-every"):
                skip = True
            elif not a.startswith(("--kill-at-step=", "--checkpoint-every=")):
                keep.append(a)
        print(f"\n== the job was killed at step {args.kill_at_step} (simulated preemption). Resume with:\n"
              f"   /usr/bin/python3 examples/train_demo.py {' '.join(keep)} --resume {args.checkpoint}")
        return None
    return json.loads(Path(out).read_text())


def spread(values):
    """(mean, half the min-max range) of a list of numbers."""
    return sum(values) / len(values), (max(values) - min(values)) / 2


def median(values):
    xs = sorted(values)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def over_rounds(rounds, methods) -> dict:
    """Each method's median real tokens/s and training clock over interleaved rounds of the same job,
    every round's figures, and the held-out losses (the peers are deterministic; odb's steps depend on
    timing unless --deterministic)."""
    out = {}
    for m in methods:
        rates = [r[m]["real_tokens_per_s"] for r in rounds]
        clocks = [r[m]["seconds"] for r in rounds]
        held = [r[m]["final_heldout_loss"] for r in rounds]
        out[m] = {"real_tokens_per_s": rates, "seconds": clocks, "final_heldout_loss": held,
                  "median_real_tokens_per_s": median(rates), "median_seconds": median(clocks),
                  "median_final_heldout_loss": median(held),
                  "rate_spread": (max(rates) - min(rates)) / 2}
    return out


def report(args, per_seed) -> int:
    """Prints the table (or --json) of the first seed and, over all seeds, the held-out loss and clock;
    with --rounds, every method's medians over the rounds and odb's best mode against the best peer."""
    r = per_seed[0][1]
    s, o = r.get("standard"), r.get("odb")
    summary = {
        "world_size": args.world_size, "samples": args.samples, "max_len": args.max_len, "device": args.device,
        "max_tokens": args.max_tokens, "planner": args.planner, "deterministic": args.deterministic,
        "mix_lengths": args.mix_lengths,
        "window_spread": args.window_spread,
        "global_batch": args.global_batch, "schedule": args.schedule, "seeds": [seed for seed, _ in per_seed],
        "epochs": args.epochs, "lr": args.lr, "warmup_steps": args.warmup_steps, "heldout": args.heldout,
        "eval_every": args.eval_every, "eval_every_tokens": args.eval_every_tokens, "d_model": args.d_model,
        "layers": args.layers, "vocab": args.vocab, "buckets": args.buckets, "rounds": args.rounds,
        "methods": list(args.methods),
        **{m: r[m] for m in args.methods},
    }
    if s is not None and o is not None:
        summary["ratio_real_tokens_per_s"] = o["real_tokens_per_s"] / s["real_tokens_per_s"]
        summary["ratio_samples_per_s"] = o["samples_per_s"] / s["samples_per_s"]
    if args.record_ids:
        summary["heldout_ids"] = r["heldout_ids"]
    if len(per_seed) > 1:  # every seed's figures, and their mean and spread
        summary["per_seed"] = [{"seed": seed, **{m: {k: x[m][k] for k in (
            "final_heldout_loss", "seconds", "wall_seconds", "real_tokens_per_s", "optimizer_steps", "steps")}
            for m in args.methods}} for seed, x in per_seed]
        summary["over_seeds"] = {m: {key: dict(zip(("mean", "spread"), spread([x[m][key] for _, x in per_seed])))
                                     for key in ("final_heldout_loss", "seconds", "real_tokens_per_s")}
                                 for m in args.methods}
    rounds = getattr(args, "rounds_results", None)
    if rounds:
        summary["over_rounds"] = over_rounds(rounds, args.methods)
    rate_key = "median_real_tokens_per_s" if rounds else None
    rates = {m: (summary["over_rounds"][m][rate_key] if rounds else r[m]["real_tokens_per_s"]) for m in args.methods}
    odb_modes = [m for m in ODB_MODES if m in args.methods]
    others = [m for m in args.methods if m not in ODB_MODES]
    if odb_modes and others:
        best_odb = max(odb_modes, key=lambda m: rates[m])
        best_peer = max(others, key=lambda m: rates[m])
        summary["best_odb_mode"], summary["best_peer"] = best_odb, best_peer
        summary["ratio_best_odb_to_best_peer"] = rates[best_odb] / rates[best_peer]
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"\n== odb demo: {args.samples} long-tail samples (max {args.max_len} tokens), "
          f"{args.world_size} ranks, DDP gloo {args.device.upper()}, budget {args.max_tokens} tokens/step/rank, "
          f"odbd planner {args.planner}; {args.epochs} epoch(s), AdamW lr {args.lr:g}, "
          f"{args.heldout} held-out samples")
    if args.global_batch:
        print(f"same recipe: {args.global_batch} samples per optimizer step (Standard, length_grouped, packed, "
              f"kk_balanced: gradient accumulation of the same samples' count; bucketing and odb: windows of the "
              f"same expected loss tokens)")
    print(f"{'':16s}{'opt':>5s}{'micro':>7s}{'idle':>5s}{'samples/s':>10s}{'real tok/s':>11s}{'padding':>8s}"
          f"{'seconds':>8s}{'held-out':>9s}{'busy max/mean':>15s}")
    for seed, run in per_seed:
        for m in args.methods:
            x = run.get(m)
            if x is None:
                continue
            held = x["final_heldout_loss"]
            label = LABELS[m] if len(per_seed) == 1 else f"{LABELS[m]} s{seed}"
            busy = x.get("busy_seconds")
            busy_text = (f"{max(busy):5.1f}/{sum(busy) / len(busy):5.1f}s" if busy else "n/a")
            print(f"{label:16s}{x['optimizer_steps']:5d}{x['steps']:7d}{x['idle_steps']:5d}{x['samples_per_s']:10.1f}"
                  f"{x['real_tokens_per_s']:11.0f}{x['padding_fraction'] * 100:7.1f}%{x['seconds']:8.1f}"
                  f"{held if held is not None else float('nan'):9.3f}{busy_text:>15s}")
    print("(opt: optimizer steps; micro: micro-steps of the busiest rank; idle: IDLE micro-steps, all ranks; "
          "seconds: the training clock, evaluation excluded; held-out: token-level mean cross-entropy after "
          "training; busy: forward + backward + optimizer time per rank, waits for the other ranks excluded, "
          "max and mean over the ranks; loss at equal time: bench/loss_at_time.py)")
    if len(per_seed) > 1:
        over = summary["over_seeds"]
        for m in args.methods:
            h, c = over[m]["final_heldout_loss"], over[m]["seconds"]
            print(f"{LABELS[m]} over seeds {summary['seeds']}: held-out loss {h['mean']:.3f} +- {h['spread']:.3f}, "
                  f"training clock {c['mean']:.1f} +- {c['spread']:.1f} s")
    if rounds:
        print(f"\nmedians over {len(rounds)} interleaved rounds (order reversed every other round):")
        for m in args.methods:
            x = summary["over_rounds"][m]
            print(f"{LABELS[m]:16s} real tok/s {x['median_real_tokens_per_s']:8.0f} (rounds "
                  f"{', '.join(f'{v:.0f}' for v in x['real_tokens_per_s'])})  clock {x['median_seconds']:6.1f} s  "
                  f"held-out {', '.join(f'{v:.3f}' for v in x['final_heldout_loss'])}")
    if "best_peer" in summary:
        print(f"odb's best mode ({LABELS[summary['best_odb_mode']]}) / the best peer ({LABELS[summary['best_peer']]}): "
              f"real tokens/s x{summary['ratio_best_odb_to_best_peer']:.2f}" + (" (medians)" if rounds else ""))
    if s is not None and o is not None:
        # Over every seed: the held-out loss gap, and Standard's clock over odb's against the tokens/s ratio.
        held_s = [x["standard"]["final_heldout_loss"] for _, x in per_seed]
        held_o = [x["odb"]["final_heldout_loss"] for _, x in per_seed]
        clock = sum(x["standard"]["seconds"] for _, x in per_seed) / sum(x["odb"]["seconds"] for _, x in per_seed)
        rate = (sum(x["odb"]["real_tokens_per_s"] for _, x in per_seed) /
                sum(x["standard"]["real_tokens_per_s"] for _, x in per_seed))
        gap = (sum(held_o) / len(held_o)) / (sum(held_s) / len(held_s)) - 1
        print(f"odb / Standard: real tokens/s x{rate:.2f}, training clock Standard/odb x{clock:.2f}, "
              f"held-out loss {gap * 100:+.1f}% (seed spread of Standard: +-{spread(held_s)[1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
