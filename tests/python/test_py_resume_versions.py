"""Loader states of every version this odb reads (docs/resume.md, "What is saved"): one dataclass per
version (odb.resume_state.StateV1 to StateV4), each read with the fields it had and the types
state_dict() wrote. A state of each version, as the odb of that version wrote it, still loads with its
meaning; a state of a version this odb does not know, or with a field of the wrong type, is a
ValueError naming the version or the field. No daemon: states are written by hand or by state_dict()."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

import odb
import tiny_lm
from odb.resume_state import VERSIONS, StateV4, read_state

N = 40
LIST = [0, 3, 0, 1, 0, 3, 7, 0, 2, 0, 3, 5]
FORMAT = "odb.OdbDataLoader"


def _loader(sampler: "list | None" = None, world: int = 1) -> "odb.OdbDataLoader":
    corpus = tiny_lm.SyntheticCorpus(tiny_lm.long_tail_lengths(N, seed=5, min_len=4, max_len=60, median=20), vocab=64)
    return odb.OdbDataLoader(corpus, sampler=sampler, shuffle=sampler is None, seed=3, rank=0, world_size=world,
                             run_dir="/tmp/odb-unused")


def _v1() -> dict:
    """A version-1 state (odb 1 wrote no replay and no job): positions 0-9 and 12 of epoch 0's order."""
    return {"format": FORMAT, "version": 1, "epoch": 0, "epoch_complete": False, "seed": 3, "shuffle": True,
            "custom_sampler": False, "dataset_len": N, "world_size": 1, "scope": "all_ranks",
            "consumed": {"cursor": 10, "extra": [12]}, "key": "position"}


def _v2() -> dict:
    """Version 2: + replay (a reproducible epoch checkpointed after step 3, the first of round 1, which took
    position 12; positions 0-9 were trained in the rounds before)."""
    return dict(_v1(), version=2, replay={"round": 1, "first_step": 3, "next_step": 4, "world_size": 1,
                                          "round_consumed": {"cursor": 0, "extra": [12]}})


def _v3() -> dict:
    """Version 3: + job (the job counters)."""
    return dict(_v2(), version=3, job={"optimizer_steps": 7, "loss_tokens": 900, "epoch": 0,
                                       "epoch_optimizer_steps": 2, "epoch_loss_tokens": 250,
                                       "epoch_from_start": True, "completed_epoch": None})


def _v4_sampler() -> dict:
    """Version 4: a custom sampler's state keyed by positions in each rank's list (positions 0-2)."""
    return {"format": FORMAT, "version": 4, "epoch": 0, "epoch_complete": False, "seed": 0, "shuffle": False,
            "custom_sampler": True, "dataset_len": N, "world_size": 1, "scope": "all_ranks",
            "consumed": [{"cursor": 3, "extra": []}], "key": "rank_position",
            "consumed_ids": {"cursor": 0, "extra": [0, 3]}, "lists": [None], "replay": None,
            "job": {"optimizer_steps": 1, "loss_tokens": 40, "epoch": 0, "epoch_optimizer_steps": 1,
                    "epoch_loss_tokens": 40, "epoch_from_start": True, "completed_epoch": None}}


def _order() -> list:
    return _loader()._order.global_order().tolist()


def test_a_version_1_state_loads_with_its_meaning() -> None:
    loader = _loader()
    loader.load_state_dict(_v1())
    order = _order()
    assert loader.indices() == [i for p, i in enumerate(order) if p >= 10 and p != 12]
    assert loader.job_optimizer_steps == 0 and loader.job_loss_tokens == 0  # no job counters: zeros


def test_a_version_2_state_replays_its_round() -> None:
    """Same world size, a replay entry: the round replays from its first step, so only the samples of
    the rounds before it (positions 0-9) are left out; position 12 is sent (and skipped) again."""
    loader = _loader()
    loader.load_state_dict(_v2())
    assert loader._order.replaying() is not None
    assert loader.indices() == _order()[10:]
    assert loader.job_optimizer_steps == 0


def test_a_version_3_state_restores_the_job_counters() -> None:
    loader = _loader()
    loader.load_state_dict(_v3())
    assert loader.job_optimizer_steps == 7 and loader.job_loss_tokens == 900
    assert loader._counters.epoch_windows == 2 and loader._counters.resumed
    again = loader.state_dict()  # written as the current version, the job counters carried on
    assert again["version"] == 4 and again["job"]["optimizer_steps"] == 7


def test_a_version_4_sampler_state_loads() -> None:
    loader = _loader(LIST)
    loader.load_state_dict(_v4_sampler())
    assert loader.indices() == LIST[3:]
    assert loader.job_loss_tokens == 40


def test_a_version_is_read_with_the_fields_it_had() -> None:
    """Version 1 had no job counters and no replay: entries of those names are not part of it."""
    state = dict(_v1(), job=_v3()["job"], replay=_v2()["replay"])
    loader = _loader()
    loader.load_state_dict(state)
    assert loader.job_optimizer_steps == 0 and loader._order.replaying() is None
    assert type(read_state(state)).VERSION == 1


@pytest.mark.parametrize("version", [0, 5, 99, "4", 4.0, None])
def test_a_version_this_odb_does_not_know_is_a_clear_error(version) -> None:
    state = dict(_v3(), version=version)
    with pytest.raises(ValueError, match=f"version {version!r} is not supported by this odb "
                                         r"\(it reads versions 1 to 4\)"):
        _loader().load_state_dict(state)


@pytest.mark.parametrize("make,path,value,message", [
    (_v1, "epoch", "0", "epoch must be an integer, got '0'"),
    (_v1, "shuffle", 1, "shuffle must be true or false, got 1"),
    (_v1, "key", None, "key must be a string"),
    (_v2, "replay.first_step", 0.0, "replay.first_step must be an integer, got 0.0"),
    (_v3, "job.epoch_loss_tokens", "250", "job.epoch_loss_tokens must be an integer, got '250'"),
    (_v3, "job.epoch_from_start", "yes", "job.epoch_from_start must be true or false"),
    (_v4_sampler, "world_size", 1.0, "world_size must be an integer, got 1.0"),
], ids=["v1 epoch", "v1 shuffle", "v1 key", "v2 replay", "v3 job counter", "v3 job flag", "v4 world_size"])
def test_a_field_of_the_wrong_type_is_a_clear_error_naming_it(make, path, value, message) -> None:
    state = make()
    fresh = _loader(LIST if state["custom_sampler"] else None)
    fresh.load_state_dict(copy.deepcopy(state))  # the undamaged state loads
    *parents, last = path.split(".")
    node = state
    for p in parents:
        node = node[p]
    node[last] = value
    with pytest.raises(ValueError, match=message):
        _loader(LIST if state["custom_sampler"] else None).load_state_dict(state)


def test_a_key_of_a_later_version_is_refused_in_an_earlier_one() -> None:
    state = dict(_v4_sampler(), version=3)
    with pytest.raises(ValueError, match=r"key 'rank_position' \(version 3\) is not a key of version 3"):
        _loader(LIST).load_state_dict(state)


@pytest.mark.parametrize("sampler", [None, LIST], ids=["default order", "custom sampler"])
def test_state_dict_writes_the_current_versions_fields(sampler) -> None:
    """What state_dict() writes is StateV4's fields (no key without a field that reads it, no field
    left unwritten), and reading it back gives the same values."""
    loader = _loader(sampler)
    loader._log.reset(0)
    if sampler is None:
        loader._log.add(loader.indices()[:5], step=0)
    else:
        loader._order.start_epoch()
        loader._log.add([0, 3], owners=np.zeros(2, dtype=np.int64), seqs=[0, 1], step=0)
    loader._log.last_step = (0, 0, 0, 3, True)
    state = loader.state_dict()
    fields = {f.name for f in dataclasses.fields(StateV4)}
    if sampler is None:
        fields -= {"consumed_ids", "lists"}  # a custom sampler's only
    assert set(state) == fields | {"format", "version"}
    read = read_state(state)
    assert type(read) is VERSIONS[4] and read.key == state["key"] and read.consumed == state["consumed"]
    assert read.replay is not None and read.replay.next_step == 1 and read.job is not None
