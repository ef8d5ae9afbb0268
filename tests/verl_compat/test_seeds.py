"""The seed tutorials (examples/, from ../shared/seeds) run against ColoRL and print what the seeds print."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples import seed_000_ray_api, seed_001_colocation, seed_002_notebook

ROOT = Path(__file__).resolve().parents[2]


def values(tensors) -> list[float]:
    return [t.item() for t in tensors]


def test_seed_000_chapter1_ray_actor(ray_cluster):
    assert seed_000_ray_api.chapter1() == (0, 10)


# the same API in make test: test_worker_api.py, test_worker_groups.py, the other seed tests
@pytest.mark.slow  # 16 worker processes on 2 cores: ~75 s
def test_seed_000_chapters2_and_3(ray_cluster):
    out = seed_000_ray_api.chapters2_and_3(use_gpu=False)
    assert values(out["add_1"]) == [1, 2, 3, 4]
    assert values(out["add_2"]) == [2, 3, 4, 5]
    assert values(out["add_3_merged"]) == [3, 4, 5, 6, 7, 8, 9, 10]
    assert out["world_sizes"] == (4, 4, 8)
    assert values(out["one_to_all_10"]) == [10 + rank for rank in range(8)]
    assert out["custom"] == [8, 10, 8, 10]
    assert out["rank_zero"] == 5


def test_seed_001_two_groups_keep_own_process_groups(ray_cluster):
    for grads in seed_001_colocation.two_groups(use_gpu=False).values():
        assert [world for _, _, world in grads] == [2, 2]
        assert torch.allclose(grads[0][1], grads[1][1])


def test_seed_001_colocated_workers(ray_cluster):
    actor_output, critic_output, fused = seed_001_colocation.colocated_workers(use_gpu=False)
    assert actor_output.batch["a"].tolist() == [0] * 5 + [1] * 5
    assert critic_output.batch["a"].tolist() == [-10] * 10
    assert len({info["pid"] for info in fused.execute_all_sync("whoami")}) == 2  # both roles in one process per rank
    views = fused.spawn(["actor", "critic"])
    assert not hasattr(views["actor"], "sub") and not hasattr(views["critic"], "add")


def test_seed_002_notebook(ray_cluster):
    squares, work = seed_002_notebook.tasks_and_nested_actors()
    assert squares == [i * i for i in range(10)] and work == "Work done by child"
    added, one_to_all = seed_002_notebook.worker_groups(use_gpu=False)
    assert values(added) == [1, 4] and values(one_to_all) == [10, 11]


@pytest.mark.slow  # the same seeds as the tests above, as scripts in fresh processes: ~25 s each
@pytest.mark.parametrize("script", ["seed_002_notebook.py", "seed_001_colocation.py"])
def test_example_scripts_run(script):
    result = subprocess.run(
        [sys.executable, "-m", f"examples.{script.removesuffix('.py')}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = {"seed_002_notebook.py": "Work done by child", "seed_001_colocation.py": "tensor([-10., -10."}[script]
    assert expected in result.stdout
