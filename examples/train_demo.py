"""Standard vs odb on a small causal transformer, 2 ranks, DDP (gloo, CPU).

Both runs train the same model from the same initialisation on the same
long-tail data for one epoch:
  Standard: random order, fixed batch size B = max_tokens // max_len (fits the
            longest sample under the token budget), padded to the batch max.
  odb:      OdbDataLoader -> one odbd per rank, batches by real length under
            max_tokens (padded cost), steps aligned across ranks; with the
            default --planner global the daemons group across ranks and
            deal groups of similar cost into each step (moving samples).
Prints samples/s, real tokens/s, padding fraction, steps, idle steps and the
odb/Standard throughput ratio (--json: one JSON object instead).

Preemption and resume (docs/resume.md): `--checkpoint-every K --kill-at-step S`
checkpoints model, optimizer and loader state every K steps and SIGKILLs every
trainer and daemon after step S; `--resume PATH` restarts the odb run from the
checkpoint with new daemons and trains only the samples not trained before.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "client/python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import tiny_lm  # noqa: E402


def log(rank: int, quiet: bool, text: str, end: str = "\n") -> None:
    if rank == 0 and not quiet:
        print(text, end=end, file=sys.stderr, flush=True)


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


def train_epoch(name, rank, world, model, ddp, opt, steps_iter, quiet, device=torch.device("cpu")) -> dict:
    """Runs one epoch; returns global counters (all ranks summed) and wall time."""
    dist.barrier()
    sync(device)
    start = time.perf_counter()
    real = padded = samples = steps = idle = 0
    loss_sum = 0.0
    for step in steps_iter:
        b = to_device(step["batch"], device)
        logits = ddp(b["input_ids"], b["attention_mask"])
        loss = step["loss_fn"](logits, b["labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        idle += step["idle"]
        real += step["real"]
        padded += step["padded"]
        samples += step["samples"]
        loss_sum += step["loss_tokens_sum"](logits, b["labels"]) if steps % 10 == 0 else 0.0
        if steps % 5 == 0:
            elapsed = time.perf_counter() - start
            log(rank, quiet, f"\r[{name}] rank0 step {steps:4d}  loss {loss.item():7.4f}  "
                             f"{real / max(elapsed, 1e-9):8.0f} real tok/s (rank 0)", end="")
    sync(device)
    dist.barrier()
    seconds = time.perf_counter() - start
    log(rank, quiet, "")
    totals = torch.tensor([real, padded, samples, steps, idle], dtype=torch.float64)
    dist.all_reduce(totals)
    steps_per_rank = torch.tensor([steps], dtype=torch.float64)
    dist.all_reduce(steps_per_rank, op=dist.ReduceOp.MAX)
    real, padded, samples, _, idle = totals.tolist()
    return {"seconds": seconds, "real_tokens": int(real), "padded_tokens": int(padded),
            "samples": int(samples), "steps": int(steps_per_rank.item()), "idle_steps": int(idle),
            "samples_per_s": samples / seconds, "real_tokens_per_s": real / seconds,
            "padding_fraction": 1.0 - real / max(padded, 1)}


def ce_sum(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             ignore_index=-100, reduction="sum")


def rank_main(rank: int, world: int, args, run_dir: str, job_id: str, out_path: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), ODB_RUN_DIR=run_dir)
    device = torch.device("cpu")
    if args.device == "cuda":
        # Ranks share the GPUs round-robin (gloo also works with 2 ranks on one GPU).
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-init", rank=rank, world_size=world)
    import odb

    daemon = odb.spawn_daemon(rank, world, run_dir, job_id=job_id, wait=False, log_level="warn",
                              config=tiny_lm.daemon_config(args.max_tokens, seed=args.seed,
                                                           alignment={"planner": args.planner,
                                                                      "deterministic": args.deterministic}))
    lengths = tiny_lm.long_tail_lengths(args.samples, seed=args.seed, max_len=args.max_len)
    dataset = tiny_lm.SyntheticCorpus(lengths, vocab=args.vocab)
    results = {}
    try:
        daemon.wait_ready(60)
        for run in (("odb",) if args.resume else ("standard", "odb")):
            torch.manual_seed(args.seed)
            model = tiny_lm.TinyCausalLM(vocab=args.vocab, d_model=args.d_model, layers=args.layers, heads=4,
                                         max_len=args.max_len + 1).to(device)
            ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
            checkpoint = torch.load(args.resume) if (args.resume and run == "odb") else None
            if checkpoint is not None:
                model.load_state_dict(checkpoint["model"])  # (saved from the same device kind)
                opt.load_state_dict(checkpoint["opt"])
            if run == "standard":
                batch = max(1, args.max_tokens // args.max_len)
                sampler = torch.utils.data.DistributedSampler(dataset, world, rank, shuffle=True, seed=args.seed)
                loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler,
                                                     pin_memory=device.type == "cuda",
                                                     num_workers=args.workers, collate_fn=tiny_lm.pad_collate)

                def steps_iter():
                    for b in loader:
                        real = int(b["attention_mask"].sum())
                        yield {"batch": b, "idle": False, "real": real, "padded": b["input_ids"].numel(),
                               "samples": b["input_ids"].shape[0],
                               "loss_fn": lambda lg, lb, n=real: ce_sum(lg, lb) / n,
                               "loss_tokens_sum": lambda lg, lb: 0.0}
            else:
                oloader = odb.OdbDataLoader(dataset, shuffle=True, seed=args.seed, num_workers=args.workers,
                                            idle_policy="zero_step", timeout_s=120)
                start_step = 0
                if checkpoint is not None:
                    oloader.load_state_dict(checkpoint["loader"])  # skips what was trained before
                    start_step = checkpoint["step"]
                    log(rank, args.quiet, f"[odb] resumed from {args.resume} at step {start_step}")

                def steps_iter():
                    done = start_step
                    for s in oloader:
                        yield {"batch": s.batch, "idle": s.idle, "real": s.real_tokens,
                               "padded": s.padded_tokens, "samples": len(s.sample_ids),
                               "loss_fn": lambda lg, lb, s=s: odb.weighted_cross_entropy(
                                   lg, lb, s.loss_weight, s.real_tokens),
                               "loss_tokens_sum": lambda lg, lb: 0.0}
                        done += 1  # the step above is trained once the loop asks for the next one
                        if args.checkpoint_every and done % args.checkpoint_every == 0:
                            state = oloader.state_dict()  # collective: every rank, same step
                            if rank == 0:
                                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                            "loader": state, "step": done}, args.checkpoint + ".tmp")
                                os.replace(args.checkpoint + ".tmp", args.checkpoint)
                            dist.barrier()
                        if args.kill_at_step and done == args.kill_at_step:
                            log(rank, args.quiet, f"\n[odb] simulated preemption at step {done}: SIGKILL to "
                                                  f"trainers and daemons; resume with --resume {args.checkpoint}")
                            daemon.proc.kill()
                            os.kill(os.getpid(), signal.SIGKILL)
            results[run] = train_epoch(run, rank, world, model, ddp, opt, steps_iter(), args.quiet, device)
        if rank == 0:
            Path(out_path).write_text(json.dumps(results))
    finally:
        dist.barrier()
        daemon.stop()
        dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=3000, help="dataset size (both ranks together)")
    p.add_argument("--max-len", type=int, default=256, help="longest sample (tokens)")
    p.add_argument("--max-tokens", type=int, default=512, help="token budget per step and rank")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--planner", choices=("local", "global"), default="global",
                   help="odbd alignment.planner: global balances work across ranks (moves samples)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: model on the GPU(s), batches copied from pinned memory with non_blocking, "
                        "timings synchronised (bench/gpu_run.sh)")
    p.add_argument("--deterministic", action="store_true",
                   help="odbd alignment.deterministic: the same steps on every run, whatever the workers' timing")
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
    run_dir = tempfile.mkdtemp(prefix="odbdemo-")
    out = os.path.join(run_dir, "result.json")
    job_id = f"demo-{uuid.uuid4().hex[:10]}"
    try:
        mp.spawn(rank_main, args=(args.world_size, args, run_dir, job_id, out), nprocs=args.world_size, join=True)
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
        return 0
    r = json.loads(Path(out).read_text())
    if args.resume:
        o = r["odb"]
        consumed = torch.load(args.resume)["loader"]["consumed"]
        before = consumed["cursor"] + len(consumed["extra"])
        print(f"\n== odb resumed from {args.resume}: {before} samples trained before the checkpoint + "
              f"{o['samples']} after the resume = {before + o['samples']} of {args.samples} "
              f"(in {o['steps']} steps, {o['idle_steps']} idle, {o['real_tokens_per_s']:.0f} real tok/s)")
        if args.json:
            print(json.dumps({"resumed": o}, indent=1))
        return 0
    s, o = r["standard"], r["odb"]
    summary = {
        "world_size": args.world_size, "samples": args.samples, "max_len": args.max_len, "device": args.device,
        "max_tokens": args.max_tokens, "planner": args.planner, "deterministic": args.deterministic,
        "standard": s, "odb": o,
        "ratio_real_tokens_per_s": o["real_tokens_per_s"] / s["real_tokens_per_s"],
        "ratio_samples_per_s": o["samples_per_s"] / s["samples_per_s"],
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"\n== odb demo: {args.samples} long-tail samples (max {args.max_len} tokens), "
          f"{args.world_size} ranks, DDP gloo CPU, budget {args.max_tokens} tokens/step/rank, "
          f"odbd planner {args.planner}")
    print(f"{'':10s}{'steps':>7s}{'idle':>6s}{'samples/s':>11s}{'real tok/s':>12s}{'padding':>9s}{'seconds':>9s}")
    for name, x in (("Standard", s), ("odb", o)):
        print(f"{name:10s}{x['steps']:7d}{x['idle_steps']:6d}{x['samples_per_s']:11.1f}"
              f"{x['real_tokens_per_s']:12.0f}{x['padding_fraction'] * 100:8.1f}%{x['seconds']:9.1f}")
    print(f"odb / Standard: real tokens/s x{summary['ratio_real_tokens_per_s']:.2f}, "
          f"samples/s x{summary['ratio_samples_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
