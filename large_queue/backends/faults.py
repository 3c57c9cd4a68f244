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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from large_queue import errors
from large_queue._records import BUFFER_KEY_PREFIX, FENCE_COUNTER, LOCK_OWNER, METADATA_KEY, NO_OWNER
from large_queue.backends._base import Backend, Increment, Operation, Record, RecordKey, Write, WriteMode
from large_queue.backends.conditions import Condition


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
    def is_buffer(self) -> bool:
        """A command on a buffer record."""
        return self.key.user_key.startswith(BUFFER_KEY_PREFIX)


@dataclass
class _Fault:
    when: Callable[[Call], bool]
    applied: bool
    remaining: int


class FaultInjectingBackend(Backend):
    """Delegates to ``inner``, except for writes an injected fault matches."""

    def __init__(self, inner: Backend) -> None:
        super().__init__()
        self.inner = inner
        self.default_namespace = inner.default_namespace
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

    def _through(self, call: Call, run: Callable[[], Any]) -> Any:
        self._count()
        self.calls.append(call)
        fault = next((f for f in self._faults if f.remaining and f.when(call)), None)
        if fault is None:
            return run()
        fault.remaining -= 1
        self.injected += 1
        if fault.applied:
            run()
        raise errors.BackendTimeoutError(
            f"injected timeout on {call.method} of {call.key.user_key}"
            f" ({'applied' if fault.applied else 'not applied'})",
            code=9,
            in_doubt=True,
        )

    def get(self, key: RecordKey) -> Record | None:
        """Read through to the wrapped store."""
        self._count()
        return self.inner.get(key)

    def put(
        self,
        key: RecordKey,
        bins: dict[str, Any],
        *,
        mode: WriteMode = WriteMode.UPSERT,
        generation: int | None = None,
        ttl: int | None = None,
    ) -> None:
        """Write through, unless a fault matches."""
        self._through(
            Call("put", key), lambda: self.inner.put(key, bins, mode=mode, generation=generation, ttl=ttl)
        )

    def operate(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        *,
        condition: Condition | None = None,
        generation: int | None = None,
    ) -> dict[str, Any]:
        """Operate through, unless a fault matches."""
        result: dict[str, Any] = self._through(
            Call("operate", key, tuple(operations)),
            lambda: self.inner.operate(key, operations, condition=condition, generation=generation),
        )
        return result

    def remove(self, key: RecordKey) -> bool:
        """Remove through, unless a fault matches."""
        removed: bool = self._through(Call("remove", key), lambda: self.inner.remove(key))
        return removed

    def batch_get(self, keys: Sequence[RecordKey]) -> list[Record | None]:
        """Batch-read through to the wrapped store."""
        self._count()
        return self.inner.batch_get(keys)

    def batch_read(
        self, reads: Sequence[tuple[RecordKey, Sequence[Operation] | None]]
    ) -> list[dict[str, Any] | None]:
        """Batch-read through to the wrapped store."""
        self._count()
        return self.inner.batch_read(reads)

    def sets_holding(self, namespace: str, user_key: str) -> list[str]:
        """The inner store's answer."""
        return self.inner.sets_holding(namespace, user_key)

    def max_record_bytes(self, namespace: str) -> int:
        """The wrapped store's limit."""
        return self.inner.max_record_bytes(namespace)

    def close(self) -> None:
        """Close the wrapped store."""
        self.inner.close()
