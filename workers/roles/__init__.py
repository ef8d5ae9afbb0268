"""The Ray role workers (``fsdp_workers``: actor + rollout + reference, critic, reward model), a role's placement
and trained state (``role``)."""
