"""load_state_dict with hostile or corrupted states (docs/resume.md, "What happens at load"): each is a
ValueError naming the field that is wrong, never a silent partial resume (int(1.5) is 1, bool("false")
is True) and never another exception (TypeError, OverflowError, MemoryError from a huge cursor).
No daemon: the states are built by state_dict() from recorded steps, then damaged."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import odb
import tiny_lm

N = 40
LIST = [0, 3, 0, 1, 0, 3, 7, 0, 2, 0, 3, 5]


def _loader(sampler: "list | None") -> "odb.OdbDataLoader":
    corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(N, seed=5, min_len=4, max_len=60, median=20), vocab=64)
    return odb.OdbDataLoader(corpus, sampler=sampler, shuffle=sampler is None, seed=3, rank=0, world_size=1,
                             run_dir="/tmp/odb-unused")


def _state(sampler: "list | None") -> dict:
    """A reproducible state one step into round 0 (so it has a replay entry), with job counters."""
    loader = _loader(sampler)
    loader._log.reset(0)
    if sampler is None:
        loader._log.add(loader.indices()[:10], step=0)
    else:
        loader._order.start_epoch()
        loader._log.add([0, 3], owners=np.zeros(2, dtype=np.int64), seqs=[0, 1], step=0)
    loader._log.last_step = (0, 0, 0, 3, True)
    loader._counters.completed_epoch = {"epoch": 0, "optimizer_steps": 4, "loss_tokens": 100}
    state = loader.state_dict()
    assert state["replay"] is not None
    return state


def _set(path: str, value):
    def damage(state: dict) -> None:
        *parents, last = path.split(".")
        node = state
        for p in parents:
            node = node[p]
        node[last] = value
    return damage


def _drop(path: str):
    def damage(state: dict) -> None:
        *parents, last = path.split(".")
        node = state
        for p in parents:
            node = node[p]
        del node[last]
    return damage


COMMON = [
    ("version float", _set("version", 4.0), "version 4.0"),
    ("version string", _set("version", "4"), "version '4'"),
    ("version bool", _set("version", True), "version True"),
    ("version 0", _set("version", 0), "version 0"),
    ("epoch float", _set("epoch", 1.5), "epoch must be an integer"),
    ("epoch None", _set("epoch", None), "epoch must be an integer"),
    ("epoch negative", _set("epoch", -1), "epoch is -1"),
    ("epoch_complete string", _set("epoch_complete", "false"), "epoch_complete must be true or false"),
    ("shuffle string", _set("shuffle", "no"), "shuffle must be true or false"),
    ("custom_sampler string", _set("custom_sampler", "False"), "custom_sampler must be true or false"),
    ("seed float", _set("seed", 3.5), "seed must be an integer"),
    ("dataset_len string", _set("dataset_len", "40"), "dataset_len must be an integer"),
    ("another dataset length", _set("dataset_len", N + 1), f"dataset of {N + 1}"),
    ("world_size 0", _set("world_size", 0), "world_size is 0"),
    ("scope None", _set("scope", None), "scope must be a string"),
    ("key list", _set("key", ["position"]), "key must be a string"),
    ("truncated", _drop("consumed"), "missing \\['consumed'\\]"),
    ("replay string", _set("replay", "x"), "malformed replay entry"),
    ("replay step float", _set("replay.next_step", 1.5), "replay.next_step must be an integer"),
    ("replay round negative", _set("replay.round", -1), "replay.round is -1"),
    ("replay truncated", _drop("replay.first_step"), "malformed replay entry.*first_step"),
    ("job list", _set("job", [1]), "malformed job counters"),
    ("job counter float", _set("job.optimizer_steps", 1.5), "job.optimizer_steps must be an integer"),
    ("job counter negative", _set("job.loss_tokens", -5), "negative job counters"),
    ("job epoch_from_start string", _set("job.epoch_from_start", "no"), "job.epoch_from_start"),
    ("job completed_epoch string", _set("job.completed_epoch", "x"), "job.completed_epoch"),
    ("job completed_epoch float", _set("job.completed_epoch.loss_tokens", 2.5),
     "job.completed_epoch.loss_tokens must be an integer"),
]

DEFAULT = [
    ("consumed list", _set("consumed", [1, 2]), "malformed consumed set"),
    ("consumed cursor float", _set("consumed", {"cursor": 2.5, "extra": []}), "cursor 2.5 must be an integer"),
    ("consumed negative", _set("consumed", {"cursor": 0, "extra": [-2, 1]}), "malformed consumed set"),
    ("consumed extra float", _set("consumed", {"cursor": 0, "extra": [1.5]}), "malformed consumed set"),
    ("consumed past the epoch", _set("consumed", {"cursor": 0, "extra": [N]}), f"names position {N}"),
    ("consumed huge cursor", _set("consumed", {"cursor": 10 ** 12, "extra": []}), "names position 999999999999"),
    ("consumed past int64", _set("consumed", {"cursor": 0, "extra": [2 ** 70]}), "names position"),
    ("round_consumed negative", _set("replay.round_consumed", {"cursor": 0, "extra": [-1]}),
     "malformed replay entry.*replay.round_consumed"),
]

SAMPLER = [
    ("consumed not per rank", _set("consumed", {"cursor": 0, "extra": []}), "malformed consumed \\(a list"),
    ("consumed negative", _set("consumed", [{"cursor": 0, "extra": [-1]}]), "malformed consumed\\[0\\] set"),
    ("consumed extra string", _set("consumed", [{"cursor": 0, "extra": ["a"]}]), "malformed consumed\\[0\\] set"),
    ("consumed past the list", _set("consumed", [{"cursor": 0, "extra": [100]}]),
     "consumed\\[0\\] names position 100 of rank 0's list, which held 12"),
    ("consumed huge cursor", _set("consumed", [{"cursor": 10 ** 12, "extra": []}]), "consumed\\[0\\] names position"),
    ("consumed past any list", _set("consumed", [{"cursor": 0, "extra": [1 << 62]}]), "past any list"),
    ("consumed_ids list", _set("consumed_ids", [1]), "malformed consumed_ids set"),
    ("consumed_ids past the dataset", _set("consumed_ids", {"cursor": 0, "extra": [N]}), f"dataset index {N}"),
    ("lists of another length", _set("lists", [None, None]), "malformed lists"),
    ("lists of numbers", _set("lists", [12]), "malformed lists"),
    ("round_consumed past the list", _set("replay.round_consumed", [{"cursor": 0, "extra": [50]}]),
     "malformed replay entry.*replay.round_consumed\\[0\\] names position 50"),
]


@pytest.mark.parametrize("name,damage,message", COMMON + DEFAULT, ids=[c[0] for c in COMMON + DEFAULT])
def test_a_hostile_state_of_the_default_order_is_a_clear_error(name, damage, message) -> None:
    state = _state(None)
    _loader(None).load_state_dict(copy.deepcopy(state))  # the undamaged state loads
    damage(state)
    with pytest.raises(ValueError, match=message):
        _loader(None).load_state_dict(state)


@pytest.mark.parametrize("name,damage,message", COMMON + SAMPLER, ids=[c[0] for c in COMMON + SAMPLER])
def test_a_hostile_custom_sampler_state_is_a_clear_error(name, damage, message) -> None:
    state = _state(LIST)
    _loader(LIST).load_state_dict(copy.deepcopy(state))
    damage(state)
    with pytest.raises(ValueError, match=message):
        _loader(LIST).load_state_dict(state)
