"""Configure the stdlib ``logging`` with ``dictConfig`` so records go to Kafka through KafkaHandler.

    python examples/logging_dictconfig.py                          # starts an embedded broker
    python examples/logging_dictconfig.py --bootstrap localhost:9092 --topic app-logs

The ``kafka`` handler below is all an application needs: ``class`` names the handler
and every other key (except ``level``, ``formatter``, ``filters``) is passed to it,
here the LogProducer arguments. ``logging.shutdown()`` (run at exit) closes it, which
delivers every record to Kafka within ``close_timeout`` (what Kafka cannot take by then
stays in the spool, for the next run).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.config
import sys
import tempfile
from typing import Any

from logsdk.integrations.logging import KafkaHandler


def logging_config(bootstrap: str, topic: str, spool_dir: str) -> dict[str, Any]:
    """The dictConfig document: console for humans, Kafka for the pipeline."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)-7s %(name)s: %(message)s"}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "plain"},
            "kafka": {
                "class": "logsdk.integrations.logging.KafkaHandler",
                "level": "INFO",
                "bootstrap_servers": bootstrap,
                "topic": topic,
                "spool_dir": spool_dir,  # one for the whole app (a slot per process); keep it
                "static_fields": {"service": "checkout", "env": "dev"},
            },
        },
        "root": {"level": "DEBUG", "handlers": ["console", "kafka"]},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers (default: an embedded broker)")
    ap.add_argument("--topic", default="app-logs")
    ap.add_argument("--spool-dir", default=None, help="default: a temporary directory")
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from logsdk.testing import EmbeddedBroker, create_topic

            broker = stack.enter_context(EmbeddedBroker())
            bootstrap = broker.bootstrap_servers
            create_topic(bootstrap, args.topic, 1)
        spool = args.spool_dir or stack.enter_context(tempfile.TemporaryDirectory())

        logging.config.dictConfig(logging_config(bootstrap, args.topic, spool))
        log = logging.getLogger("checkout.orders")
        log.debug("not shipped: below the kafka handler's level")
        log.info("order placed", extra={"order_id": 1042, "amount_eur": 19.9})
        log.warning("payment slow", extra={"order_id": 1042, "ms": 2300})
        try:
            raise TimeoutError("payment provider did not answer")
        except TimeoutError:
            log.exception("order failed")

        kafka = next(h for h in logging.getLogger().handlers if h.get_name() == "kafka")
        assert isinstance(kafka, KafkaHandler)
        logging.shutdown()  # closes the KafkaHandler: delivers to Kafka within close_timeout
        stats = kafka.producer.stats()
        print(
            f"sent {stats['sent']} record(s) to {args.topic}: acknowledged {stats['acked']}, "
            f"spooled {stats['spool_records']}, dropped {kafka.dropped}"
        )
        return 0 if stats["acked"] == stats["sent"] else 1


if __name__ == "__main__":
    sys.exit(main())
