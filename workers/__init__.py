"""Worker-side code, by concern: the Ray role workers (roles/), what they compute (compute/), how a model is sharded
and trained in parallel (parallel/), their sharded checkpoints (checkpoint/), the process's allocator and
performance counters (runtime/), and the multi-turn tools (tools/, a user import path)."""
