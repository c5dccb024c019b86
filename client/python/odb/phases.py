"""Per-phase plans: route vision-encoder outputs from the encoder layout to the LLM layout.

With ``alignment.phase_plans`` the daemons balance a multimodal step twice
(OrchMLLM's global orchestrator): the LLM work (``Step.sample_ids``, in batch
order) and, separately, the encoder work (the samples whose images sit in this
rank's ``enc.*`` tensors). A sample's images are therefore usually encoded on a
different rank than the one that runs its LLM part. The step header says where
everything goes:

* ``enc_sample_ids[i]`` / ``enc_owner_ranks[i]``: encoder sample i of this rank
  (row block i of its ``enc.*`` tensors);
* ``enc_dest_rank[i]`` / ``enc_dest_index[i]``: its output is LLM sample
  number ``enc_dest_index[i]`` of rank ``enc_dest_rank[i]``;
* ``llm_src_rank[j]``: the rank that encodes this rank's LLM sample j.

:func:`route_encoder_outputs` moves the encoder outputs with ONE data
all-to-all (the composed permutation Pi_LLM o Pi_enc^-1) instead of gathering
back to the owners and scattering again. It is differentiable: the backward is
the reverse all-to-all, so encoder gradients flow back to the rank that ran
the encoder.

An audio encoder is a second encoder phase, balanced on its own cost (audio
frames) and routed the same way by its own header lists: ``audio_sample_ids``,
``audio_owner_ranks``, ``audio_dest_rank``, ``audio_dest_index`` and
``llm_audio_src_rank`` (:meth:`PhasePlan.route_audio`). Each phase's route is
its own composed permutation into the same LLM layout; every rank calls the
routes of the step in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

__all__ = ["PHASE_FIELDS", "PhasePlan", "enc_rows_from_offsets", "route_encoder_outputs"]

# The step header's per-phase lists (besides sample_ids), in PhasePlan order:
# the vision encoder's, then the audio encoder's.
PHASE_FIELDS = ("llm_src_rank", "enc_sample_ids", "enc_owner_ranks", "enc_dest_rank", "enc_dest_index",
                "audio_sample_ids", "audio_owner_ranks", "audio_dest_rank", "audio_dest_index",
                "llm_audio_src_rank")


def enc_rows_from_offsets(offsets: Any, rows_per_item: int = 1) -> List[int]:
    """Per-sample row counts from an ``enc.<field>_offsets`` tensor ``[n_enc+1]``.

    ``rows_per_item`` scales items to encoder output rows, e.g. the number of
    vision tokens each image becomes (the encoder output of sample i then has
    ``images_i * rows_per_item`` rows).
    """
    o = [int(x) for x in (offsets.tolist() if hasattr(offsets, "tolist") else offsets)]
    if not o or o[0] != 0 or any(b < a for a, b in zip(o, o[1:])):
        raise ValueError(f"offsets must start at 0 and not decrease; got {o}")
    return [(b - a) * int(rows_per_item) for a, b in zip(o, o[1:])]


def _group_world(group: Any) -> Tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _data_all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits: List[int], in_splits: List[int],
                     group: Any) -> torch.Tensor:
    """all_to_all_single with autograd (backward: the reverse all-to-all)."""
    from torch.distributed.nn.functional import all_to_all_single

    kwargs = {} if group is None else {"group": group}
    return all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits, **kwargs)


def route_encoder_outputs(enc_out: torch.Tensor, enc_rows: Sequence[int], enc_dest_rank: Sequence[int],
                          enc_dest_index: Sequence[int], llm_src_rank: Sequence[int],
                          group: Optional[Any] = None) -> Tuple[torch.Tensor, List[int]]:
    """Moves encoder outputs from this rank's encoder samples to the LLM samples they belong to.

    Args:
      enc_out: the encoder outputs of this rank's encoder samples (header
        ``enc_sample_ids`` order) concatenated along dim 0; sample i has
        ``enc_rows[i]`` rows (e.g. images x tokens per image, possibly 0).
        Trailing dims and dtype must be the same on all ranks.
      enc_rows: rows of each encoder sample, ``len == len(enc_dest_rank)``.
      enc_dest_rank, enc_dest_index: from the step header: encoder sample i is
        LLM sample ``enc_dest_index[i]`` of rank ``enc_dest_rank[i]``.
      llm_src_rank: from the step header: the rank that encodes each of this
        rank's LLM samples (``sample_ids`` order); used to check the plan.
      group: process group (default: the world). Without an initialised
        torch.distributed the world is this process alone (rank 0).

    Returns:
      ``(llm_in, llm_rows)``: the rows of this rank's LLM samples concatenated
      in ``sample_ids`` order, and each sample's row count.

    Every rank of the group must call this for the step (it runs two small
    all-to-alls of row counts, then one of the data), and when ``enc_out``
    requires grad every rank must use ``llm_in`` in its loss, even with zero
    rows, because the backward is a collective too. Splits of the data
    exchange come from what the senders announced, so an inconsistent plan
    never mismatches the collectives: it raises ValueError on the ranks that
    see it, after the exchange.
    """
    rows = [int(r) for r in enc_rows]
    dest_rank = [int(r) for r in enc_dest_rank]
    dest_index = [int(i) for i in enc_dest_index]
    src_rank = [int(r) for r in llm_src_rank]
    if not (len(rows) == len(dest_rank) == len(dest_index)):
        raise ValueError(f"enc_rows ({len(rows)}), enc_dest_rank ({len(dest_rank)}) and enc_dest_index "
                         f"({len(dest_index)}) must have one entry per encoder sample")
    if enc_out.dim() < 1 or enc_out.shape[0] != sum(rows):
        raise ValueError(f"enc_out has {tuple(enc_out.shape)}; dim 0 must be sum(enc_rows) = {sum(rows)}")
    if any(r < 0 for r in rows):
        raise ValueError(f"enc_rows must be >= 0; got {rows}")
    rank, world = _group_world(group)
    bad = [(i, r) for i, r in enumerate(dest_rank) if not 0 <= r < world]
    bad += [(j, r) for j, r in enumerate(src_rank) if not 0 <= r < world]
    if bad:
        raise ValueError(f"rank(s) outside the group of {world}: (sample, rank) {bad[:8]}; "
                         "is the group the one the daemons planned for?")

    # Send in (destination rank, destination index) order: each destination's
    # block is contiguous, and already in its LLM order.
    order = sorted(range(len(rows)), key=lambda i: (dest_rank[i], dest_index[i]))
    starts = [0] * len(rows)
    for i in range(1, len(rows)):
        starts[i] = starts[i - 1] + rows[i - 1]
    if order == list(range(len(rows))):
        send = enc_out
    else:
        idx = [r for i in order for r in range(starts[i], starts[i] + rows[i])]
        send = enc_out.index_select(0, torch.tensor(idx, dtype=torch.long, device=enc_out.device))
    send_samples = [0] * world
    send_rows = [0] * world
    for i in order:
        send_samples[dest_rank[i]] += 1
        send_rows[dest_rank[i]] += rows[i]
    meta = [v for i in order for v in (dest_index[i], rows[i])]

    if world == 1:
        recv_samples, recv_meta, recv = send_samples, meta, send
    else:
        dev = enc_out.device
        sent_n = torch.tensor(send_samples, dtype=torch.long, device=dev)
        recv_n = torch.empty(world, dtype=torch.long, device=dev)
        dist.all_to_all_single(recv_n, sent_n, group=group)
        recv_samples = [int(x) for x in recv_n.tolist()]
        sent_meta = torch.tensor(meta, dtype=torch.long, device=dev)
        recv_meta_t = torch.empty(2 * sum(recv_samples), dtype=torch.long, device=dev)
        dist.all_to_all_single(recv_meta_t, sent_meta, output_split_sizes=[2 * n for n in recv_samples],
                               input_split_sizes=[2 * n for n in send_samples], group=group)
        recv_meta = [int(x) for x in recv_meta_t.tolist()]
        recv_rows = [0] * world
        k = 0
        for s, n in enumerate(recv_samples):
            recv_rows[s] = sum(recv_meta[2 * (k + m) + 1] for m in range(n))
            k += n
        out = torch.empty((sum(recv_rows),) + tuple(enc_out.shape[1:]), dtype=enc_out.dtype, device=dev)
        recv = _data_all_to_all(out, send.contiguous(), recv_rows, send_rows, group)

    # Place each received sample at its LLM position, checking the plan.
    n_llm = len(src_rank)
    llm_rows: List[Optional[int]] = [None] * n_llm
    llm_start = [0] * n_llm
    problems: List[str] = []
    pos, k = 0, 0
    for s, n in enumerate(recv_samples):
        for _ in range(n):
            j, r = recv_meta[2 * k], recv_meta[2 * k + 1]
            k += 1
            if not 0 <= j < n_llm:
                problems.append(f"rank {s} sent LLM sample index {j}, but rank {rank} has {n_llm} samples")
            elif src_rank[j] != s:
                problems.append(f"LLM sample {j} came from rank {s}, llm_src_rank says {src_rank[j]}")
            elif llm_rows[j] is not None:
                problems.append(f"LLM sample {j} received twice")
            else:
                llm_rows[j], llm_start[j] = r, pos
            pos += r
    missing = [j for j in range(n_llm) if llm_rows[j] is None]
    if missing:
        problems.append(f"LLM samples {missing[:8]} received no encoder output")
    if problems:
        raise ValueError(f"rank {rank}: the phase plan is inconsistent: " + "; ".join(problems[:8]))
    final_rows = [int(r) for r in llm_rows]  # type: ignore[arg-type]
    expected_start = 0
    in_order = True
    for j in range(n_llm):
        in_order &= llm_start[j] == expected_start
        expected_start += final_rows[j]
    if in_order:
        return recv, final_rows
    idx = [r for j in range(n_llm) for r in range(llm_start[j], llm_start[j] + final_rows[j])]
    return recv.index_select(0, torch.tensor(idx, dtype=torch.long, device=recv.device)), final_rows


@dataclass(frozen=True)
class PhasePlan:
    """The per-phase part of one step header (see the module docstring).

    Empty lists everywhere when the daemons do not run per-phase plans.
    """

    sample_ids: List[int]
    llm_src_rank: List[int]
    enc_sample_ids: List[int]
    enc_owner_ranks: List[int]
    enc_dest_rank: List[int]
    enc_dest_index: List[int]
    # The audio encoder phase (empty when the header has none).
    audio_sample_ids: List[int] = field(default_factory=list)
    audio_owner_ranks: List[int] = field(default_factory=list)
    audio_dest_rank: List[int] = field(default_factory=list)
    audio_dest_index: List[int] = field(default_factory=list)
    llm_audio_src_rank: List[int] = field(default_factory=list)

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> "PhasePlan":
        """From a step header dict (``Delivery.step`` of the native client)."""
        return cls(*(list(header.get(k, [])) for k in ("sample_ids",) + PHASE_FIELDS))

    @classmethod
    def from_step(cls, step: Any) -> "PhasePlan":
        """From an :class:`odb.Step`: the plan of its header, also when the step
        no longer holds the received frames (pinned batches, dummy IDLE steps)."""
        phase = getattr(step, "_phase_fields", None)
        if phase is not None:
            return cls(list(step.sample_ids), *(list(phase.get(k, [])) for k in PHASE_FIELDS))
        delivery = getattr(step, "_delivery", None)
        if delivery is None:
            return cls(list(step.sample_ids), [], [], [], [], [])
        return cls.from_header(delivery.step)

    @property
    def enabled(self) -> bool:
        """True when the header carries a per-phase plan."""
        return bool(self.llm_src_rank or self.enc_dest_rank or self.has_audio)

    @property
    def has_audio(self) -> bool:
        """True when the header carries an audio encoder phase."""
        return bool(self.llm_audio_src_rank or self.audio_dest_rank)

    def route(self, enc_out: torch.Tensor, enc_rows: Sequence[int],
              group: Optional[Any] = None) -> Tuple[torch.Tensor, List[int]]:
        """:func:`route_encoder_outputs` with this plan."""
        return route_encoder_outputs(enc_out, enc_rows, self.enc_dest_rank, self.enc_dest_index,
                                     self.llm_src_rank, group)

    def route_audio(self, audio_out: torch.Tensor, audio_rows: Sequence[int],
                    group: Optional[Any] = None) -> Tuple[torch.Tensor, List[int]]:
        """:func:`route_encoder_outputs` for the audio encoder phase: its outputs
        (``audio_sample_ids`` order) to this rank's LLM samples."""
        return route_encoder_outputs(audio_out, audio_rows, self.audio_dest_rank, self.audio_dest_index,
                                     self.llm_audio_src_rank, group)
