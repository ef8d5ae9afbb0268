"""The benchmark tests' shared assets directory (the demo's weights, built once per module)."""

import pytest


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("bench-assets"))
