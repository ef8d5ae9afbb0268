"""verl's ``verl.tools``: the tool interface a tool file written for verl imports, ColoRL's classes under verl's names
(the classes: workers/tools/base.py and registry.py).

Importing it also makes ColoRL's tool loader take verl's own tool classes, verl's ``@function_tool`` registry and
verl's former built-in tool names (``_family.py``)."""

from verl_compat.tools import _family

_family.install()
