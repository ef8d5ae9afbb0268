"""``algos.host_sync.HOST_SYNCS`` is the one list of host reads in ColoRL's loops: every entry has a reason and is
read somewhere, and every read names an entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from algos.host_sync import HOST_SYNCS, READS, host_read

pytestmark = pytest.mark.fake_cuda

ROOT = Path(__file__).resolve().parents[2]
CALL = re.compile(r'host_read\(\s*"([^"]+)"')


def _reads_in_source() -> set[str]:
    names = set()
    for folder in ("algos", "workers", "single_controller"):
        for path in (ROOT / folder).rglob("*.py"):
            names.update(CALL.findall(path.read_text()))
    return names


def test_every_listed_read_is_made_and_every_read_is_listed():
    assert _reads_in_source() == set(HOST_SYNCS)
    assert all(reason.strip() for reason in HOST_SYNCS.values())


def test_host_read_names_an_entry_and_meta_reads_the_given_value():
    with pytest.raises(KeyError, match="not listed"):
        host_read("nowhere.unlisted", torch.ones(()), meta_value=1)
    before = READS["update.grad_norm_finite"]
    assert host_read("update.grad_norm_finite", torch.tensor(True), meta_value=False) is True
    assert host_read("update.grad_norm_finite", torch.ones((), device="meta"), meta_value=False) is False
    assert READS["update.grad_norm_finite"] == before + 2
