"""The daemon's job settings against the loader's arguments: each setting said once.

odbd tells its trainer client the settings a trainer must agree with when the
session starts (``Consumer.job_settings()``; docs/protocol.md, "Job
settings"). :func:`reconcile` fills the loader's arguments left None with the
daemon's values and refuses one given that disagrees, naming both values and
where each is set (docs/python.md, "Settings the daemon tells the loader").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

__all__ = ["SETTINGS", "Setting", "reconcile"]


def _equal(given: Any, daemon: Any) -> bool:
    return bool(given == daemon)


def _data_planes_agree(given: Any, daemon: Any) -> bool:
    # "auto" on either side takes whatever the other offers or asks for.
    return bool(given == daemon or "auto" in (given, daemon))


@dataclass(frozen=True)
class Setting:
    """One loader argument and the daemon setting it must agree with."""

    argument: str  # the loader's keyword argument
    key: str  # the key of Consumer.job_settings()
    config: str  # where odbd's config sets it
    agree: Callable[[Any, Any], bool] = _equal


SETTINGS: Tuple[Setting, ...] = (
    Setting("tokens_per_optimizer_step", "tokens_per_step", "optimizer.tokens_per_step"),
    Setting("packed", "packed", "collate.packed"),
    Setting("data_plane", "trainer_data_plane", "shm.trainer_data_plane", _data_planes_agree),
    Setting("length_field", "length_field", "collate.length_field"),
    Setting("ignore_index", "ignore_index", "collate.fields (the pad_value of labels)"),
)


def reconcile(settings: Optional[Mapping[str, Any]], endpoint: str, owner: str = "OdbDataLoader",
              **arguments: Any) -> Dict[str, Any]:
    """The given loader ``arguments`` (names of :data:`SETTINGS`) with the daemon's ``settings`` applied.

    An argument that is None takes the daemon's value; one given must agree with it, else ValueError naming
    ``owner(argument=value)``, the daemon's config key and value, and ``endpoint``. A setting the daemon
    does not state (``settings`` None: a daemon older than the job settings; an ignore index None: it
    collates no labels) leaves the argument as given.
    """
    by_argument = {s.argument: s for s in SETTINGS}
    unknown = sorted(set(arguments) - set(by_argument))
    if unknown:
        raise TypeError(f"reconcile: no daemon setting for {unknown} (known: {sorted(by_argument)})")
    out = dict(arguments)
    for name, given in arguments.items():
        setting = by_argument[name]
        daemon = None if settings is None else settings.get(setting.key)
        if daemon is None:
            continue
        if given is None:
            out[name] = daemon
        elif not setting.agree(given, daemon):
            raise ValueError(
                f"odb: {owner}({name}={given!r}) disagrees with the daemon at {endpoint}, which runs "
                f"{setting.config}: {daemon!r}. Leave {name} out (None) to take the daemon's value, or "
                f"set {setting.config} to {given!r} in odbd's config on every rank")
    return out
