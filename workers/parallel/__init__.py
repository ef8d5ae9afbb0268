"""How a model is spread and trained over ranks: FSDP2 (``fsdp``, the one module with FSDP code), LoRA adapters
(``lora``), fp32 master weights for low-precision parameters (``master_weights``) and the optimizer and
learning-rate schedule over them (``optim``)."""
