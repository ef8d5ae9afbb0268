"""verl's ``single_controller.base`` import path: ``Worker`` (single_controller/base/worker.py)."""

from importlib import import_module

__all__ = ["Worker"]


def __getattr__(name: str):
    # Loaded on first use, so that importing a submodule (decorator, dispatch) never waits on worker.py
    if name == "Worker":
        return import_module("single_controller.base.worker").Worker
    raise AttributeError(f"module 'single_controller.base' has no attribute {name!r}")
