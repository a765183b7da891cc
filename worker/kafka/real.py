"""The production client factory: confluent-kafka as it is."""

from __future__ import annotations

from typing import Any, cast

import confluent_kafka
from offtake.kafka.protocols import ConsumerLike, ProducerLike


class ConfluentClients:
    """Builds confluent-kafka clients; the engine never imports confluent_kafka itself."""

    def consumer(self, config: dict[str, Any]) -> ConsumerLike:
        return cast(ConsumerLike, confluent_kafka.Consumer(config))

    def producer(self, config: dict[str, Any]) -> ProducerLike:
        return cast(ProducerLike, confluent_kafka.Producer(config))

    def topic_partition(self, topic: str, partition: int, offset: int = -1001) -> Any:
        return confluent_kafka.TopicPartition(topic, partition, offset)
