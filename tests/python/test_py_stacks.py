"""The loader refuses an unsupported stack pairing (issue 23 item 1, odb/stacks.py) wherever
the training code keeps its model and optimizer, not only as locals of the frame that runs
`for step in loader:`: a script's globals with its loop in a function, the loop inside a
wrapper (tqdm-style), an FSDP-wrapped layer inside a plain model, optimizers in a list or
in a trainer object's dict. Supported pairings pass, and objects that fail when looked at
do not break the loop.

FSDP and ZeroRedundancyOptimizer are stand-ins with the real class names (what the check
reads): FSDP needs CUDA in this torch, and ZeRO a process group (the real ZeRO is trained in
tests/python/test_py_zero.py). Nothing here reaches a daemon: the refusal comes when the
iteration starts.
"""
from __future__ import annotations

import textwrap
from typing import Any, Iterator

import pytest
import torch

import odb
import odb.stacks
import tiny_lm


class FullyShardedDataParallel(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner


class ZeroRedundancyOptimizer:
    pass


class DistributedDataParallel(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner


class Net(torch.nn.Module):
    """A plain model whose encoder alone is FSDP-wrapped."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 4), FullyShardedDataParallel(torch.nn.Linear(4, 4)))


class Trainer:
    def __init__(self, model: Any, optimizers: Any) -> None:
        self.model, self.optimizers = model, optimizers


def _loader(run_dir, policy: str = "join") -> odb.OdbDataLoader:
    return odb.OdbDataLoader(tiny_lm.SyntheticCorpus([4, 5], vocab=8), idle_policy=policy, rank=0, world_size=1,
                             run_dir=str(run_dir))


def _refused(start) -> str:
    with pytest.raises(odb.stacks.UnsupportedStackError) as e:
        start()
    return str(e.value)


def test_an_fsdp_layer_inside_a_plain_model_is_found(run_dir) -> None:
    model = Net()  # noqa: F841 - found in this frame by the loader
    loader = _loader(run_dir)
    message = _refused(lambda: iter(loader))
    assert "FullyShardedDataParallel" in message and "idle_policy='zero_step'" in message


def test_a_scripts_globals_are_seen_from_its_training_function(run_dir) -> None:
    """A script: model and optimizer at module level, `for step in loader:` in a function that
    takes only the loader."""
    script = textwrap.dedent("""\
        model = Net()
        optimizer = ZeroRedundancyOptimizer()

        def train(loader):
            for step in loader:
                pass
        """)
    module: dict = {"__name__": "__main__", "Net": Net, "ZeroRedundancyOptimizer": ZeroRedundancyOptimizer}
    exec(compile(script, "train.py", "exec"), module)
    loader = _loader(run_dir)
    message = _refused(lambda: module["train"](loader))
    assert "ZeroRedundancyOptimizer" in message or "FullyShardedDataParallel" in message, message


def _progress(iterable: Any) -> Iterator[Any]:
    """What tqdm(loader) does: iterate in its own frame."""
    for item in iterable:
        yield item


def test_a_loop_inside_a_progress_wrapper_is_checked(run_dir) -> None:
    model = FullyShardedDataParallel(torch.nn.Linear(2, 2))  # noqa: F841
    loader = _loader(run_dir)

    def loop() -> None:
        for _ in _progress(loader):
            pass

    assert "FullyShardedDataParallel" in _refused(loop)


@pytest.mark.parametrize("holder", ["list", "dict", "trainer-list", "trainer-dict"])
def test_optimizers_in_containers_and_trainer_objects_are_found(run_dir, holder: str) -> None:
    zero = ZeroRedundancyOptimizer()
    adam = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    held = {"list": [adam, zero], "dict": {"adam": adam, "zero": zero},
            "trainer-list": Trainer(torch.nn.Linear(2, 2), [adam, zero]),
            "trainer-dict": Trainer(torch.nn.Linear(2, 2), {"zero": zero})}[holder]
    del zero
    loader = _loader(run_dir)
    assert held is not None
    assert "ZeroRedundancyOptimizer" in _refused(lambda: iter(loader))


class _Hostile:
    """An object that fails whenever it is looked at."""

    def __getattribute__(self, name: str) -> Any:
        raise RuntimeError(f"no {name}")


def test_supported_pairings_pass_and_odd_objects_do_not_break_the_check(run_dir) -> None:
    ddp = DistributedDataParallel(torch.nn.Linear(2, 2))
    hostile = _Hostile()
    assert hostile is not None and ddp is not None
    # join with DDP (a plain model beside it): supported; the check looked and found DDP
    assert odb.stacks.check_caller_stack("join", depth=1) == ["DistributedDataParallel"]
    iter(_loader(run_dir, "join"))
    # zero_step with everything
    model, zero = Net(), ZeroRedundancyOptimizer()
    assert model is not None and zero is not None
    assert sorted(odb.stacks.check_caller_stack("zero_step", depth=1)) == \
        ["DistributedDataParallel", "FullyShardedDataParallel", "ZeroRedundancyOptimizer"]
    iter(_loader(run_dir, "zero_step"))


def test_a_large_object_graph_is_looked_at_within_a_bound() -> None:
    """A model of many modules and a long list beside it: the check ends (it has a budget of
    objects) and still sees the stack."""
    big = torch.nn.Sequential(*[torch.nn.Linear(1, 1) for _ in range(2000)], FullyShardedDataParallel(torch.nn.Linear(1, 1)))
    junk = [object() for _ in range(100_000)]
    assert odb.stacks.stack_components([big, junk]) == ["FullyShardedDataParallel"]


def test_the_docs_stacks_table_has_every_cell_and_names_tests_that_exist() -> None:
    """docs/python.md "Stacks": a row per stack and IDLE policy, a cell per layout, and every test it
    names (file, and test function where named) exists, so the table cannot point at nothing."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs/python.md").read_text()
    section = doc[doc.index("\n## Stacks\n"):doc.index("\n## ", doc.index("\n## Stacks\n") + 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| stack")]
    cells = {row.split(" | ")[0].strip("| "): row.split(" | ")[1:] for row in rows}
    expected = ["DDP, `zero_step`", "DDP, `join` (`with ddp.join():`)", "`ZeroRedundancyOptimizer` (with DDP), `zero_step`",
                "`ZeroRedundancyOptimizer`, `join`", "FSDP, `zero_step`", "FSDP, `join`"]
    assert list(cells) == expected, list(cells)
    assert all(len(c) == 3 and all(x.strip(" |") for x in c) for c in cells.values()), cells
    named = re.findall(r"`(test_py_\w+\.py)?((?:::\w+(?:\[\w+\])?)?)`", section)
    assert len(named) >= 10, named
    last_file = None
    for file, func in named:
        if not file and not func:
            continue
        last_file = file or last_file
        path = root / "tests/python" / last_file
        assert path.exists(), f"docs/python.md names {last_file}, which does not exist"
        if func:
            name = func.removeprefix("::").split("[")[0]
            assert re.search(rf"^def {name}\(", path.read_text(), re.M), f"{last_file} has no {name}"
