"""A reward judge over HTTP on loopback, its clients, and the demo's step time with it against the rule reward.

    python -m benchmarks.judge [--delay 0.2] [--steps 8] [--concurrent 8] [main.py overrides ...]

The judge (``serve``) answers ``POST /`` with ``{"data_source", "solution_str", "ground_truth"}`` by the rule
reward (``data.tasks.default_compute_score``) after ``delay`` seconds: the same score as the rule, at an LLM
judge's pace. ``judge_score`` (sync, urllib) and ``async_judge_score`` (aiohttp) are ``compute_score`` functions
that ask the judge at ``$COLORL_JUDGE_URL`` (``reward.custom_reward_function.path=benchmarks/judge.py``, ``name``
one of them). The benchmark runs ``python main.py`` (the demo) ``--steps`` steps once per run: the rule reward, the
rule as a user's function (``rule_score``: through the killable pool every user function runs in), then the judge
with ``naive``, ``rate_limited`` (``reward.max_concurrent=--concurrent``) and ``remote``
(``reward.num_workers=--concurrent``), and prints JSON: each run's median ``timing_s/step`` and ``timing_s/reward``
(steps 2 onwards) and their ratio to the rule's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

URL_VAR = "COLORL_JUDGE_URL"
Fate = Callable[[dict], str]  # a request's body -> "ok", "error" (HTTP 500), "hang" (no answer) or "nonsense"


class _Judge(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        fate = self.server.fate(body)
        if fate == "hang":  # never answers (the client's timeout or the manager's ends the call)
            time.sleep(3600)
        time.sleep(self.server.delay)
        if fate == "error":
            self.send_error(500, "judge overloaded")
            return
        if fate == "nonsense":
            answer = {"score": "a fine answer"}
        else:
            from data.tasks import default_compute_score

            result = default_compute_score(body["data_source"], body["solution_str"], body["ground_truth"])
            answer = result if isinstance(result, dict) else {"score": float(result)}  # a task's dict: as it is
        payload = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:  # quiet: one line a request would flood the run's output
        pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the listen backlog: http.server's 5 drops concurrent connections (a 1 s retry each)


def serve(delay: float, fate: Fate = lambda body: "ok") -> tuple[ThreadingHTTPServer, str]:
    """Start the judge on a free loopback port in a daemon thread; the server (``shutdown()`` stops it) and URL."""
    server = _Server(("127.0.0.1", 0), _Judge)
    server.daemon_threads, server.delay, server.fate = True, delay, fate
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _body(data_source: Any, solution_str: str, ground_truth: Any) -> dict:
    return {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth}


def judge_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict | None = None, url: str | None = None
) -> Any:
    """The judge's answer for one response (sync: one blocking HTTP request; raises on an error status)."""
    request = urllib.request.Request(
        url or os.environ[URL_VAR],
        data=json.dumps(_body(data_source, solution_str, ground_truth)).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def rule_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> Any:
    """The rule reward as a user's function: each call goes through the killable pool (``data.reward_pool``), what
    the ``rule_pool`` run prices against the rule called inline."""
    from data.tasks import default_compute_score

    return default_compute_score(data_source, solution_str, ground_truth)


async def async_judge_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> Any:
    """``judge_score`` as a coroutine (aiohttp), for ``rate_limited``."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.post(os.environ[URL_VAR], json=_body(data_source, solution_str, ground_truth)) as response:
            response.raise_for_status()
            return await response.json()


RUNS = {  # name -> overrides; {c}: --concurrent
    "rule": [],
    "rule_pool": ["reward.custom_reward_function.name=rule_score"],
    "naive": ["reward.custom_reward_function.name=judge_score"],
    "rate_limited": [
        "reward.custom_reward_function.name=async_judge_score",
        "reward.reward_manager.name=rate_limited",
        "+reward.max_concurrent={c}",
    ],
    "remote": [
        "reward.custom_reward_function.name=judge_score",
        "reward.reward_manager.name=remote",
        "reward.num_workers={c}",
    ],
}


def _step_times(overrides: list[str], steps: int) -> dict[str, float]:
    """Median timing_s/step and timing_s/reward of a demo run (steps 2 onwards: the first compiles and warms)."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, "main.py", f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
                   "trainer.save_freq=-1", "trainer.val_before_train=false", f"trainer.default_local_dir={run_dir}",
                   "trainer.logger=[file]", *overrides]  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        records = [json.loads(line) for line in next(Path(run_dir).rglob("metrics.jsonl")).read_text().splitlines()]
    records = [r for r in records if "timing_s/step" in r][1:]
    return {key: statistics.median(r[key] for r in records) for key in ("timing_s/step", "timing_s/reward")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the judge takes a response")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated, of: " + ", ".join(RUNS))
    args, overrides = parser.parse_known_args(argv)
    server, url = serve(args.delay)
    os.environ[URL_VAR] = url  # the runs' processes, Ray's workers included, inherit it
    judge = [f"reward.custom_reward_function.path={Path(__file__).resolve()}"]
    out: dict[str, Any] = {"delay_s": args.delay, "concurrent": args.concurrent, "overrides": overrides}
    for name in args.runs.split(","):
        extra = [o.format(c=args.concurrent) for o in RUNS[name]]
        out[name] = _step_times([*overrides, *(judge if extra else []), *extra], args.steps)
        if "rule" in out:
            out[name]["step_vs_rule"] = round(out[name]["timing_s/step"] / out["rule"]["timing_s/step"], 2)
        print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)
    server.shutdown()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
