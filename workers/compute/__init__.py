"""What a worker computes: generation (``rollout``, ``agent_loop``; ``vllm_rollout``, the vLLM engine), per-token
statistics (``logprob``), the PPO actor and critic and their update loop (``actor``, ``critic``, ``update``),
reward-model scores (``reward_model``), row packing (``packing``), the SDPA backend (``attention``) and the step's
tensors kept between phases (``step_store``)."""
