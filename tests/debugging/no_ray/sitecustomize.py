"""On PYTHONPATH, hides Ray from the interpreter: a machine where Ray is not installed."""

import sys


class _NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, _NoRay())
