"""The logging configuration shared by the server examples: one ``dictConfig`` for every
process of the application, read from the environment.

    LOGSDK_BOOTSTRAP   Kafka bootstrap servers (required)
    LOGSDK_TOPIC       topic (default: app-logs)
    LOGSDK_SPOOL_DIR   one spool dir for the whole application (default: /tmp/logsdk-app);
                       each process takes a slot of its own under it
    LOGSDK_BUFFER      memory (default) or shm
    LOGSDK_DELIVERY    direct (default), or agent: each process only writes its records
                       into shared memory, and ``logsdk agent --spool-root
                       $LOGSDK_SPOOL_DIR`` ships them (docs/agent.md)

Imported by the application module, so it runs in whichever process imports the app:
the gunicorn master with ``--preload`` (the workers inherit the handler through fork and
start it afresh at their first log line), or each worker.
"""

from __future__ import annotations

import logging.config
import os


def configure() -> None:
    """Apply the dictConfig: INFO and above of every logger go to Kafka."""
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {
                "kafka": {
                    "class": "logsdk.integrations.logging.KafkaHandler",
                    "bootstrap_servers": os.environ["LOGSDK_BOOTSTRAP"],
                    "topic": os.environ.get("LOGSDK_TOPIC", "app-logs"),
                    "spool_dir": os.environ.get("LOGSDK_SPOOL_DIR", "/tmp/logsdk-app"),
                    "buffer": os.environ.get("LOGSDK_BUFFER", "memory"),
                    "delivery": os.environ.get("LOGSDK_DELIVERY", "direct"),
                    "close_timeout": 5.0,  # what process exit spends delivering
                },
                # logsdk's own warnings (an outage, records kept in the spool at exit):
                # never shipped through Kafka, so shown on stderr.
                "stderr": {"class": "logging.StreamHandler", "level": "WARNING"},
            },
            "loggers": {"logsdk": {"handlers": ["stderr"]}},
            "root": {"level": "INFO", "handlers": ["kafka"]},
        }
    )
