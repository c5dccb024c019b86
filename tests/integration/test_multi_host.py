"""Two "hosts" on one machine: network namespaces joined by a veth pair.

Gloo rendezvous (FileStore on a shared directory) and the Gloo traffic cross
the veth link between the namespaces; producers and trainers reach their local
daemon over ipc:// sockets, as on a real host. W = 4, two ranks per host.
"""
from __future__ import annotations

import uuid

import pytest

from odbtest import Daemon, run_epoch, network_namespaces

NS = ("odb-hosta", "odb-hostb")
ADDR = ("10.213.7.1", "10.213.7.2")


@pytest.fixture
def two_hosts():
    with network_namespaces(NS, ADDR, "odbveth"):
        yield


def test_four_ranks_on_two_hosts(tmp_path, two_hosts):
    job = f"job-{uuid.uuid4().hex[:8]}"
    counts = [900, 100, 400, 0]
    daemons = []
    try:
        for rank in range(4):
            host = rank // 2
            # Global planning: payloads of moved samples cross the link too.
            config = (f"local_world_size: 2\nalignment: {{gloo_hostname: {ADDR[host]}, planner: global}}\n"
                      "grouping: {window: 64}\n")
            daemons.append(Daemon(tmp_path, rank=rank, world=4, config=config, job_id=job,
                                  prefix=["ip", "netns", "exec", NS[host]]))
        results = run_epoch(daemons, counts)
    finally:
        for d in daemons:
            d.stop()
    assert len({e["steps"] for e in results}) == 1
    assert all("steps_detail" in e for e in results)  # run_epoch checked every step across ranks
    got = sorted(i for e in results for i in e["ids"])
    assert got == sorted(r * 1_000_000 + k for r in range(4) for k in range(counts[r]))
    assert results[3]["moved_in"] > 0  # rank 3 (host B, no data) trained samples from host A
    # Each rank listened for peers on its own host's veth address, so every
    # cross-host pair and payload went over the link between the namespaces.
    for d in daemons:
        assert f"peer endpoint tcp://{ADDR[d.rank // 2]}:" in d.log_path.read_text()
