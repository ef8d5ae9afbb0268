"""verl's tool module paths for tool files written against verl, when the verl package is not installed.

A tool file written for verl 0.9 imports ``verl.tools.base_tool.BaseTool``, ``verl.tools.schemas``
(``OpenAIFunctionToolSchema``, ``ToolResponse``, ...), ``verl.tools.function_tool.function_tool`` and
``verl.utils.rollout_trace.rollout_trace_op``. ``install()`` puts a finder at the *end* of ``sys.meta_path``
that answers for exactly those names with ColoRL's classes, so such a file runs unchanged without verl:

- Python's own finders come first: where verl is installed, ``import verl`` finds it and the file gets verl's
  own classes (the registry accepts them); this finder then never answers, not even for a name the real verl
  lacks, so the two are never mixed.
- Installing the finder imports nothing; ColoRL imports verl only where a user's file does.
- Any other ``verl.*`` name stays missing: the file fails to load with Python's ``No module named ...``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

PACKAGES = ("verl", "verl.tools", "verl.utils")
# module -> (ColoRL module, {verl's name: ColoRL's name})
MODULES = {
    "verl.tools.base_tool": (
        "workers.tools.base",
        {
            "BaseTool": "BaseTool",
            "OpenAIFunctionToolSchema": "ToolSchema",
            "ToolResponse": "ToolResponse",
            "rollout_trace_op": "rollout_trace_op",
        },
    ),
    "verl.tools.schemas": (
        "workers.tools.base",
        {
            "OpenAIFunctionToolSchema": "ToolSchema",
            "OpenAIFunctionSchema": "FunctionSchema",
            "OpenAIFunctionParametersSchema": "ParametersSchema",
            "OpenAIFunctionPropertySchema": "PropertySchema",
            "ToolResponse": "ToolResponse",
        },
    ),
    "verl.tools.function_tool": ("workers.tools.registry", {"function_tool": "function_tool"}),
    "verl.utils.rollout_trace": ("workers.tools.base", {"rollout_trace_op": "rollout_trace_op"}),
}
MARK = "__colorl_provides_verl__"


class _VerlPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in PACKAGES and name not in MODULES:
            return None
        if name != "verl" and not provided():  # a real verl is imported: never answer for it
            return None
        return importlib.util.spec_from_loader(name, self, is_package=name in PACKAGES)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        setattr(module, MARK, True)
        if module.__name__ in MODULES:
            source, names = MODULES[module.__name__]
            colorl = importlib.import_module(source)
            for verl_name, colorl_name in names.items():
                setattr(module, verl_name, getattr(colorl, colorl_name))


def install() -> None:
    """Add the finder once per process (after Python's own, so an installed verl always wins)."""
    if not any(isinstance(finder, _VerlPaths) for finder in sys.meta_path):
        sys.meta_path.append(_VerlPaths())


def provided() -> bool:
    """Whether the ``verl`` imported in this process is ColoRL's stand-in (False: the real one, or none yet)."""
    return bool(getattr(sys.modules.get("verl"), MARK, False))


def real_verl_module(name: str) -> ModuleType | None:
    """The real verl's module ``name`` if a user's file has imported it (never imports anything)."""
    module = sys.modules.get(name)
    return module if module is not None and not getattr(module, MARK, False) else None
