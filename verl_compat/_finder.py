"""``import verl.X`` gives ``verl_compat.X`` where the verl package is not installed.

``install()`` puts a finder at the *end* of ``sys.meta_path``, so that code written against verl (a tool file, a
ported worker) runs unchanged without verl:

- Python's own finders come first: where verl is installed, ``import verl`` finds it and the code gets verl's own
  classes (ColoRL accepts them where it takes verl's, e.g. a tool's base class); this finder then never answers,
  not even for a name the real verl lacks, so the two are never mixed.
- Every verl path gives one class: a module ``verl.X`` *is* the module ``verl_compat.X`` (the same object in
  ``sys.modules`` under both names). A package ``verl.X`` is a module of its own whose attributes are those of
  ``verl_compat.X`` (its ``__path__`` is empty, so that its submodules come through this finder too, never loaded
  twice from the door's files).
- Installing the finder imports nothing; the door's modules load when code imports them.
- A name with no module in the door (or a private one, ``_x``) stays missing: ``No module named ...``, as Python says.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

REAL, DOOR = "verl", "verl_compat"
MARK = "__verl_compat_serves__"  # on each package this finder made: the verl name it serves


def door_name(name: str) -> str | None:
    """``verl_compat.X`` for ``verl.X``; None for other names and the door's private modules."""
    if name != REAL and not name.startswith(REAL + "."):
        return None
    rest = name[len(REAL) :]
    if any(part.startswith("_") for part in rest.split(".")[1:]):
        return None
    return DOOR + rest


class _VerlPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        door = door_name(name)
        if door is None or (name != REAL and not provided()):  # a real verl is imported: never answer for it
            return None
        try:
            spec = importlib.util.find_spec(door)
        except ModuleNotFoundError:  # a parent the door lacks
            return None
        if spec is None:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=spec.submodule_search_locations is not None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        door = importlib.import_module(door_name(spec.name))
        if spec.submodule_search_locations is None:
            return door  # a module: the door's own object, so each class exists once
        return None  # a package: the default module object, filled in by exec_module

    def exec_module(self, module: ModuleType) -> None:
        if door_name(module.__name__) is None:  # a door module handed out as it is (named verl_compat.X)
            return
        door = importlib.import_module(door_name(module.__name__))
        module.__doc__ = door.__doc__
        if hasattr(door, "__all__"):
            module.__all__ = list(door.__all__)
        module.__getattr__ = lambda attr: getattr(door, attr)
        module.__path__ = []  # its submodules come through this finder as well
        setattr(module, MARK, module.__name__)


def install() -> None:
    """Add the finder once per process (after Python's own, so an installed verl always wins)."""
    if not any(isinstance(finder, _VerlPaths) for finder in sys.meta_path):
        sys.meta_path.append(_VerlPaths())


def provided() -> bool:
    """Whether the ``verl`` imported in this process is the door (False: the real one, or none yet)."""
    return getattr(sys.modules.get(REAL), MARK, None) is not None
