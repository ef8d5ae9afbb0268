"""On PYTHONPATH, makes the interpreter a bare PyTorch image: Ray, ``datasets`` (with pandas, dill, multiprocess,
xxhash), matplotlib (with pillow) and the packages that only optional imports load are not installed, as far as
imports can tell (``import`` fails, ``find_spec`` is None).

``COLORL_BARE_REPORT=DIR`` writes, at exit, ``DIR/<pid>.json``: the distributions of every module the process
imported, with their versions (what such an image must have; docs/gpu.md). ``COLORL_BARE_HIDE=a,b`` hides more
top-level modules.
"""

import atexit
import importlib.machinery
import importlib.metadata
import json
import os
import sys

HIDDEN = frozenset(
    {"ray", "datasets", "pandas", "dill", "multiprocess", "xxhash", "matplotlib", "PIL", "cloudpickle", "dateutil"}
    # imported where installed, by torch, transformers or huggingface_hub
    | {"attr", "google", "sentencepiece", "sniffio", "tabulate", "triton"}
)
HIDDEN |= frozenset(filter(None, os.environ.get("COLORL_BARE_HIDE", "").split(",")))  # more, to see if they are needed


class _NotInstalled(importlib.machinery.PathFinder):
    """The path finder, blind to the hidden packages."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [_NotInstalled if f is importlib.machinery.PathFinder else f for f in sys.meta_path]


def _report(folder: str) -> None:
    owners = importlib.metadata.packages_distributions()
    names = [name for name, module in list(sys.modules.items()) if not _in_project(getattr(module, "__file__", None))]
    used = {dist for name in names for dist in owners.get(name.partition(".")[0], ())}
    versions = {dist: importlib.metadata.version(dist) for dist in sorted(used)}
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
        json.dump(versions, f, indent=1)


def _in_project(path: str | None) -> bool:
    """A file of the repository, whose ``tests`` or ``data`` an installed wheel may also name (verl's has ``tests``);
    not one of its virtual environment's."""
    path = os.path.abspath(path or "")
    return path.startswith(PROJECT + os.sep) and f"{os.sep}site-packages{os.sep}" not in path


PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("COLORL_BARE_REPORT"):
    atexit.register(_report, os.environ["COLORL_BARE_REPORT"])
