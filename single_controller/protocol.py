"""The data protocol between the driver and the workers, in one import path (as verl's ``verl.protocol``).

- ``DataProto``: verl's, compat/data_proto.py (the core's with verl's methods: single_controller/data_proto.py), and
  ``DataProtoItem``, its ``data[i]``
- ``TensorBatch``, DataProto's tensor storage: single_controller/tensor_batch.py
- ``DataProtoConfig`` and the padding helpers: single_controller/padding.py
- ``DataProtoFuture``: single_controller/future.py
- ``union_tensor_dict``, ``union_numpy_dict``, ``list_of_dict_to_dict_of_list``: single_controller/merge.py
- verl's reshaping, gathering and encoding helpers: compat/data_proto.py, compat/serialization.py
"""

from single_controller.compat.data_proto import (
    DataProto,
    DataProtoItem,
    all_gather_data_proto,
    fold_batch_dim,
    unfold_batch_dim,
)
from single_controller.compat.serialization import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from single_controller.errors import ContractError
from single_controller.future import DataProtoFuture
from single_controller.merge import list_of_dict_to_dict_of_list, union_numpy_dict, union_tensor_dict
from single_controller.padding import DataProtoConfig, pad_dataproto_to_divisor, unpad_dataproto
from single_controller.tensor_batch import TensorBatch

__all__ = [
    "ContractError",
    "all_gather_data_proto",
    "DataProto",
    "DataProtoConfig",
    "DataProtoItem",
    "DataProtoFuture",
    "TensorBatch",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]
