"""verl's profilers (Nsight, the NPU and torch profilers, memory snapshots, the precision debugger): not in ColoRL.

Accepted with verl's defaults so a verl command line loads; enabling one warns once (``cli.inert``): ColoRL's
timing is the one line per phase of every step and ``benchmarks/`` (py-spy, the memory estimate).
"""

from __future__ import annotations

from typing import Any, ClassVar

from config.tree import InertTree

_TOOL = "verl.utils.profiler.config."
_PRECISION_DEBUGGER = {
    "_target_": _TOOL + "PrecisionDebuggerToolConfig",
    "config_path": None,
    "steps": None,
    "stages": None,
    "strict": False,
}
_COMMON = {
    "_target_": "verl.utils.profiler.ProfilerConfig",
    "tool": None,
    "enable": False,
    "all_ranks": False,
    "ranks": [],
    "save_path": "outputs/profile",
    "relocate_results": False,
    "finish_hook_cmd": None,
    "finish_hook_all_ranks": False,
    "finish_hook_ranks": [],
}


class ProfilerTree(InertTree):
    """A trained or reference role's ``profiler``."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        **_COMMON,
        "tool_config": {
            "nsys": {"_target_": _TOOL + "NsightToolConfig", "discrete": False},
            "npu": {
                "_target_": _TOOL + "NPUToolConfig",
                "contents": [],
                "level": "level0",
                "analysis": True,
                "discrete": False,
            },
            "torch": {
                "_target_": _TOOL + "TorchProfilerToolConfig",
                "contents": [],
                "discrete": False,
                "schedule": {
                    "_target_": _TOOL + "TorchProfilerScheduleConfig",
                    "skip_first": 0,
                    "wait": 0,
                    "warmup": 0,
                    "active": 0,
                    "repeat": 0,
                },
            },
            "torch_memory": {
                "_target_": _TOOL + "TorchMemoryToolConfig",
                "trace_alloc_max_entries": 100000,
                "stack_depth": 32,
                "memory_snapshot_num_steps": 1,
            },
            "precision_debugger": _PRECISION_DEBUGGER,
        },
    }


class RolloutProfilerTree(InertTree):
    """The rollout's ``profiler`` (per-token ranges of the inference engine)."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        **_COMMON,
        "tool_config": {
            "npu": {
                "_target_": _TOOL + "NPUToolConfig",
                "contents": [],
                "level": "level0",
                "analysis": True,
                "discrete": False,
                "profile_token_start": None,
                "profile_token_end": None,
            },
            "torch": {
                "_target_": _TOOL + "TorchProfilerToolConfig",
                "contents": [],
                "discrete": False,
                "profile_token_start": None,
                "profile_token_end": None,
            },
            "precision_debugger": _PRECISION_DEBUGGER,
        },
    }


class GlobalProfilerTree(InertTree):
    """``global_profiler``: which steps the role profilers record, and the tools' global options."""

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "_target_": "verl.utils.profiler.ProfilerConfig",
        "tool": None,
        "steps": None,
        "profile_continuous_steps": False,
        "save_path": "outputs/profile",
        "relocate_results": False,
        "finish_hook_cmd": None,
        "finish_hook_all_ranks": False,
        "finish_hook_ranks": [],
        "global_tool_config": {
            "nsys": {
                "_target_": _TOOL + "NsightToolConfig",
                "discrete": False,
                "controller_nsight_options": {
                    "trace": "cuda,nvtx,cublas,ucx",
                    "cuda-memory-usage": "true",
                    "cuda-graph-trace": "graph",
                },
                "worker_nsight_options": {
                    "trace": "cuda,nvtx,cublas,ucx",
                    "cuda-memory-usage": "true",
                    "cuda-graph-trace": "graph",
                    "capture-range": "cudaProfilerApi",
                    "capture-range-end": None,
                    "kill": "none",
                },
            },
            "torch_memory": {
                "trace_alloc_max_entries": 100000,
                "stack_depth": 32,
                "memory_snapshot_num_steps": 1,
                "context": "all",
                "stacks": "all",
                "kw_args": {},
            },
            "precision_debugger": _PRECISION_DEBUGGER,
        },
    }
