"""Fixtures for the data package tests: one thread (the machine is shared) and the built-in tokenizer."""

import pytest
import torch

from data.builtin import build_char_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_char_tokenizer()
