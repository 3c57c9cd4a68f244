"""A store that hands every command to another one: the base of stores that watch or change commands.

Every interface call goes through :meth:`Delegating.relay`, which a subclass
overrides to record commands (the benchmark's floors) or to make some of
them fail (fault injection).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from large_queue import errors
from large_queue.backends._base import (
    Backend,
    Operation,
    ReadBeside,
    Record,
    RecordCommand,
    RecordKey,
    WriteMode,
)
from large_queue.backends.conditions import Condition


class Delegating(Backend):
    """Hands every command to ``inner`` through :meth:`relay`."""

    def __init__(self, inner: Backend) -> None:
        super().__init__()
        self.inner = inner
        self.default_namespace = inner.default_namespace
        self.reads_beside = inner.reads_beside  # one round trip for operate_and_read, or two, as inner
        self.operates_together = inner.operates_together  # likewise for operate_each

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``inner.<method>(*args, **kwargs)``, counted as one command."""
        self._count()
        return getattr(self.inner, method)(*args, **kwargs)

    def get(self, key: RecordKey, bins: Sequence[str] | None = None) -> Record | None:
        """Read through the inner store."""
        record: Record | None = self.relay("get", key, bins)
        return record

    def put(
        self,
        key: RecordKey,
        bins: dict[str, Any],
        *,
        mode: WriteMode = WriteMode.UPSERT,
        generation: int | None = None,
        ttl: int | None = None,
    ) -> None:
        """Write through the inner store."""
        self.relay("put", key, bins, mode=mode, generation=generation, ttl=ttl)

    def operate(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        *,
        condition: Condition | None = None,
        generation: int | None = None,
    ) -> dict[str, Any]:
        """Operate through the inner store."""
        result: dict[str, Any] = self.relay(
            "operate", key, list(operations), condition=condition, generation=generation
        )
        return result

    def remove(self, key: RecordKey) -> bool:
        """Remove through the inner store."""
        removed: bool = self.relay("remove", key)
        return removed

    def batch_get(self, keys: Sequence[RecordKey]) -> list[Record | None]:
        """Batch-read through the inner store."""
        records: list[Record | None] = self.relay("batch_get", list(keys))
        return records

    def batch_read(
        self, reads: Sequence[tuple[RecordKey, Sequence[Operation] | None]]
    ) -> list[dict[str, Any] | None]:
        """Batch-read through the inner store."""
        results: list[dict[str, Any] | None] = self.relay("batch_read", list(reads))
        return results

    def operate_and_read(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        read: ReadBeside,
        *,
        condition: Condition | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Operate and read through the inner store."""
        result: tuple[dict[str, Any], dict[str, Any] | None] = self.relay(
            "operate_and_read", key, list(operations), read, condition=condition
        )
        return result

    def operate_each(self, commands: Sequence[RecordCommand]) -> list[dict[str, Any] | errors.BackendError]:
        """Operate on each record through the inner store: one command where it sends them together."""
        if not self.operates_together:
            return super().operate_each(commands)  # a command each, each relayed
        outcomes: list[dict[str, Any] | errors.BackendError] = self.relay(
            "operate_each", [(key, list(operations), condition) for key, operations, condition in commands]
        )
        return outcomes

    def sets_holding(self, namespace: str, user_key: str) -> list[str]:
        """The inner store's answer."""
        found: list[str] = self.relay("sets_holding", namespace, user_key)
        return found

    def grouped(self) -> contextlib.AbstractContextManager[None]:
        """The inner store's group."""
        return self.inner.grouped()

    def waiting_at_most(self, seconds: float | None) -> contextlib.AbstractContextManager[None]:
        """The inner store's bound on waits."""
        return self.inner.waiting_at_most(seconds)

    def max_record_bytes(self, namespace: str) -> int:
        """The inner store's limit."""
        limit: int = self.inner.max_record_bytes(namespace)
        return limit

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()
