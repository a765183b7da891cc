"""Partition assignors of the memory broker's groups: range, roundrobin, cooperative-sticky.

Owns the choice of which member gets which partition, given the members' subscriptions and
the partition counts, and the parsing of ``partition.assignment.strategy``. Pure functions of
their arguments, no state, no locking: the group coordinator calls them with the broker lock
held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from confluent_kafka import KafkaError

from .errors import raise_kafka
from .messages import TP

RebalanceProtocol = Literal["cooperative", "eager"]
Subscriptions = list[tuple[str, set[str]]]  # (member id, topics it reads), in join order


def assign_range(members: Subscriptions, partitions: Mapping[str, int]) -> dict[str, set[TP]]:
    """Kafka's range assignor: per topic, contiguous ranges to members sorted by id."""
    target: dict[str, set[TP]] = {m: set() for m, _ in members}
    for topic in sorted(partitions):
        subs = sorted(m for m, topics in members if topic in topics)
        if not subs:
            continue
        per, extra = divmod(partitions[topic], len(subs))
        start = 0
        for i, m in enumerate(subs):
            n = per + (1 if i < extra else 0)
            target[m].update((topic, p) for p in range(start, start + n))
            start += n
    return target


def assign_roundrobin(members: Subscriptions, partitions: Mapping[str, int]) -> dict[str, set[TP]]:
    """Kafka's roundrobin assignor: all partitions in order, dealt to members sorted by id."""
    target: dict[str, set[TP]] = {m: set() for m, _ in members}
    order = sorted(members)
    if not order:
        return target
    i = 0
    for topic in sorted(partitions):
        subs = [m for m, topics in order if topic in topics]
        if not subs:
            continue
        for p in range(partitions[topic]):
            while order[i % len(order)][0] not in subs:
                i += 1
            target[order[i % len(order)][0]].add((topic, p))
            i += 1
    return target


def assign_sticky(
    members: Subscriptions,
    partitions: Mapping[str, int],
    owned: Mapping[str, set[TP]],
) -> dict[str, set[TP]]:
    """Balanced and sticky: each member keeps what it owns up to its fair share.

    With equal subscriptions the result is balanced to within one partition and moves only
    partitions that must move, which is what cooperative-sticky promises.
    """
    target: dict[str, set[TP]] = {m: set() for m, _ in members}
    if not members:
        return target
    order = {m: i for i, (m, _) in enumerate(members)}
    subs = dict(members)
    all_parts = sorted((t, p) for t, n in partitions.items() for p in range(n))
    eligible = {tp: [m for m, _ in members if tp[0] in subs[m]] for tp in all_parts}
    base, extra = divmod(len(all_parts), len(members))
    taken: set[TP] = set()
    for m, _ in members:
        keep = sorted(
            tp
            for tp in owned.get(m, ())
            if tp in eligible and m in eligible[tp] and tp not in taken
        )
        limit = base
        if len(keep) > base and extra > 0:
            limit, extra = base + 1, extra - 1
        for tp in keep[:limit]:
            target[m].add(tp)
            taken.add(tp)
    for tp in all_parts:
        if tp in taken or not eligible[tp]:
            continue
        m = min(eligible[tp], key=lambda c: (len(target[c]), order[c]))
        target[m].add(tp)
    return target


def parse_strategy(value: Any) -> tuple[RebalanceProtocol, list[str]]:
    """``partition.assignment.strategy``: the rebalance protocol and the assignor names."""
    names = [s.strip() for s in str(value).split(",") if s.strip()]
    known = {"range", "roundrobin", "cooperative-sticky"}
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise_kafka(
            KafkaError._INVALID_ARG,
            f"partition.assignment.strategy: unsupported {', '.join(unknown) or 'empty value'}; "
            "expected range, roundrobin or cooperative-sticky",
        )
    if "cooperative-sticky" in names:
        if len(names) > 1:
            raise_kafka(
                KafkaError._INVALID_ARG,
                "partition.assignment.strategy: cooperative-sticky cannot be mixed with "
                "eager assignors",
            )
        return "cooperative", names
    return "eager", names
