"""The POSIX shared-memory ring buffer behind ``LogProducer(buffer="shm")``."""

from logsdk.shm._inspect import SegmentInfo, inspect, list_segments, remove
from logsdk.shm._ring import ShmRing
from logsdk.shm._segment import segment_name

__all__ = ["SegmentInfo", "ShmRing", "inspect", "list_segments", "remove", "segment_name"]
