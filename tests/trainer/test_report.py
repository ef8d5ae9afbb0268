"""The run report: one self-contained file, small and quick to write, that a real headless browser renders: plots,
warnings, and a multi-turn sample with its masked tool turn (tests/trainer/report_fixtures.py)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser

import pytest

from config import engine
from planner import load_config
from trainer.observing.generations import GenerationLog, write_generations
from trainer.observing.report import RunReport, preset_diff, write_report

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",  # the page's console (a script error) goes to stderr
]
WARNING = ("entropy_collapse", 40, "the policy's entropy has collapsed: … while the training score has stalled")


def metrics(steps: int) -> list[dict]:
    rng = random.Random(0)
    out = []
    for t in range(1, steps + 1):
        record = {
            "step": t,
            "critic/score/mean": 0.3 + rng.gauss(0, 0.02),
            "actor/entropy": 3 * math.exp(-t / 10),
            "response_length/mean": 50 + t,
            "response_length/clip_ratio": 0.1,
            "actor/pg_loss": rng.gauss(0, 0.1),
            "health/warning/entropy_collapse": float(t >= WARNING[1]),
        }
        if t % 20 == 0:
            record["val-core/colorl/arith/reward/mean@1"] = 0.4
        out.append(record)
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory, chat_tokenizer_, rollout):
    """A report of 60 logged steps, with the multi-turn rollout's samples at steps 20, 40, 60 and a validation."""
    tmp = tmp_path_factory.mktemp("report")
    tokenizer, (batch, prompts, extras) = chat_tokenizer_, rollout
    cfg = load_config([f"trainer.default_local_dir={tmp}", "trainer.total_training_steps=60"])
    log = GenerationLog(cfg.trainer, tokenizer)
    for step in (20, 40, 60):
        log.training_step(batch, prompts, extras, step)
    log.validation([(batch, prompts, extras)], 60, None)
    return RunReport(cfg).write(metrics(60), {WARNING[0]: WARNING[1:]})


def test_the_report_is_one_self_contained_file(report):
    html = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched: no network, no CDN
    assert "<link" not in html and "<script src" not in html and "@import" not in html
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)[1])
    assert sorted(data["samples"]["train"]) == ["20", "40", "60"] and list(data["samples"]["val"]) == ["60"]
    assert data["preset"] == "demo" and [row[0] for row in data["diff"]] == [
        "trainer.total_training_steps",
        "trainer.default_local_dir",
    ]
    assert data["warnings"] == [{"name": "entropy_collapse", "step": 40, "message": WARNING[2]}]


def test_sample_text_cannot_break_out_of_the_page(tmp_path):
    cfg = load_config([f"trainer.default_local_dir={tmp_path}"])
    write_generations(
        tmp_path / "samples" / "train", 1, [{"input": "</script><script>alert(1)</script>", "output": "/*SCRIPT*/"}]
    )
    html = write_report(metrics(2), cfg).read_text()
    assert html.count("</script>") == 2 and "alert(1)" in html  # the data block's and the script's ends only
    assert html.count("/*SCRIPT*/") == 1  # inside the data, not replaced by the script


def test_a_200_step_smollm2_sized_run_stays_under_5_mb_and_writes_within_a_second(tmp_path):
    """SmolLM2's arithmetic preset: 8 prompts × 4 responses of up to 64 tokens a step, prompts of ~80 tokens (a
    system message and a worked example), validation of 64 problems every 10 steps; ~90 metrics a step."""
    cfg = load_config([f"trainer.default_local_dir={tmp_path}"])
    rng = random.Random(0)
    system = "You are a careful assistant. Solve the problem step by step and end with '#### N'. " * 4

    def sample(step: int, i: int) -> dict:
        tokens = [rng.choice([" the", " 12", " +", " =", "\n", " ####", " answer"]) for _ in range(64)]
        return {
            "input": f"{system}Problem {step}.{i // 4}: what is {step} + {i}?",
            "output": "".join(tokens),
            "gts": str(step + i),
            "score": 1.0,
            "step": step,
            "reward": 1.0,
            "response_length": 64,
            "clipped": False,
            "token_ids": [rng.randrange(49152) for _ in tokens],
            "tokens": tokens,
            "trained": [1] * 64,
            "advantages": [round(rng.gauss(0, 1), 4)] * 64,
            "log_probs": [round(-rng.expovariate(2), 4) for _ in tokens],
        }

    for step in range(1, 201):
        write_generations(tmp_path / "samples" / "train", step, [sample(step, i) for i in range(8)])
        if step % 10 == 0:
            write_generations(tmp_path / "samples" / "val", step, [sample(step, i) for i in range(8)])
    records = [{"step": s} | {f"metric/{k}": rng.random() for k in range(90)} for s in range(201)]
    report = RunReport(cfg, compare_presets=False)
    report.write(records[:191])  # the run's report at step 190's validation
    for step in range(191, 201):
        write_generations(tmp_path / "samples" / "train", step, [sample(step, i) for i in range(8)])
    start = time.perf_counter()
    path = report.write(records)  # at the end: it reads the new steps' samples only
    assert time.perf_counter() - start < 1.0
    assert path.stat().st_size < 5_000_000
    assert write_report(records, cfg).read_text() == path.read_text()  # the same as written afresh


def test_writing_a_steps_dump_and_samples_takes_well_under_a_second(tmp_path, chat_tokenizer_, rollout):
    tokenizer, (batch, prompts, extras) = chat_tokenizer_, rollout
    cfg = load_config([f"trainer.default_local_dir={tmp_path}", f"trainer.rollout_data_dir={tmp_path / 'dump'}"])
    big = type(batch).concat([batch] * 8)  # 32 rows of up to 200 tokens, as a SmolLM2 step has
    log = GenerationLog(cfg.trainer, tokenizer)
    start = time.perf_counter()
    log.training_step(big, tuple(p.repeat(8, 1) for p in prompts), {k: v * 8 for k, v in extras.items()}, 1)
    assert time.perf_counter() - start < 1.0


# ---- a real browser ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium():
    """Debian's chromium (make test installs it where missing); in CI its absence is a failure, not a skip."""
    path = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if path is None:
        message = "no chromium: `apt-get install chromium` (make test does)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    return path


def open_in_browser(chromium: str, url: str, profile, *flags: str) -> subprocess.CompletedProcess:
    args = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags, url]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


class Dom(HTMLParser):
    """The elements of a dumped page as (tag, attributes, text inside, the classes of the elements around it)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[list] = []
        self.open: list[list] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        element = [tag, dict(attrs), "", [o[1].get("class", "") for o in self.open]]
        self.elements.append(element)
        if tag not in ("path", "circle", "line", "rect", "input", "meta", "br", "option"):
            self.open.append(element)

    def handle_endtag(self, tag):
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for element in self.open:
            element[2] += data

    def find(self, tag: str, **attrs: str) -> list[list]:
        return [e for e in self.elements if e[0] == tag and all(e[1].get(k) == v for k, v in attrs.items())]


def test_a_browser_shows_the_plots_warnings_and_a_tool_turns_masked_tokens(report, chromium, tmp_path):
    url = report.as_uri() + "#kind=train&step=40&filter=multiturn"  # the step picker, as a link to it
    done = open_in_browser(chromium, url, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=3000")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Uncaught" not in done.stderr, [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    dom = Dom(done.stdout)
    # the plots: the training score is a drawn line through every step, the warning a band on the entropy plot
    (score,) = dom.find("path", **{"data-key": "critic/score/mean"})
    assert score[1]["d"].count("L") == 59
    assert dom.find("rect", **{"class": "warnband", "data-warning": "entropy_collapse"})
    assert "entropy_collapse (from step 40)" in dom.find("div", **{"class": "warning"})[0][2]
    # the step picker shows step 40's tool-calling samples: each a model turn, a masked tool turn, a model turn
    cards = dom.find("div", **{"class": "sample"})
    assert cards and {c[1]["data-step"] for c in cards} == {"40"}
    tool_turns = dom.find("div", **{"class": "turn tool"})
    assert len(tool_turns) == len(cards) == 2
    masked = [e for e in dom.find("span", **{"class": "tok masked"}) if "turn tool" in e[3]]
    assert "42" in "".join(e[2] for e in masked)  # the calculator's answer, in tokens training did not see
    assert all("turn model" in e[3] for e in dom.find("span", **{"class": "tok trained"}))
    assert "#### 42" in "".join(e[2] for e in dom.find("div", **{"class": "turn model"}))


def test_a_screenshot_of_the_report_is_not_blank(report, chromium, tmp_path):
    shot = tmp_path / "report.png"
    done = open_in_browser(
        chromium, report.as_uri(), tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,900"
    )
    assert done.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # text, plots and colours; a blank page compresses to a few kB


def test_the_config_is_compared_with_the_closest_preset():
    name, diff = preset_diff(load_config(["trainer.total_training_steps=5", "data.train_batch_size=32"]))
    assert name == "demo" and diff == [("data.train_batch_size", 16, 32), ("trainer.total_training_steps", 700, 5)]
    name, diff = preset_diff(load_config(["trainer.test_freq=3"], config_name="smollm2_tools"))
    assert name == "smollm2_tools" and diff == [("trainer.test_freq", 10, 3)]


def test_comparing_with_the_presets_says_no_engine_choice(monkeypatch, capsys):
    """The SmolLM2 presets ask for ``rollout.name=auto``; composing them only to compare (a run on ``hf``, the
    demo) must not print an engine choice the run never made."""
    monkeypatch.setattr(engine, "_said", set())
    preset_diff(load_config([]))
    assert "rollout.name=auto" not in capsys.readouterr().err


def test_a_disabled_report_writes_nothing(tmp_path):
    cfg = load_config([f"trainer.default_local_dir={tmp_path}", "trainer.report.enable=false"])
    assert write_report(metrics(2), cfg) is None and not (tmp_path / "report.html").exists()


def test_a_report_the_disk_refuses_leaves_the_previous_one_and_the_run_goes_on(tmp_path, capsys):
    cfg = load_config([f"trainer.default_local_dir={tmp_path}"])
    first = write_report(metrics(2), cfg).read_text()
    (tmp_path / "report.html.tmp").mkdir()  # the staging file cannot be written
    assert write_report(metrics(3), cfg) is None and (tmp_path / "report.html").read_text() == first
    assert "cannot write the run report" in capsys.readouterr().err
