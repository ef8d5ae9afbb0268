"""The worker process itself: its allocator (``malloc``) and its FLOPs, MFU and memory counters (``perf``)."""
