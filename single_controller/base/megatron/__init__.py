"""The seed's import path for the tensor-parallel (Megatron-style) worker.

The code is in single_controller/compat/megatron_worker.py.
"""

from single_controller.base.megatron.worker import *  # noqa: F403  (the names of base/megatron/worker.py)
from single_controller.base.megatron.worker import __all__  # noqa: F401
