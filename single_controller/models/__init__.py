"""The seed's import path for the tensor-parallel LLaMA MLP (seed 000, chapter 4).

The code is in single_controller/compat/llama_tp_mlp.py.
"""
