"""Compatibility: the API that exists for the seed tutorials and for code ported from verl, never for the trainer.

Everything here is reachable under the import path the seeds or verl use (thin modules re-export it), so
nothing imports ``single_controller.compat`` directly except ColoRL's own modules:

- ``data_proto``: verl's extra DataProto methods (``reorder``, ``to_tensordict``, ...) and ``fold/unfold_batch_dim``
- ``serialization``: verl's ``serialize_*`` / ``deserialize_*`` tensor encodings
- ``worker``: verl's extra Worker methods (n-d dispatch meshes, ``get_master_addr_port``, ...)
- ``dispatch``: the dispatch modes the trainer does not use (``DP_COMPUTE``, ``DP_COMPUTE_METRIC``,
  ``DP_COMPUTE_PROTO_WITH_FUNC``, ``MEGATRON_COMPUTE(_PROTO)``, n-d ``make_nd_compute_dataproto_dispatch_fn``)
- ``worker_group``: verl's extra worker-group methods (``from_detached``, ``fuse``, mesh queries, ...)
- ``placement``: ``RayClassWithInitArgs.update_options``; ``resource_pool``: ``split_resource_pool``,
  ``SubRayResourcePool``, ``merge_resource_pool``
- ``fused``: verl's fused colocated class (``create_colocated_worker_raw_cls``)
- ``megatron_worker``, ``megatron_group``, ``llama_tp_mlp``: the seed's tensor-parallel (Megatron-style) API
"""
