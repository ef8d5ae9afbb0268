"""``verl.utils.device`` on a CPU machine, for the rewritten verl tests: the device is ``cpu``, the backend ``gloo``.

``device_count`` stands in for ``torch.cuda.device_count()`` in verl's GPU tests run on CPU pools: the
number of simulated devices (worker processes) the tests spread over.
"""


def get_device_name() -> str:
    return "cpu"


def get_nccl_backend() -> str:
    return "gloo"


def device_count() -> int:
    return 4
