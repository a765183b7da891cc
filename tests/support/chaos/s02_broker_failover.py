"""Scenario 2 of docs/reliability.md: brokers killed under the workers (the three-broker
cluster: the leaders' broker SIGKILLed, then every broker restarted together)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from .common import Bed, CopyUnderFaults, Outcome


class Cluster(Bed, Protocol):
    def leaders(self, topic: str) -> dict[int, int]: ...
    def kill_node(self, node_id: int) -> None: ...
    def start_node(self, node_id: int) -> None: ...
    def restart_all(self) -> None: ...
    def wait_until_serving(self, timeout: float = 120.0) -> None: ...
    def wait_fully_replicated(self, topic: str, timeout: float = 120.0) -> None: ...


def broker_failover(
    cluster: Cluster,
    workdir: Path,
    *,
    records: int,
    outage: float,
    full_restart: bool = True,
    partitions: int = 6,
    max_in_flight: int = 2000,
) -> Outcome:
    """Two workers on the three-broker cluster: the broker leading most partitions of the
    input is SIGKILLed mid-run and started again after ``outage`` seconds; then every broker
    restarts together. The workers must ride both out without being restarted."""
    notes = []
    seconds = max(10.0, records / 10_000)
    with CopyUnderFaults(
        cluster,
        workdir,
        "brokers",
        partitions=partitions,
        records=records,
        seconds=seconds,
        workers=2,
        max_in_flight=max_in_flight,
    ) as run:
        run.monitor.wait_for(records // 5, 300, run.alive)
        leaders = list(cluster.leaders(run.src).values())
        victim = max(set(leaders), key=leaders.count)
        cluster.kill_node(victim)
        first = time.monotonic()
        time.sleep(outage)
        run.alive()
        cluster.start_node(victim)
        cluster.wait_until_serving()
        cluster.wait_fully_replicated(run.src)
        run.monitor.wait_for(min(records, run.monitor.latest() + records // 10), 300, run.alive)
        faults = [first]
        if full_restart:
            cluster.restart_all()
            faults.append(time.monotonic())
            cluster.wait_until_serving(180)
            notes.append(
                f"full restart: brokers serving again after {time.monotonic() - faults[-1]:.1f}s"
            )
        recover, lost, dup = run.finish(faults)
    return Outcome(
        "2. three brokers (RF 3, min.insync 2): leaders' broker killed, then all restarted",
        records,
        f"leader broker SIGKILLed for {outage:g}s"
        + ("; all 3 brokers restarted together" if full_restart else ""),
        len(faults),
        lost,
        dup,
        len(faults) * 2 * max_in_flight,
        recover,
        notes=notes,
    )
