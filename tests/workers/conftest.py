"""Fixtures for the worker tests: one tiny random Llama checkpoint for the whole session."""

import pytest
import torch

from tests.workers.helpers import build_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(autouse=True)
def _one_thread():
    """The test machine is shared: keep every in-process test on one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
