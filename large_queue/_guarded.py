"""Guarded writes that survive timeouts without ever being repeated blindly.

A guarded write sets absolute values on one record, and only while its guard
holds ("I still hold the lock", "I still own the queue at this epoch").
Applying it twice is the same as once, and once the guard fails it applies
no more, so a write that timed out is simply tried again. The only case
nobody can settle is an attempt that timed out *in doubt* followed by one
whose guard failed: the first may have applied (and released the guard) or
the guard may have been broken by someone else. That case is reported as
unknown, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from large_queue import errors
from large_queue.backends import Backend, Operation, RecordKey
from large_queue.backends.conditions import Condition

#: tries of a guarded write that times out
ATTEMPTS = 3


def guarded_write(
    backend: Backend,
    key: RecordKey,
    operations: Sequence[Operation],
    guard: Condition,
    *,
    lost: Callable[[], errors.LargeQueueError],
    unknown: Callable[[errors.BackendTimeoutError], errors.LargeQueueError],
    sent: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Apply ``operations`` while ``guard`` holds; what their reads returned.

    Raises ``lost()`` if the guard does not hold and ``unknown()`` if nobody
    can tell; calls ``sent()`` for every attempt (a command sent).
    """
    in_doubt: errors.BackendTimeoutError | None = None
    for attempt in range(1, ATTEMPTS + 1):
        sent()
        try:
            return backend.operate(key, operations, condition=guard)
        except errors.BackendTimeoutError as exc:
            if exc.in_doubt:
                in_doubt = exc
            if attempt == ATTEMPTS:
                if in_doubt is None:
                    raise
                raise unknown(in_doubt) from exc
        except errors.ConditionNotMetError:
            if in_doubt is not None:
                raise unknown(in_doubt) from in_doubt
            raise lost() from None
    raise AssertionError("ATTEMPTS must be positive")
