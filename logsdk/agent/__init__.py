"""``logsdk agent``: one process per host (per spool root) that drains the shared-memory
rings of every ``LogProducer(delivery="agent")`` to Kafka (`logsdk.agent._agent`)."""
