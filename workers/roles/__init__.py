"""The Ray role workers (``fsdp_workers``: actor + rollout + reference; ``scoring_workers``: teacher, critic,
reward model), a role's placement and trained state (``role``)."""
