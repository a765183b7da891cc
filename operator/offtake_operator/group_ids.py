"""Consumer-group and share-group ids confined to the pipeline's namespace.

A group id names a group across the whole Kafka cluster, and Kafka lets any client that may
read a topic join any group on it. ``spec.source.groupId`` is free text, so without a rule a
pipeline author could join another team's consumer group (taking its partitions, committing
its offsets) or share group (acknowledging its records; each queue-mode worker also rewrites
the share group's ``share.delivery.count.limit`` and ``share.auto.offset.reset`` at start).

The rule: a pipeline's group id starts with ``<namespace>.`` (the default groupId is
``<namespace>.<name>``, and a redrive's group is ``<groupId>.redrive``, so both keep it). The
operator holds it for every pipeline it reconciles or injects (a pipeline that breaks it is
Failed with an InvalidSpec condition naming ``spec.source.groupId``, and gets no workers); the
chart's ValidatingAdmissionPolicy refuses such a pipeline at ``kubectl apply`` where the API
server has the API. The cluster admin turns the rule off with the chart's
``operator.confineGroupIds: false`` (OFFTAKE_CONFINE_GROUP_IDS), e.g. for groups that
predate Offtake and are shared on purpose.
"""

from __future__ import annotations

from offtake.contract import ConfigError, PipelineSpec

FIELD = "spec.source.groupId"


def prefix(namespace: str) -> str:
    """What every group id of a pipeline in ``namespace`` starts with."""
    return f"{namespace}."


def check(namespace: str, pipeline: PipelineSpec, confined: bool) -> None:
    """Raise ConfigError naming spec.source.groupId if ``pipeline``'s group id is outside its
    namespace's prefix (and the rule is on)."""
    group = pipeline.source.group_id
    if not confined or group.startswith(prefix(namespace)):
        return
    raise ConfigError(
        FIELD,
        f"{group!r} must start with {prefix(namespace)!r}: group ids are confined to the "
        f"pipeline's namespace so that no pipeline joins another namespace's group (the "
        f"cluster admin can lift this with the chart's operator.confineGroupIds: false)",
    )
