"""Adapters from logging frameworks to a LogProducer."""
