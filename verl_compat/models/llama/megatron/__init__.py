"""verl's ``verl.models.llama.megatron``: the tensor-parallel LLaMA MLP the seeds build (layers.py)."""
