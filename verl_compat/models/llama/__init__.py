"""verl's ``verl.models.llama``: see megatron/layers.py."""
