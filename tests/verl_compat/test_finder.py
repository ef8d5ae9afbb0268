"""The one rule, ``verl.X`` is ``verl_compat.X``: where verl is not installed, ``import verl.X`` gives the door's module
itself (one class per path), in a fresh interpreter (its imports are its own). Where verl is installed, Python's own
finders win: test_tool_files.py's second test."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HIDE_VERL = """
import importlib.machinery, sys
from tests.verl_compat.tool_files import _BlindToVerl
sys.meta_path[:] = [_BlindToVerl() if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""
PROBE = """
import importlib, json, sys
import verl_compat
out = {}
import verl.single_controller.base.worker as worker
from verl.single_controller.base import Worker
from verl.single_controller import Worker as TopWorker
import verl_compat.single_controller.base.worker as door_worker
out["module_is_the_doors"] = worker is door_worker
out["one_worker_class"] = Worker is TopWorker is door_worker.Worker and hasattr(Worker, "execute_func_rank_zero")
from verl import DataProto
from verl.protocol import DataProto as ProtocolDataProto
out["one_dataproto"] = DataProto is ProtocolDataProto is importlib.import_module("verl_compat.protocol").DataProto
from verl.single_controller.ray import RayWorkerGroup
from verl.single_controller.ray.base import RayWorkerGroup as BaseGroup
from verl.trainer.ppo.core_algos import compute_value_loss
out["one_group"] = RayWorkerGroup is BaseGroup
out["dataproto_module"] = DataProto.__module__
missing = []
for name in ("verl.no_such_module", "verl._finder", "verl.single_controller.no_such"):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing.append(str(exc))
out["missing"] = missing
print(json.dumps(out))
"""


def run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_without_verl_every_verl_path_is_the_doors_module_and_gives_one_class():
    out = run(HIDE_VERL + PROBE)
    assert out["module_is_the_doors"] and out["one_worker_class"] and out["one_dataproto"] and out["one_group"]
    assert out["dataproto_module"] == "verl_compat.protocol"
    assert out["missing"] == [
        "No module named 'verl.no_such_module'",
        "No module named 'verl._finder'",  # the door's own modules are not verl's
        "No module named 'verl.single_controller.no_such'",
    ]
