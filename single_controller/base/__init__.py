"""verl's ``single_controller.base`` import path: verl's ``Worker`` (compat/worker.py, the core's with verl's
methods; the core's is single_controller/base/worker.py)."""

from importlib import import_module

__all__ = ["Worker"]


def __getattr__(name: str):
    # Loaded on first use, so that importing a core submodule (register, dispatch, worker) imports no compat module
    if name == "Worker":
        return import_module("single_controller.compat.worker").Worker
    raise AttributeError(f"module 'single_controller.base' has no attribute {name!r}")
