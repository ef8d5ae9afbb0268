"""The single controller: one driver process drives groups of worker processes through Ray."""

from single_controller.protocol import DataProto, DataProtoConfig, DataProtoFuture

__all__ = ["DataProto", "DataProtoConfig", "DataProtoFuture"]
