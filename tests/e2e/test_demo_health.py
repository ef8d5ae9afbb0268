"""The default demo (``make run``: 700 GRPO steps on 2 CPU workers), run whole: a healthy run, so no health warning
fires, and its report holds every validation's samples. The warnings' logic against demo-shaped and unhealthy runs
is tests/trainer/test_health.py (seconds); this is the real thing (minutes)."""

import json
import re

import pytest

from planner import load_config
from trainer.running.build import build_trainer


@pytest.mark.slow  # the whole demo: about 3 minutes on 2 quiet cores
def test_the_default_demo_is_healthy_and_reported(ray_cluster, tmp_path):
    cfg = load_config([f"trainer.default_local_dir={tmp_path}", "trainer.logger=[file]"])
    trainer = build_trainer(cfg)
    trainer.init_workers()
    trainer.fit()
    assert trainer.health.fired == {}
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert not any(v for r in records for k, v in r.items() if k.startswith("health/warning/"))
    html = (tmp_path / "report.html").read_text()
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', html, re.S)[1])
    assert sorted(map(int, data["samples"]["val"])) == list(range(0, 701, 20)) and data["warnings"] == []
