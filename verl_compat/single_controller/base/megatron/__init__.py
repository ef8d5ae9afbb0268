"""The seeds' ``verl.single_controller.base.megatron``: the tensor-parallel (Megatron-style) worker (worker.py)."""

from verl_compat.single_controller.base.megatron.worker import *  # noqa: F403  (the names of worker.py)
from verl_compat.single_controller.base.megatron.worker import __all__  # noqa: F401
