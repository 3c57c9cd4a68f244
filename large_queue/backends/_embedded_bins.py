"""How the embedded store applies a command's operations to a record's bins, as Aerospike applies them.

Each operation's semantics, down to its edges, is Aerospike's: an increment
wraps around at 64 bits, a list write at the list's end appends and one past
it fails (Aerospike's bounded list writes), a bounded log trims as its map
expressions do. A refusal is the error Aerospike gives, with its result code,
raised before the command writes anything: the caller applies the command to
a copy of the bins it loaded and stores them only if every operation went.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Sequence
from typing import Any

from large_queue import errors
from large_queue.backends._base import (
    Compute,
    Evaluate,
    Increment,
    ListGetRange,
    ListSet,
    ListSetRange,
    LogPut,
    MapGet,
    Operation,
    Read,
    ReadSinceUpdate,
    RecordKey,
    Write,
)
from large_queue.backends.conditions import UNKNOWN, Clock, value_of

# Result codes as Aerospike numbers them, so errors look the same from both stores.
_CODE = {
    errors.RecordNotFoundError: 2,
    errors.GenerationMismatchError: 3,
    errors.RecordExistsError: 5,
    errors.BinTypeError: 12,
    errors.RecordTooLargeError: 13,
    errors.NamespaceNotFoundError: 20,
    errors.BinNameError: 21,
    errors.ConditionNotMetError: 27,
}


def fail(cls: type[errors.BackendError], message: str) -> errors.BackendError:
    """The error ``cls``, with Aerospike's result code for it: nothing was written."""
    return cls(message, code=_CODE.get(cls, -1), in_doubt=False)


#: how many integers a bin holds: an increment wraps around at 64 bits, as on Aerospike
_INT64_SPAN = 2**64


def apply(
    key: RecordKey, bins: dict[str, Any], operations: Sequence[Operation], clock: Clock
) -> dict[str, Any]:
    """Apply operations in order to ``bins`` (in place); return what the reads saw.

    The commands are checked before (:func:`check_overwriting_reads`), as on Aerospike.
    """
    results: dict[str, Any] = {}
    for op in operations:
        if isinstance(op, Read):
            if op.bin in bins:
                results[op.bin] = bins[op.bin]
        elif isinstance(op, Write):
            if op.value is None:
                bins.pop(op.bin, None)
            else:
                bins[op.bin] = op.value
        elif isinstance(op, Increment):
            current = bins.get(op.bin, 0)
            if type(current) is not int:
                raise fail(errors.BinTypeError, f"bin {op.bin!r} of {key.user_key} is not an integer")
            bins[op.bin] = (
                current + op.by + _INT64_SPAN // 2
            ) % _INT64_SPAN - _INT64_SPAN // 2  # wraps, as Aerospike
        elif isinstance(op, ListSet):
            target = _list_bin(key, bins, op.bin, create=True)
            if results.get(op.bin) is target:  # read before: the read keeps what it saw
                target = bins[op.bin] = list(target)
            _within(key, op.bin, op.index, target)
            if op.index == len(target):  # as Aerospike's bounded list set: the next index appends
                target.append(op.value)
            else:
                target[op.index] = op.value
        elif isinstance(op, ListSetRange):
            target = _list_bin(key, bins, op.bin, create=True)
            _within(key, op.bin, op.index, target)
            target[op.index : op.index + len(op.values)] = op.values  # past the end: the list grows
        elif isinstance(op, ListGetRange):
            target = _list_bin(key, bins, op.bin)
            results[op.bin] = target[op.index : op.index + op.count]
        elif isinstance(op, ReadSinceUpdate):
            results[op.bin] = clock.since_update_ms
        elif isinstance(op, Evaluate):
            value = value_of(op.expression, bins, clock, op.values)
            if value is not UNKNOWN:
                results[op.bin] = value
        elif isinstance(op, MapGet):
            found = bins.get(op.bin)
            if type(found) is dict and op.key in found:
                results[op.bin] = found[op.key]
        elif isinstance(op, LogPut):
            bins[op.bin] = _log_put(key, bins, op, clock)
        elif isinstance(op, Compute):
            value = value_of(op.expression, bins, clock, op.values)
            if type(value) is not int:  # Aerospike fails the command when an expression write is unknown
                raise fail(errors.BinTypeError, f"expression for bin {op.bin!r} of {key.user_key} is unknown")
            bins[op.bin] = value
        else:
            raise TypeError(f"unknown operation {op!r}")
    return results


def _log_put(key: RecordKey, bins: dict[str, Any], op: LogPut, clock: Clock) -> dict[Any, Any]:
    """The bounded log after :class:`LogPut` (as Aerospike's map expressions compute it)."""
    log = bins.get(op.bin)
    if log is None:
        log = {}
    elif type(log) is not dict:
        raise fail(errors.BinTypeError, f"bin {op.bin!r} of {key.user_key} is not a map")
    item = [value_of(part, bins, clock, op.values) for part in op.items]
    entry_key = value_of(op.key, bins, clock, op.values)
    if any(part is UNKNOWN for part in item) or entry_key is UNKNOWN:
        raise fail(errors.BinTypeError, f"an item of the log in bin {op.bin!r} of {key.user_key} is unknown")
    cutoff = [clock.now_ms - op.max_age_ms]
    kept = {k: v for k, v in log.items() if not v < cutoff}
    excess = len(kept) - (op.keep - 1)
    if excess > 0:  # the lowest-ranked go (usually one: the log was full)
        for old_key, _ in heapq.nsmallest(excess, kept.items(), key=operator.itemgetter(1)):
            del kept[old_key]
    kept[entry_key] = item
    return kept


def _within(key: RecordKey, name: str, index: int, target: list[Any]) -> None:
    """``BinTypeError`` if a list write's ``index`` is past the list's end (Aerospike's error 26)."""
    if index > len(target):
        raise fail(
            errors.BinTypeError, f"index {index} is past the end of list bin {name!r} of {key.user_key}"
        )


def _list_bin(key: RecordKey, bins: dict[str, Any], name: str, *, create: bool = False) -> list[Any]:
    """The list in bin ``name``; ``create``: a missing bin is a new empty list (as a list write makes it)."""
    value = bins.get(name)
    if value is None and create:
        value = bins[name] = []
    if not isinstance(value, list):
        raise fail(errors.BinTypeError, f"bin {name!r} of {key.user_key} is not a list")
    return value
