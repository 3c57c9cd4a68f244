"""A backend wrapper that makes chosen commands time out, for fault-injection tests.

A real store can time out *after* applying a write (the reply was lost) or
*before* it (the request was). Both look the same to the client: a
``BackendTimeoutError`` with ``in_doubt=True``. This wrapper produces either
on demand, so tests (the library's and yours) can show that every such
outcome leaves the queue consistent and is reported honestly.

Example::

    faulty = FaultInjectingBackend(connect("embedded:///tmp/q.db"))
    faulty.inject(lambda call: call.is_commit, applied=True)
    Queue.open(faulty, "orders").enqueue("x")   # OutcomeUnknownError
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from large_queue import errors
from large_queue._records import BUFFER_KEY_PREFIX, FENCE_COUNTER, HEAD, LOCK_OWNER, METADATA_KEY, NO_OWNER
from large_queue.backends._base import Backend, Increment, Operation, RecordKey, Write
from large_queue.backends._delegating import Delegating


@dataclass(frozen=True)
class Call:
    """One write command as the wrapper sees it."""

    method: str
    key: RecordKey
    operations: tuple[Operation, ...] = ()

    @property
    def is_acquire(self) -> bool:
        """A queue-lock acquire (it increments the fencing counter)."""
        return self.key.user_key == METADATA_KEY and any(
            isinstance(op, Increment) and op.bin == FENCE_COUNTER for op in self.operations
        )

    @property
    def is_commit(self) -> bool:
        """A commit or release of the queue lock."""
        return self.key.user_key == METADATA_KEY and Write(LOCK_OWNER, NO_OWNER) in self.operations

    @property
    def is_quick_take(self) -> bool:
        """A dequeue's head move without the lock (:mod:`large_queue._quick_take`)."""
        return (
            self.key.user_key == METADATA_KEY
            and any(isinstance(op, Write) and op.bin == HEAD for op in self.operations)
            and not any(isinstance(op, Write) and op.bin == LOCK_OWNER for op in self.operations)
        )

    @property
    def is_buffer(self) -> bool:
        """A command on a buffer record."""
        return self.key.user_key.startswith(BUFFER_KEY_PREFIX)


@dataclass
class _Fault:
    when: Callable[[Call], bool]
    applied: bool
    remaining: int


class FaultInjectingBackend(Delegating):
    """Delegates to ``inner``, except for writes an injected fault matches."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.operates_together = False  # operate_each as a command a record, each open to a fault
        self._faults: list[_Fault] = []
        self.injected = 0
        #: every write command seen, in order
        self.calls: list[Call] = []

    def inject(self, when: Callable[[Call], bool], *, applied: bool, times: int = 1) -> None:
        """The next ``times`` writes matching ``when`` time out in doubt.

        ``applied=True`` applies the write first (a lost reply); ``False``
        drops it (a lost request).
        """
        self._faults.append(_Fault(when, applied, times))

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Reads go through; a write goes through unless an injected fault matches it."""
        if method not in _WRITES:
            return super().relay(method, *args, **kwargs)
        call = Call(method, args[0], tuple(args[1]) if method in ("operate", "operate_and_read") else ())
        self.calls.append(call)
        fault = next((f for f in self._faults if f.remaining and f.when(call)), None)
        if fault is None:
            return super().relay(method, *args, **kwargs)
        fault.remaining -= 1
        self.injected += 1
        if fault.applied:
            super().relay(method, *args, **kwargs)
        else:
            self._count()
        raise errors.BackendTimeoutError(
            f"injected timeout on {call.method} of {call.key.user_key}"
            f" ({'applied' if fault.applied else 'not applied'})",
            code=9,
            in_doubt=True,
        )


_WRITES = ("put", "operate", "operate_and_read", "remove")
