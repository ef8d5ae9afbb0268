"""The door's tests load verl's command lines: verl's adapter is installed for each of them."""

import pytest

from tests.conftest import speak
from verl_compat.cli import VERL


@pytest.fixture(autouse=True, scope="module")
def dialect():
    """Overrides the core's fixture of the same name (tests/conftest.py): verl's keys, spellings and refusals."""
    yield from speak(VERL)
