"""An in-memory Kafka broker whose clients behave like confluent-kafka's, for tests.

The clients implement the subset of confluent-kafka the engine uses (see
:mod:`offtake.kafka.protocols`) with librdkafka's semantics where the engine can observe them:

- Rebalance callbacks (``on_assign``, ``on_revoke``, ``on_lost``) and commit callbacks
  (``on_commit`` in the consumer config) run inside ``consume()``/``poll()``/``close()`` on the
  calling thread. A callback that does not call ``(incremental_)assign``/``unassign`` itself gets
  the same automatic call the confluent-kafka wrapper makes after it returns.
- Cooperative-sticky groups revoke only the partitions that move; a moved partition is handed
  to its new owner only after the old owner's ``on_revoke`` returned, so at no time do two
  members own a partition. ``on_assign`` runs once per rebalance, even with an empty list, and
  ``on_revoke`` never runs with an empty list (KIP-429). Eager groups (``range``,
  ``roundrobin``: librdkafka's default) revoke everything, and a member gets its new
  assignment once every previous owner of it has revoked.
- A newly assigned partition starts at the group's committed offset, else at
  ``auto.offset.reset`` (default ``latest``, as in librdkafka); it starts unpaused.
- Asynchronous commits report through ``on_commit`` from a later ``consume()``; synchronous
  commits return the offsets or raise and, as in confluent-kafka, do not call ``on_commit``.
- A commit for a partition this member does not own is rejected (a real broker may accept it
  silently and overwrite the new owner's progress; here it is a loud test failure): a
  synchronous commit raises ``KafkaException``, an asynchronous one reports the error to
  ``on_commit``; both are logged and listed in :attr:`MemoryBroker.rejected_commits`.
- ``enable.auto.commit`` and ``enable.auto.offset.store`` default to true as in librdkafka.
- A member that does not call ``consume()`` for ``max.poll.interval.ms`` is removed from the
  group; its next ``consume()`` returns a ``_MAX_POLL_EXCEEDED`` error message, calls
  ``on_lost`` (``on_revoke`` when unset) and rejoins.
- Static members (``group.instance.id``, KIP-345) do not leave the group on ``close()``:
  their partitions wait for the same instance to come back (no rebalance) or for
  ``session.timeout.ms``; a second consumer with the same id fences the first (its
  ``consume()`` returns a ``_FATAL`` error event, as librdkafka's does).
- A consumer whose assignors the group's members do not share is refused: its
  ``consume()`` returns ``INCONSISTENT_GROUP_PROTOCOL`` and it retries joining every second.
- Producer delivery reports are served by ``poll()``/``flush()`` on the calling thread;
  ``len(producer)`` counts messages not yet reported; a full queue raises ``BufferError``.

Test hooks: :meth:`MemoryBroker.fail_produce` and :meth:`MemoryBroker.stall` make deliveries
fail or hang; :meth:`MemoryClients.kill` abandons a worker's clients as SIGKILL would.

One broker-wide lock guards all state, with a condition variable that wakes waiting consumers
and producers on every change. No callback ever runs with the lock held.

The package, from the top down (import-linter keeps the layers; each module's docstring
states what it owns and its locking rule):

- :mod:`.broker`: :class:`MemoryBroker`, the admin and test API, and client factories;
- :mod:`.clients`: :class:`MemoryClients`, one worker's factory and its simulated SIGKILL;
- :mod:`.consumer`, :mod:`.producer`: the confluent-kafka look-alike clients;
- :mod:`.cluster`: the shared state and the one lock that guards it;
- :mod:`.coordinator` (groups, generations, commits), :mod:`.faults` (test-only delivery
  faults);
- :mod:`.assignors` (range, roundrobin, cooperative-sticky), :mod:`.storage` (partition
  logs), :mod:`.settings` (client configuration);
- :mod:`.messages`, :mod:`.errors`, :mod:`.timing`: values and pure helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .broker import MemoryBroker
from .clients import MemoryClients
from .consumer import MemoryConsumer
from .coordinator import GroupEvent
from .errors import ClientKilled
from .messages import MemoryMessage
from .producer import MemoryProducer

if TYPE_CHECKING:
    from offtake.kafka.protocols import ClientFactory

__all__ = [
    "ClientKilled",
    "GroupEvent",
    "MemoryBroker",
    "MemoryClients",
    "MemoryConsumer",
    "MemoryMessage",
    "MemoryProducer",
]


if TYPE_CHECKING:

    def _conforms(broker: MemoryBroker) -> ClientFactory:
        # mypy checks here that the memory clients satisfy the engine's protocols.
        return broker.clients()
