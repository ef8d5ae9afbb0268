"""verl's own tests run as verl runs them: each Ray test starts and stops its own cluster (``ray.init`` in the test).

So, around a module that uses Ray, the session's shared cluster (tests/conftest.py) steps aside and comes
back afterwards; the workers of the test's own cluster find the test modules through ``PYTHONPATH``. verl's
tests also set process-wide environment variables (``RANK``, ...): each test gets the environment back.
"""

import os
import sys
from pathlib import Path

import pytest
import ray

ROOT = Path(__file__).resolve().parents[2]
# the slowest of verl's resource-pool tests (~20 s each, a Ray cluster apiece) run in make test-all only; the file's
# two others run in make test
SLOW = (
    "test_split_resource_pool.py::test_split_resource_pool_with_split_twice",
    "test_split_resource_pool.py::test_split_resource_pool_with_split_size_list_cross_nodes",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith("tests/verl_suite/") and item.nodeid.endswith(SLOW):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="module")
def own_ray_cluster(request):
    """For a module that uses Ray: no shared cluster while it runs, the shared one (as tests/conftest.py starts it) after."""
    if not hasattr(request.module, "ray"):
        yield
        return
    shared = ray.is_initialized()
    if shared:
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()
    if shared:  # as tests/conftest.py's ray_cluster starts it
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "TOKENIZERS_PARALLELISM": "false"}
        ray.init(num_cpus=32, include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False)


@pytest.fixture(autouse=True)
def verl_test_environment(request, own_ray_cluster):
    """The environment as it was, after each test; the Ray workers a test starts import the repo's modules."""
    before = dict(os.environ)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [before.get("PYTHONPATH")])])
    yield
    if hasattr(request.module, "ray") and ray.is_initialized():
        ray.shutdown()  # a test that failed before its own ray.shutdown(): the next test's ray.init would fail
    os.environ.clear()
    os.environ.update(before)
