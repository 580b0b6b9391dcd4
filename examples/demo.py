"""`make demo`: JSON log records through the embedded broker, counted end to end.

Starts the embedded Kafka broker, sends a few thousand JSON log records with
plain confluent-kafka, reads them all back, and prints a summary. (The
LogProducer / LogConsumer pipeline replaces the plain clients as it lands.)
"""

from __future__ import annotations

import json
import sys
import time

from confluent_kafka import KafkaError, Message, Producer

from logsdk.testing import EmbeddedBroker, create_topic, read_topic

RECORDS = 5000


def main() -> int:
    t0 = time.monotonic()
    with EmbeddedBroker() as broker:
        print(f"embedded broker up at {broker.bootstrap_servers} in {time.monotonic() - t0:.1f}s")
        topic = create_topic(broker.bootstrap_servers, "demo-logs", 3)
        acked = failed = 0

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            nonlocal acked, failed
            if err is None:
                acked += 1
            else:
                failed += 1

        producer = Producer({**broker.client_config("producer"), "enable.idempotence": True})
        for i in range(RECORDS):
            record = {"ts": time.time(), "level": "INFO", "logger": "demo", "message": f"hello {i}"}
            producer.produce(topic, json.dumps(record).encode(), on_delivery=on_delivery)
            producer.poll(0)
        left = producer.flush(30)
        del producer  # close its connections before the broker stops
        consumed = read_topic(broker.bootstrap_servers, topic)
        messages = {json.loads(m.value() or b"{}")["message"] for m in consumed}
        lost = RECORDS - len(messages)
        print(
            f"sent={RECORDS} acked={acked} failed={failed} unflushed={left} "
            f"consumed={len(consumed)} lost={lost}"
        )
    return 0 if lost == 0 and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
