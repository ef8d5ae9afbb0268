"""Fixtures of the trainer tests."""

import pytest

from tests.trainer.report_fixtures import rollout_step
from tests.workers.agent_helpers import chat_tokenizer, peaked_model


@pytest.fixture(scope="session")
def chat_tokenizer_():
    return chat_tokenizer()


@pytest.fixture(scope="session")
def rollout(chat_tokenizer_):
    """One GRPO step of real multi-turn rollout rows (report_fixtures.rollout_step): (batch, prompts, extras)."""
    return rollout_step(chat_tokenizer_, peaked_model(chat_tokenizer_))
