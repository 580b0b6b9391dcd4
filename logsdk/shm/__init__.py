"""The POSIX shared-memory ring buffer behind ``LogProducer(buffer="shm")``."""

from logsdk.shm._ring import SegmentInfo, ShmRing, inspect, list_segments, remove, segment_name

__all__ = ["SegmentInfo", "ShmRing", "inspect", "list_segments", "remove", "segment_name"]
