"""How verl's extra API (single_controller/compat/) reaches the core classes without the core importing it.

The core classes (``DataProto``, ``Worker``, ``RayWorkerGroup``, ``RayClassWithInitArgs``) hold what the trainer
uses. verl's further methods are written as plain classes in compat/ and copied onto a core class, once, by the
module that is verl's import path for that class (single_controller/__init__.py, single_controller/ray/__init__.py),
so the dependency points one way: compat/ and those modules know the core, the core knows neither.
"""

from __future__ import annotations


def add_methods(cls: type, extra: type) -> None:
    """Give ``cls`` every method, property and class/static method that ``extra`` defines (not what it inherits;
    no dunder names: those are the class machinery's).

    A name ``cls`` already has is refused: an extra method never replaces a core one. Adding ``extra`` a second
    time is a no-op. ``extra``'s methods must not use zero-argument ``super()`` (they are not in ``cls``'s MRO).
    """
    added = cls.__dict__.get("_colorl_extensions", ())
    if extra in added:
        return
    new = {name: value for name, value in vars(extra).items() if not name.startswith("__")}
    clash = sorted(name for name in new if hasattr(cls, name))
    if clash:
        raise TypeError(f"{extra.__name__} would replace {cls.__name__}'s {clash}")
    for name, value in new.items():
        setattr(cls, name, value)
    cls._colorl_extensions = (*added, extra)


def extensions(cls: type) -> tuple[type, ...]:
    """The classes whose methods ``add_methods`` gave ``cls``, in order."""
    return cls.__dict__.get("_colorl_extensions", ())
