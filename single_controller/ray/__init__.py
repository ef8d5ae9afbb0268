"""Worker groups on Ray: pools and worker classes (placement.py), groups (group.py, binding.py), colocated roles
(colocate.py), dead workers (health.py)."""
