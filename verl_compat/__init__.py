"""The door to verl: verl's module ``verl.X`` is ``verl_compat.X``.

Code written against verl (0.9's names, and the seed tutorials' older ones) imports from here with the prefix
changed: ``from verl_compat import DataProto``, ``from verl_compat.single_controller.base.worker import Worker``,
``from verl_compat.trainer.ppo.core_algos import compute_value_loss``. Each verl path gives one class, verl's: the
core's (single_controller/, algos/, workers/tools/) with what only verl code uses. The core never imports this
package; what it supports and how: docs/verl_api.md.

Importing it also installs a finder (``_finder.py``) so that, where the verl package is not installed,
``import verl.X`` itself gives ``verl_compat.X``: a tool file or ported code runs with its imports unchanged.
Where verl is installed, ``import verl`` gets verl.

It also gives the core's padding switch (single_controller/padding.py) verl's names: a batch's
``meta_info["_verl_auto_padding"]``, which ``DataProto.from_dict(..., auto_padding=...)`` then writes, and
``VERL_AUTO_PADDING`` in the environment, each honoured after ColoRL's own.
"""

from importlib import import_module

from single_controller.padding import add_spelling
from verl_compat._finder import install

install()
add_spelling("_verl_auto_padding", "VERL_AUTO_PADDING")

__all__ = ["DataProto"]


def __getattr__(name: str):
    # loaded on first use: `import verl_compat.cli` needs neither torch nor the protocol
    if name == "DataProto":
        return import_module("verl_compat.protocol").DataProto
    raise AttributeError(f"module 'verl_compat' has no attribute {name!r}")
