"""The data protocol between the driver and the workers, in one import path (as verl's ``verl.protocol``).

- ``DataProto`` and the ``DataProtoConfig.auto_padding`` switch: single_controller/data_proto.py
- ``TensorBatch``, DataProto's tensor storage and its ``TensorDict`` bridge: single_controller/tensor_batch.py
- ``DataProtoFuture`` and the padding that dispatch applies: single_controller/future.py
"""

from single_controller.data_proto import DataProto, DataProtoConfig
from single_controller.future import DataProtoFuture, pad_dataproto_to_divisor, unpad_dataproto
from single_controller.tensor_batch import TensorBatch

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "TensorBatch",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
]
