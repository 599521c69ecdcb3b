"""Writes that the backend may abort for a reason a retry fixes, re-run from the start."""

import functools
from typing import Any, Callable


def retried(method: Callable) -> Callable:
    """A write re-run from the start when the backend aborted its transaction for a reason a retry
    can fix (PostgreSQL: serialization failure, deadlock, the open-recommendation backstop, a lost
    connection); nothing of an aborted attempt was written. DuckDB runs it once."""

    @functools.wraps(method)
    def write(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.backend.retrying(lambda: method(self, *args, **kwargs), method.__name__)

    return write
