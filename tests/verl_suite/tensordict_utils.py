"""What a ColoRL user writes instead of ``verl.utils.tensordict_utils.get_tensordict`` (docs/verl_api.md).

verl builds its TensorDict form of a batch with ``get_tensordict(tensors_and_lists, meta)``; in ColoRL the
same TensorDict comes from a DataProto: ``DataProto.from_dict(tensors, lists, meta).to_tensordict()``.
The rewritten verl tests import this module as ``tu``.
"""

import torch

from single_controller import DataProto


def get_tensordict(tensor_dict: dict, non_tensor_dict: dict | None = None):
    """Tensors as they are, lists (and arrays) as per-row non-tensor columns, ``non_tensor_dict`` as meta entries."""
    tensors = {k: v for k, v in tensor_dict.items() if isinstance(v, torch.Tensor)}
    columns = {k: v for k, v in tensor_dict.items() if not isinstance(v, torch.Tensor)}
    return DataProto.from_dict(tensors, columns, non_tensor_dict).to_tensordict()
