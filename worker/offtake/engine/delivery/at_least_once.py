"""At-least-once: the consumer's offsets are committed once every record below them settled.

Batched asynchronous commits while running (:class:`~offtake.engine.commits.Committer`: by
time and by count), a synchronous one at the in-flight bound (its acknowledgement is what
frees room), and before letting partitions go (revoke, shutdown) a synchronous commit retried
through a rebalance until the broker acknowledged it: only then may the next owner start
past what was delivered here.
"""

from __future__ import annotations

import time

from offtake.engine.commits import Committer
from offtake.engine.delivery.base import DeliveryMode, Released
from offtake.records import TopicPartition

BOUND_COMMIT_SPACING = 0.02  # at the bound: synchronous commits at most this often
# The commit before letting partitions go retries a refusal that a rebalance explains until the
# drain budget is spent, and for at least this long even when the drain spent it: within the
# 15 s the pod's grace period adds to the budget (operator names.GRACE_EXTRA_SECONDS).
COMMIT_RETRY_FLOOR = 5.0


class AtLeastOnce(DeliveryMode):
    """Consumer offset commits (see the module docstring)."""

    def __init__(self, committer: Committer) -> None:
        super().__init__(committer.tracker)
        self.committer = committer
        self._last_bound_commit = 0.0
        # Shutting down: until when the final commit (and the revoke close() brings) may retry.
        self._final_commit_by: float | None = None

    def step(self, now: float) -> None:
        self.committer.maybe_commit()

    def at_bound(self, now: float) -> bool:
        # consume() would return records past the bound. What frees room is a commit's
        # acknowledgement, so commit what is done now and wait for it (an asynchronous
        # commit's acknowledgement would only arrive inside consume()). Spaced: a commit
        # refused mid-rebalance must not be retried in a tight loop (the rebalance itself
        # needs a consume(), which the spacing lets happen).
        if now - self._last_bound_commit < BOUND_COMMIT_SPACING:
            return False
        if not self.tracker.settled_uncommitted():
            return False
        self._last_bound_commit = now
        self.committer.commit(asynchronous=False)
        return True

    def revoking(self, partitions: set[TopicPartition], deadline: float) -> Released:
        drained = self.loop.drain(partitions, deadline)
        if not drained:
            self.loop.abandon(partitions)
        # Synchronously, retried while a rebalance refuses it: only an acknowledged commit
        # lets the next owner start past what was delivered here.
        committed = self.committer.commit_before_release(partitions, self._commit_by(deadline))
        return Released(drained, committed)

    def _commit_by(self, drain_deadline: float) -> float:
        """Until when a commit before letting go may retry (see ``COMMIT_RETRY_FLOOR``)."""
        if self._final_commit_by is not None:  # the revoke close() brings: shutdown's deadline
            return self._final_commit_by
        return max(drain_deadline, time.monotonic() + COMMIT_RETRY_FLOOR)

    def on_commit(self, offsets: dict[TopicPartition, int] | None, error: str | None) -> None:
        self.committer.on_commit(offsets, error)

    def end(self, drained: bool) -> None:
        pass  # the final commit waits for the processing thread's last settlements

    def final_commit(self, deadline: float) -> None:
        self._final_commit_by = self._commit_by(deadline)
        self.committer.commit_before_release(None, self._final_commit_by)
