"""A role's sharded checkpoint (``shards``: every rank writes its own shards) and the file safety under every
checkpoint (``safe_files``: fsync, atomic writes, checksums, staging renames, plain loading)."""
