"""Worker-side compute: FSDP2 sharding, rollout, the PPO actor and critic, and the Ray role workers."""
