"""odb.phases.route_encoder_outputs: a toy multimodal model with a vision and an
audio encoder, whose encoder layouts differ from each other and from the LLM
layout, gives, after ONE routed all-to-all per encoder phase, exactly the LLM
inputs and the gradients of one process running the whole batch (float64, 2
gloo ranks and world size 1)."""
from __future__ import annotations

import datetime
import queue
import random
import socket
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch
import torch.multiprocessing as mp

from odb.phases import PhasePlan, enc_rows_from_offsets, route_encoder_outputs

VOCAB, DIM, IMAGE, AUDIO = 11, 6, (3, 2, 2), 5  # AUDIO: features per audio frame
TOL = 1e-10


# ----- the toy model and its data -------------------------------------------
def _mean_rows(n: int, rows: Sequence[int], feats: torch.Tensor) -> torch.Tensor:
    """[n, D]: each sample's mean of its rows of feats (0 without rows). The
    matrix uses feats even when it has no rows, so the backward (a collective
    when routed) runs on every rank."""
    mean = torch.zeros(n, feats.shape[0], dtype=feats.dtype)
    start = 0
    for j, r in enumerate(rows):
        if r:
            mean[j, start:start + r] = 1.0 / r
        start += r
    return mean @ feats


class ToyMLLM(torch.nn.Module):
    """Vision encoder: Linear over each flattened image -> one embedding per
    image. Audio encoder: Linear over each audio frame -> one embedding per
    frame. LLM: token embedding + the sample's mean image embedding + its mean
    audio embedding, linear head."""

    def __init__(self) -> None:
        super().__init__()
        n = IMAGE[0] * IMAGE[1] * IMAGE[2]
        self.enc = torch.nn.Linear(n, DIM)
        self.aud = torch.nn.Linear(AUDIO, DIM)
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.enc(pixels.flatten(1)))

    def encode_audio(self, frames: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.aud(frames))

    def llm_loss_sum(self, samples: Sequence[Dict[str, torch.Tensor]], img_rows: Sequence[int],
                     img_feats: torch.Tensor, audio_rows: Sequence[int],
                     audio_feats: torch.Tensor) -> torch.Tensor:
        """Sum of the per-token losses of `samples`; img_feats holds their
        image embeddings concatenated, img_rows[j] of them for sample j (and
        audio_feats / audio_rows their audio embeddings)."""
        img = _mean_rows(len(samples), img_rows, img_feats)
        aud = _mean_rows(len(samples), audio_rows, audio_feats)
        x = [self.emb(s["tokens"]) + img[j] + aud[j] for j, s in enumerate(samples)]
        if not x:
            return img.sum() + aud.sum()
        logits = self.head(torch.tanh(torch.cat(x)))
        labels = torch.cat([s["labels"] for s in samples])
        return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


def make_samples(seed: int, n: int) -> List[Dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(1, 7, (1,), generator=g))
        k = int(torch.randint(0, 4, (1,), generator=g))
        frames = int(torch.randint(0, 4, (1,), generator=g))
        out.append({"tokens": torch.randint(0, VOCAB, (length,), generator=g),
                    "labels": torch.randint(0, VOCAB, (length,), generator=g),
                    "images": torch.randn((k,) + IMAGE, generator=g, dtype=torch.float64),
                    "audio": torch.randn((frames, AUDIO), generator=g, dtype=torch.float64)})
    return out


def random_layout(rng: random.Random, n: int, world: int) -> List[List[int]]:
    """Sample ids split over `world` ranks in a random order; a rank may get none."""
    ids = list(range(n))
    rng.shuffle(ids)
    cuts = sorted(rng.randint(0, n) for _ in range(world - 1))
    bounds = [0] + cuts + [n]
    return [ids[bounds[r]:bounds[r + 1]] for r in range(world)]


def headers(llm: List[List[int]], enc: List[List[int]], aud: List[List[int]]) -> List[Dict[str, List[int]]]:
    """Each rank's step header fields, as the daemon computes them (vision
    phase enc_*, audio phase audio_*)."""
    llm_pos = {s: (r, j) for r, ids in enumerate(llm) for j, s in enumerate(ids)}
    enc_rank = {s: r for r, ids in enumerate(enc) for s in ids}
    aud_rank = {s: r for r, ids in enumerate(aud) for s in ids}
    return [{"sample_ids": llm[r],
             "llm_src_rank": [enc_rank[s] for s in llm[r]],
             "enc_sample_ids": enc[r],
             "enc_owner_ranks": [0] * len(enc[r]),
             "enc_dest_rank": [llm_pos[s][0] for s in enc[r]],
             "enc_dest_index": [llm_pos[s][1] for s in enc[r]],
             "llm_audio_src_rank": [aud_rank[s] for s in llm[r]],
             "audio_sample_ids": aud[r],
             "audio_owner_ranks": [0] * len(aud[r]),
             "audio_dest_rank": [llm_pos[s][0] for s in aud[r]],
             "audio_dest_index": [llm_pos[s][1] for s in aud[r]]} for r in range(len(llm))]


def make_case(seed: int, world: int, n: int, llm: Optional[List[List[int]]] = None,
              enc: Optional[List[List[int]]] = None,
              aud: Optional[List[List[int]]] = None) -> Tuple[List[Dict[str, torch.Tensor]], List[Dict]]:
    rng = random.Random(seed)
    llm = llm or random_layout(rng, n, world)
    while enc is None or enc == llm:
        enc = random_layout(rng, n, world)
    while aud is None or aud in (llm, enc):  # a third layout: each phase balanced on its own
        aud = random_layout(rng, n, world)
    return make_samples(seed, n), headers(llm, enc, aud)


def pixels_of(samples: Sequence[Dict[str, torch.Tensor]], ids: Sequence[int]) -> torch.Tensor:
    parts = [samples[s]["images"] for s in ids]
    return torch.cat(parts) if parts else torch.zeros((0,) + IMAGE, dtype=torch.float64)


def audio_of(samples: Sequence[Dict[str, torch.Tensor]], ids: Sequence[int]) -> torch.Tensor:
    parts = [samples[s]["audio"] for s in ids]
    return torch.cat(parts) if parts else torch.zeros((0, AUDIO), dtype=torch.float64)


def reference(samples: List[Dict[str, torch.Tensor]]) -> Tuple[float, List[torch.Tensor]]:
    """One process, the whole batch, no exchange: mean per-token loss and grads."""
    model = new_model()
    ids = list(range(len(samples)))
    feats = model.encode(pixels_of(samples, ids))
    audio = model.encode_audio(audio_of(samples, ids))
    total = sum(len(s["tokens"]) for s in samples)
    loss = model.llm_loss_sum(samples, [len(s["images"]) for s in samples], feats,
                              [len(s["audio"]) for s in samples], audio) / total
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def new_model() -> ToyMLLM:
    torch.manual_seed(1234)
    return ToyMLLM().double()


def run_rank(samples: List[Dict[str, torch.Tensor]], header: Dict[str, List[int]], group: Any = None,
             all_reduce: Optional[Callable[[torch.Tensor], None]] = None) -> Dict[str, Any]:
    """One rank's step: encoder on its encoder samples, route, LLM on its LLM
    samples, backward; returns how far LLM inputs and gradients are from the
    reference (max abs error)."""
    plan = PhasePlan.from_header(header)
    model = new_model()
    enc_pixels = pixels_of(samples, plan.enc_sample_ids)
    offsets = [0]
    for s in plan.enc_sample_ids:
        offsets.append(offsets[-1] + len(samples[s]["images"]))
    enc_rows = enc_rows_from_offsets(torch.tensor(offsets))
    enc_out = model.encode(enc_pixels)
    llm_in, llm_rows = plan.route(enc_out, enc_rows, group)
    # The audio phase: its own layout, its own route into the same LLM layout.
    audio_out = model.encode_audio(audio_of(samples, plan.audio_sample_ids))
    audio_in, audio_rows = plan.route_audio(audio_out, [len(samples[s]["audio"]) for s in plan.audio_sample_ids],
                                            group)
    mine = [samples[s] for s in plan.sample_ids]
    want_rows = [len(s["images"]) for s in mine]
    want_audio_rows = [len(s["audio"]) for s in mine]
    with torch.no_grad():
        want = model.encode(pixels_of(samples, plan.sample_ids))
        want_audio = model.encode_audio(audio_of(samples, plan.sample_ids))
    input_err = (llm_in - want).abs().max().item() if llm_in.numel() else 0.0
    if audio_in.numel():
        input_err = max(input_err, (audio_in - want_audio).abs().max().item())
    total = sum(len(s["tokens"]) for s in samples)
    # Sum over ranks: mean per-token loss.
    loss = model.llm_loss_sum(mine, llm_rows, llm_in, audio_rows, audio_in) / total
    loss.backward()
    # A rank without LLM samples leaves the LLM's grads unset: they are 0.
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]
    loss_sum = loss.detach().clone()
    if all_reduce is not None:
        for g in grads:
            all_reduce(g)
        all_reduce(loss_sum)
    ref_loss, ref_grads = reference(samples)
    return {"rows_ok": (llm_rows == want_rows and tuple(llm_in.shape) == (sum(want_rows), DIM)
                        and audio_rows == want_audio_rows
                        and tuple(audio_in.shape) == (sum(want_audio_rows), DIM)),
            "input_err": input_err, "loss_err": abs(loss_sum.item() - ref_loss),
            "grad_err": max((g - r).abs().max().item() for g, r in zip(grads, ref_grads))}


def assert_exact(result: Dict[str, Any], what: str) -> None:
    assert result["rows_ok"], f"{what}: wrong LLM row counts"
    assert result["input_err"] < TOL, f"{what}: LLM inputs differ from the reference by {result['input_err']}"
    assert result["loss_err"] < TOL, f"{what}: loss differs from the reference by {result['loss_err']}"
    assert result["grad_err"] < TOL, f"{what}: gradients differ from the reference by {result['grad_err']}"


# ----- two gloo ranks ---------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scenarios(world: int) -> List[Tuple[str, List[Dict[str, torch.Tensor]], List[Dict]]]:
    cases = [(f"seed{seed}", *make_case(seed, world, n)) for seed, n in ((0, 7), (1, 12), (2, 5), (3, 16))]
    # Edge: rank 0 runs no LLM sample, rank 1 encodes nothing (neither phase).
    cases.append(("empty-ranks", *make_case(9, world, 6, llm=[[], [5, 3, 0, 1, 4, 2]],
                                            enc=[[2, 4, 0, 1, 3, 5], []], aud=[[1, 0, 3, 2, 5, 4], []])))
    return cases


def _rank_main(rank: int, world: int, port: int, q: Any) -> None:
    try:
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=30))
        out: Dict[str, Any] = {}
        for name, samples, hdrs in _scenarios(world):
            out[name] = run_rank(samples, hdrs[rank], all_reduce=lambda t: dist.all_reduce(t))
            out[name]["moved"] = sum(src != rank for src in hdrs[rank]["llm_src_rank"])
            out[name]["audio_moved"] = sum(src != rank for src in hdrs[rank]["llm_audio_src_rank"])
        # A plan whose dest index disagrees with the receiver's llm_src_rank
        # fails on the receiver with a message, and on no rank with a hang.
        samples, hdrs = make_case(5, world, 6, llm=[[0, 1, 2], [3, 4, 5]], enc=[[3, 4, 5], [0, 1, 2]],
                                  aud=[[0, 3, 1], [4, 2, 5]])
        hdrs[0]["llm_src_rank"][0] = 0
        plan = PhasePlan.from_header(hdrs[rank])
        enc_out = pixels_of(samples, plan.enc_sample_ids).flatten(1)
        try:
            plan.route(enc_out, [len(samples[s]["images"]) for s in plan.enc_sample_ids])
            out["bad_plan"] = None
        except ValueError as e:
            out["bad_plan"] = str(e)
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, "ok", out))
    except BaseException:  # reported to the parent, which fails the test
        q.put((rank, "error", traceback.format_exc()))


def run_ranks_spawned(target: Callable[..., None], *args: Any, world: int = 2, timeout: float = 90.0) -> List[Any]:
    """Runs ``target(rank, *args, q)`` in `world` spawned processes, each of which puts
    ``(rank, "ok", value)`` or ``(rank, "error", traceback)`` on q; returns the values by rank. A rank's
    error or a hang (past `timeout`) fails the test; no process is left behind."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"ranks did not finish within {timeout}s (hang); done: {sorted(results)}")
            try:
                rank, status, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]


def run_two_ranks(timeout: float = 90.0) -> List[Dict[str, Any]]:
    return run_ranks_spawned(_rank_main, 2, free_port(), timeout=timeout)


def test_two_ranks_routed_step_equals_one_process() -> None:
    results = run_two_ranks()
    for name, _, hdrs in _scenarios(2):
        for rank in range(2):
            assert_exact(results[rank][name], f"{name} rank {rank}")
        # The layouts differ, so samples really crossed ranks, in both encoder phases.
        assert sum(results[r][name]["moved"] for r in range(2)) > 0, name
        assert sum(results[r][name]["audio_moved"] for r in range(2)) > 0, name
    assert results[0]["bad_plan"] is not None and "LLM sample 0 came from rank 1" in results[0]["bad_plan"]
    assert results[1]["bad_plan"] is None


# ----- world size 1, no torch.distributed ----------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_world_size_one_without_distributed(seed: int) -> None:
    import torch.distributed as dist

    assert not dist.is_initialized()
    samples, hdrs = make_case(seed, 1, 9)
    assert hdrs[0]["enc_sample_ids"] != hdrs[0]["sample_ids"]
    assert hdrs[0]["audio_sample_ids"] not in (hdrs[0]["sample_ids"], hdrs[0]["enc_sample_ids"])
    assert_exact(run_rank(samples, hdrs[0]), f"seed {seed}")


def test_wrong_route_is_caught() -> None:
    # Swapping the destinations of two encoder samples with different images
    # is a consistent plan for the router, so only the reference comparison
    # can see it: it must.
    samples, hdrs = make_case(4, 1, 8)
    h = hdrs[0]
    k = {s: len(samples[s]["images"]) for s in h["enc_sample_ids"]}
    a, b = next((i, j) for i in range(8) for j in range(i + 1, 8)
                if k[h["enc_sample_ids"][i]] and k[h["enc_sample_ids"][j]])
    h["enc_dest_index"][a], h["enc_dest_index"][b] = h["enc_dest_index"][b], h["enc_dest_index"][a]
    result = run_rank(samples, h)
    assert not result["rows_ok"] or result["input_err"] > 1e-3


def test_checks_inputs() -> None:
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="sum\\(enc_rows\\)"):
        route_encoder_outputs(x, [1, 1], [0, 0], [0, 1], [0, 0])
    with pytest.raises(ValueError, match="outside the group"):
        route_encoder_outputs(x, [3], [1], [0], [0])
    with pytest.raises(ValueError, match="received no encoder output"):
        route_encoder_outputs(x, [3], [0], [0], [0, 0])
    with pytest.raises(ValueError, match="received twice"):
        route_encoder_outputs(x, [1, 2], [0, 0], [0, 0], [0, 0])
    assert enc_rows_from_offsets([0, 2, 2, 5], rows_per_item=4) == [8, 0, 12]
    empty = PhasePlan.from_header({"sample_ids": [7]})
    assert not empty.enabled and empty.sample_ids == [7]


# ----- end to end: real daemons with alignment.phase_plans, OdbDataLoader --------
E2E_IMG = (3, 2, 2)


class _ImageTextDataset(torch.utils.data.Dataset):
    """Sample i: text of 4..40 tokens and 0..3 images whose pixels all equal
    i * 10 + image number (so a routed row names its sample)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(11)
        self.tokens = torch.randint(4, 41, (n,), generator=g).tolist()
        # Image-heavy samples on rank 0's share (even ids), so that the encoder
        # phase has a reason to differ from the token-balanced LLM layout.
        self.images = [int(torch.randint(2, 4, (1,), generator=g)) if i % 2 == 0 else
                       int(torch.randint(0, 2, (1,), generator=g)) for i in range(n)]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        k = self.images[i]
        pixels = torch.arange(k, dtype=torch.float32).add(i * 10).view(k, 1, 1, 1).expand((k,) + E2E_IMG)
        return {"input_ids": torch.arange(self.tokens[i]), "pixel_values": pixels.contiguous(),
                "vision_patches": 16 * k}


class _ImageAudioTextDataset(_ImageTextDataset):
    """The same, plus audio: sample i has frames of AUDIO features all equal to
    i * 100 + frame number. Under skew 5, rank 0's samples carry 3..6 frames and
    rank 1's (every fifth) 0 or 1: rank 0's steps hold several audio-heavy
    samples, more audio than its share, so the audio phase's balanced layout
    moves some to rank 1 while the LLM layout keeps them on rank 0."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        g = torch.Generator().manual_seed(12)
        self.frames = [int(torch.randint(0, 2, (1,), generator=g)) if i % 5 == 0 else
                       int(torch.randint(3, 7, (1,), generator=g)) for i in range(n)]

    def __getitem__(self, i: int) -> Dict[str, Any]:
        sample = super().__getitem__(i)
        f = self.frames[i]
        sample["audio_features"] = torch.arange(f, dtype=torch.float32).add(i * 100).view(f, 1).expand(f, AUDIO)
        sample["audio_features"] = sample["audio_features"].contiguous()
        sample["audio_frames"] = f
        return sample


def _e2e_rank(rank: int, world: int, run_dir: str, n: int, idle_policy: str = "zero_step",
              skew: int = 0, audio: bool = False) -> Dict[str, Any]:
    import odb

    dataset = _ImageAudioTextDataset(n) if audio else _ImageTextDataset(n)
    # skew k: rank 1 feeds every k-th sample, rank 0 the rest (ranks run out at different times).
    sampler = [i for i in range(n) if (i % skew == 0) == (rank == 1)] if skew else None
    loader = odb.OdbDataLoader(dataset, sampler=sampler, num_workers=0, idle_policy=idle_policy, timeout_s=60)
    from odbtest_py import step_record

    seen, enc_seen, steps, moved, errors, records, idle = [], [], 0, 0, [], [], 0
    audio_seen, audio_moved = [], 0
    for step in loader:
        records.append(step_record(step))
        plan = step.phase_plan
        assert plan == PhasePlan.from_step(step)
        b = step.batch
        idle += step.idle
        assert step.dummy or plan.enabled, f"step {step.step_index}: no phase plan in the header"
        # Every rank routes every step, IDLE or not: the routes are collectives.
        assert "pixel_values" not in b or step.dummy, "the LLM batch carries an encoder field"
        if plan.enc_sample_ids:
            enc_out = b["enc.pixel_values"].flatten(1)
            enc_rows = enc_rows_from_offsets(b["enc.pixel_values_offsets"])
        else:
            enc_out, enc_rows = torch.zeros((0, 12)), []
        llm_in, llm_rows = plan.route(enc_out, enc_rows)
        steps += 1
        moved += sum(src != rank for src in plan.llm_src_rank)
        seen.extend(plan.sample_ids)
        enc_seen.extend(plan.enc_sample_ids)
        start = 0
        for sid, rows in zip(plan.sample_ids, llm_rows):
            want = torch.arange(dataset.images[sid], dtype=torch.float32).add(sid * 10)
            got = llm_in[start:start + rows]
            if rows != dataset.images[sid] or not torch.equal(got, want.view(-1, 1).expand(-1, 12)):
                errors.append(f"step {step.step_index} sample {sid}: {rows} rows {got[:, 0].tolist()}")
            start += rows
        if not audio:
            continue
        # The audio phase: its own layout and route into the same LLM layout.
        assert step.dummy or plan.has_audio, f"step {step.step_index}: no audio phase in the header"
        assert "audio_features" not in b or step.dummy, "the LLM batch carries an audio encoder field"
        if plan.audio_sample_ids:
            audio_out = b["audio.audio_features"]
            audio_rows = enc_rows_from_offsets(b["audio.audio_features_offsets"])
        else:
            audio_out, audio_rows = torch.zeros((0, AUDIO)), []
        audio_in, llm_audio_rows = plan.route_audio(audio_out, audio_rows)
        audio_moved += sum(src != rank for src in plan.llm_audio_src_rank)
        audio_seen.extend(plan.audio_sample_ids)
        start = 0
        for sid, rows in zip(plan.sample_ids, llm_audio_rows):
            want = torch.arange(dataset.frames[sid], dtype=torch.float32).add(sid * 100)
            got = audio_in[start:start + rows]
            if rows != dataset.frames[sid] or not torch.equal(got, want.view(-1, 1).expand(-1, AUDIO)):
                errors.append(f"step {step.step_index} sample {sid} audio: {rows} rows {got[:, 0].tolist()}")
            start += rows
    return {"records": records, "seen": seen, "enc_seen": enc_seen, "steps": steps, "moved": moved, "errors": errors,
            "idle": idle, "summary": loader.last_summary, "audio_seen": audio_seen, "audio_moved": audio_moved}


def test_end_to_end_with_daemons_phase_plans(run_dir, job_id) -> None:
    from odbtest_py import check_step_invariants, run_ranks, start_daemons, stop_all

    config = {"alignment": {"planner": "global", "phase_plans": True},
              "grouping": {"max_tokens": 128, "max_vision_patches": 96},
              "collate": {"encoder_fields": ["pixel_values"], "fields": [{"name": "pixel_values", "rule": "concat"}]}}
    n = 60
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        results = run_ranks(_e2e_rank, 2, run_dir, timeout=300, n=n)
    finally:
        stop_all(daemons)
    assert results[0]["steps"] == results[1]["steps"] > 1
    check_step_invariants([r["records"] for r in results], 2)
    assert results[0]["errors"] == [] and results[1]["errors"] == []
    assert sorted(results[0]["seen"] + results[1]["seen"]) == list(range(n))
    assert sorted(results[0]["enc_seen"] + results[1]["enc_seen"]) == list(range(n))
    assert results[0]["moved"] + results[1]["moved"] > 0  # encoders balanced apart from the LLM layout


@pytest.mark.parametrize("idle_policy", ["zero_step", "join"])
def test_skewed_ranks_route_through_idle_steps(run_dir, job_id, idle_policy: str) -> None:
    """Rank 1 feeds a fifth of the samples and the local planner keeps them home,
    so rank 1 gets IDLE steps while rank 0 still trains: every rank still routes
    every step (an IDLE rank's plan is empty and no peer expects outputs from
    it), no rank waits for the process-group timeout, and every sample is
    trained and encoded once, under both IDLE policies."""
    from odbtest_py import check_step_invariants, run_ranks, start_daemons, stop_all

    config = {"alignment": {"planner": "local", "phase_plans": True},
              "grouping": {"max_tokens": 96, "max_vision_patches": 64},
              "collate": {"encoder_fields": ["pixel_values"], "fields": [{"name": "pixel_values", "rule": "concat"}]}}
    n = 50
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        results = run_ranks(_e2e_rank, 2, run_dir, timeout=300, n=n, idle_policy=idle_policy, skew=5)
    finally:
        stop_all(daemons)
    # phase_plans moves encoder work between ranks, so join runs every rank to the epoch's end too.
    assert results[0]["steps"] == results[1]["steps"] > 1
    check_step_invariants([r["records"] for r in results], 2)
    assert results[1]["idle"] > 0, "the skew gave rank 1 no IDLE step: the test tests nothing"
    assert results[0]["errors"] == [] and results[1]["errors"] == []
    assert sorted(results[0]["seen"] + results[1]["seen"]) == list(range(n))
    assert sorted(results[0]["enc_seen"] + results[1]["enc_seen"]) == list(range(n))
    assert sum(r["summary"]["emitted"] for r in results) == n


@pytest.mark.parametrize("idle_policy,memory", [("zero_step", False), ("join", False), ("zero_step", True)])
def test_audio_phase_through_real_daemons_with_skewed_ranks(run_dir, job_id, idle_policy: str, memory: bool) -> None:
    """collate.audio_fields: odbd balances an audio encoder phase on audio_frames, apart from the vision
    phase, and ships its route in the step header (audio_* lists, the "audio.*" batch). Rank 1 feeds a
    fifth of the samples, with little audio, and gets IDLE steps: every rank routes both encoder phases
    every step, each sample's audio frames reach the rank that runs its LLM part, byte for byte, and every
    sample is audio-encoded exactly once, under both IDLE policies. `memory`: with memory models (the
    memory-capped layouts and the relabeling of even_memory_peaks) the routes stay exact."""
    from odbtest_py import check_step_invariants, run_ranks, start_daemons, stop_all

    memory_models = {"vision_memory": {"per_unit": 4}, "audio_memory": {"per_unit": 3},
                     "llm_memory": {"per_unit": 1}, "memory_cap_margin": 0.0} if memory else {}
    config = {"alignment": {"planner": "local", "phase_plans": True, **memory_models},
              "grouping": {"max_tokens": 96, "max_vision_patches": 64},
              "collate": {"encoder_fields": ["pixel_values"], "audio_fields": ["audio_features"],
                          "fields": [{"name": "pixel_values", "rule": "concat"},
                                     {"name": "audio_features", "rule": "concat"}]}}
    n = 50
    daemons = start_daemons(run_dir, 2, job_id, config)
    try:
        results = run_ranks(_e2e_rank, 2, run_dir, timeout=300, n=n, idle_policy=idle_policy, skew=5, audio=True)
    finally:
        stop_all(daemons)
    assert results[0]["steps"] == results[1]["steps"] > 1
    check_step_invariants([r["records"] for r in results], 2)
    assert results[1]["idle"] > 0, "the skew gave rank 1 no IDLE step: the test tests nothing"
    assert results[0]["errors"] == [] and results[1]["errors"] == []
    assert sorted(results[0]["seen"] + results[1]["seen"]) == list(range(n))
    assert sorted(results[0]["enc_seen"] + results[1]["enc_seen"]) == list(range(n))
    assert sorted(results[0]["audio_seen"] + results[1]["audio_seen"]) == list(range(n))
    # Some of rank 0's audio-heavy samples were encoded on rank 1 in the steps both ranks run: the
    # audio phase was balanced on its own cost, not left in the LLM layout.
    assert results[0]["audio_moved"] + results[1]["audio_moved"] > 0
