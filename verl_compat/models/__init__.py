"""verl's ``verl.models``: the seeds' tensor-parallel LLaMA MLP (llama/megatron/layers.py)."""
