"""The error a call raises when its arguments break a precondition of the single controller's API."""

__all__ = ["ContractError"]


class ContractError(ValueError, AssertionError):
    """Arguments that break a documented precondition (sizes that differ, a key that would be overwritten, ...).

    It is a ``ValueError``, as every argument check in ColoRL is, and an ``AssertionError`` as well, because
    verl ``assert``s the same preconditions: code written against verl that catches ``AssertionError`` (its
    own tests do) sees the same failure here.
    """
