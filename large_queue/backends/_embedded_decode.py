"""How the embedded store decodes a record: whole, or leaving the large bins a command does not name encoded.

A queue's metadata record carries its receipt log (up to 4,000 receipts,
about 220 KB), which only calls with a txn id read or write. Every other
command on that record (an acquire, a commit, a reservation, a quick take)
decoded the whole log and encoded it again: with a log of 1,000 receipts
(55 KB), a plain enqueue and dequeue took five times as long as with none.

So a record larger than :data:`LAZY_BYTES` is split into its bins first
(msgspec reads each bin's extent without building its values), and a bin
larger than :data:`LAZY_BYTES` that no operation or condition of the
command names stays as its bytes (``msgspec.Raw``), which the store writes
back as they are. A bin a command names is decoded as before, so what a
command sees and what it stores is the same either way. (A damaged bin that
a command does not name is so written back as it was, where the command
used to fail: whole-record reads, and ``large-queue check``, still find it.)

Splitting costs a scan of the record (about 3.5 µs for an 11 KB buffer
record, on top of 8 µs to decode it). A record whose large bins the command
names (a buffer record's slots, at every command) gains nothing from it, so
the decoder remembers, per record, which bins were large when it last split
it, and decodes the record whole while the command names them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import msgspec

from large_queue import errors
from large_queue._msgpack import unpack
from large_queue.backends._base import Compute, Evaluate, LogPut, Operation, RecordKey
from large_queue.backends.conditions import (
    BinExists,
    Condition,
    IntBin,
    ListRangeMax,
    MapItem,
    MapKeyCount,
    StrBin,
)

#: records, and bins, of more bytes than this are decoded only as far as a command needs
LAZY_BYTES = 8192
#: records whose large bins the decoder remembers (forgotten all at once past it)
_MOST_REMEMBERED = 4096
_BIN_NODES = (IntBin, StrBin, ListRangeMax, MapKeyCount, MapItem, BinExists)
_split = msgspec.msgpack.Decoder(dict[str, msgspec.Raw]).decode
#: the bins each condition template or expression names, by its id (the node is kept alive with them)
_NAMED: dict[int, tuple[Any, frozenset[str]]] = {}


def unpack_bins(blob: bytes | msgspec.Raw, where: tuple[str, str, str]) -> Any:
    """What ``blob`` holds, for the record ``where`` (namespace, set, key); CorruptRecordError if damaged."""
    try:
        return unpack(blob)
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError) as exc:
        problem = f"damaged data that cannot be read: {exc}"
    raise errors.CorruptRecordError(f"record {'/'.join(where)} holds {problem}", code=-1, key=where)


def unpack_record(blob: bytes, where: tuple[str, str, str]) -> dict[str, Any]:
    """The bins stored for the record ``where``, all decoded."""
    result = unpack_bins(blob, where)
    if isinstance(result, dict):
        return result
    problem = f"{type(result).__name__} where its bins should be"
    raise errors.CorruptRecordError(f"record {'/'.join(where)} holds {problem}", code=-1, key=where)


def named_bins(operations: Sequence[Operation], condition: Condition | None) -> frozenset[str]:
    """The bins that ``operations`` and ``condition`` read or write, by name."""
    names = {op.bin for op in operations}
    for op in operations:
        if isinstance(op, (Compute, Evaluate)):
            names |= _named(op.expression)
        elif isinstance(op, LogPut):
            names |= _named(op.items) | _named(op.key)
    if condition is not None:
        names |= _named(condition.template if hasattr(condition, "template") else condition)
    return frozenset(names)


def _named(node: Any) -> frozenset[str]:
    """The bins a condition or expression tree names (remembered per tree: templates are built once)."""
    if type(node) in (str, int):  # a plain value (a log's key, say): no bin, and nothing to remember
        return frozenset()
    known = _NAMED.get(id(node))
    if known is not None and known[0] is node:
        return known[1]
    found: set[str] = set()
    _walk(node, found)
    names = frozenset(found)
    if len(_NAMED) >= _MOST_REMEMBERED:
        _NAMED.clear()
    _NAMED[id(node)] = (node, names)
    return names


def _walk(node: Any, found: set[str]) -> None:
    if isinstance(node, _BIN_NODES):
        found.add(node.name)
    if isinstance(node, (tuple, list)):
        for part in node:
            _walk(part, found)
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for field in dataclasses.fields(node):
            _walk(getattr(node, field.name), found)


class RecordDecoder:
    """Decodes the embedded store's records as far as each command needs (see the module)."""

    def __init__(self) -> None:
        self._large: dict[RecordKey, frozenset[str]] = {}  # a record's large bins when last split

    def decode(
        self,
        blob: bytes,
        key: RecordKey,
        command: tuple[Sequence[Operation], Condition | None] | None = None,
    ) -> dict[str, Any]:
        """The bins of ``blob``; with the ``command`` (operations, condition) that reads them, large bins
        it does not name are left encoded."""
        where = (key.namespace, key.set_name, key.user_key)
        if command is None or len(blob) <= LAZY_BYTES:
            return unpack_record(blob, where)
        operations, condition = command
        large = self._large.get(key)
        if large:  # (none large when last split: it may have grown since)
            if all(any(op.bin == name for op in operations) for name in large):
                return unpack_record(blob, where)  # a buffer record's slots, say: named by an operation
            named = named_bins(operations, condition)
            if large <= named:
                return unpack_record(blob, where)
        else:
            named = named_bins(operations, condition)
        try:
            parts = _split(blob)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, ValueError):
            return unpack_record(blob, where)  # not a map of bins: named as damaged there
        bins: dict[str, Any] = {}
        found = []
        for name, raw in parts.items():
            if len(raw) > LAZY_BYTES:
                found.append(name)
                if name not in named:
                    bins[name] = raw
                    continue
            bins[name] = unpack_bins(raw, where)
        if len(self._large) >= _MOST_REMEMBERED:
            self._large.clear()
        self._large[key] = frozenset(found)
        return bins
