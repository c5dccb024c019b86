"""check_step_invariants itself (no daemon): it accepts a correct epoch and rejects each kind of
corruption, so a multi-rank test that passes it really checked its steps."""
from __future__ import annotations

import copy

import pytest

from odbtest import StepRecord, check_step_invariants

W = 3


def _step(index: int, lengths_per_rank: list[list[int]]) -> list[StepRecord]:
    """Step `index` on every rank as the daemons compute it: w_r = W t_r / T_tok."""
    t = [sum(lengths) for lengths in lengths_per_rank]
    total = sum(t)
    return [StepRecord(index=index, idle=not lengths, weight=len(t) * t[r] / total if lengths else 0.0,
                       real_tokens=t[r], global_real_tokens=total, lengths=list(lengths))
            for r, lengths in enumerate(lengths_per_rank)]


def _epoch() -> list[list[StepRecord]]:
    """Three ranks, four steps; rank 2 idles in steps 1 and 3, rank 0 in step 3."""
    layout = [
        [[5, 7], [3], [11, 2, 1]],
        [[100], [1, 1, 1], []],
        [[9], [8], [7]],
        [[], [4, 4], []],
    ]
    by_step = [_step(k, lengths) for k, lengths in enumerate(layout)]
    return [[by_step[k][r] for k in range(len(layout))] for r in range(W)]


def test_a_correct_epoch_passes() -> None:
    check_step_invariants(_epoch(), W)


def test_weights_of_thirds_sum_to_w_within_rounding() -> None:
    # 1/3 is not exact in binary: the tolerance must accept rounding, not a real error.
    check_step_invariants([[s] for s in _step(0, [[1], [1], [1]])], W)


def _corrupt(fn) -> list[list[StepRecord]]:
    steps = copy.deepcopy(_epoch())
    fn(steps)
    return steps


@pytest.mark.parametrize("name,corruption,message", [
    ("weight off by 1e-6", lambda s: setattr(s[1][2], "weight", s[1][2].weight + 1e-6), "step 2 rank 1: weight"),
    ("weights swapped between ranks (sum still W)",
     lambda s: (setattr(s[0][0], "weight", s[1][0].weight), setattr(s[1][0], "weight", s[0][0].weight)),
     "step 0 rank 0: weight"),
    ("a missing step on one rank", lambda s: s[2].pop(1), "different numbers of steps"),
    ("a missing step on every rank", lambda s: [steps.pop(1) for steps in s], "step indices are not 0..2"),
    ("steps out of order", lambda s: s[0].insert(0, s[0].pop(2)), "rank 0: step indices"),
    ("an IDLE step with a weight", lambda s: setattr(s[2][1], "weight", 0.5), "step 1 rank 2: IDLE step with weight"),
    ("an IDLE step with samples", lambda s: setattr(s[2][3], "lengths", [4]), "IDLE step with samples"),
    ("header real_tokens not the sum of lengths", lambda s: setattr(s[0][0], "real_tokens", 13),
     "real_tokens 13 != sum of lengths 12"),
    ("a rank's length differs from what the weights were computed on",
     lambda s: (setattr(s[1][0], "lengths", [99]), setattr(s[1][0], "real_tokens", 99)),
     "step 0: global_real_tokens per rank"),
    ("global_real_tokens differs on one rank", lambda s: setattr(s[1][2], "global_real_tokens", 1),
     "global_real_tokens per rank"),
    ("an all-IDLE step", lambda s: [setattr(steps[3], f, v) for steps in s
                                    for f, v in (("idle", True), ("lengths", []), ("weight", 0.0),
                                                 ("real_tokens", 0))],
     "every rank IDLE"),
])
def test_each_corruption_is_caught(name, corruption, message) -> None:
    with pytest.raises(AssertionError, match=message):
        check_step_invariants(_corrupt(corruption), W)


def test_wrong_world_size_is_caught() -> None:
    with pytest.raises(AssertionError, match="world size 4"):
        check_step_invariants(_epoch(), 4)
