"""verl's ``verl.single_controller.base``: verl's ``Worker`` (worker.py) and ``@register`` (decorator.py)."""

from verl_compat.single_controller.base.worker import Worker

__all__ = ["Worker"]
