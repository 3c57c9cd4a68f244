"""Checking entries before anything is written.

An entry must be made of Aerospike-native values: None, bool, int (signed 64
bit), float, str, bytes, and lists and dicts of those (dict keys: str, int or
bytes). Each entry must also fit one slot of its buffer record, so a full
record never exceeds the store's record size limit.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import msgspec

from large_queue import errors

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# bytes a slot adds around its value: list header, offset, timestamp
SLOT_OVERHEAD_BYTES = 24
# bytes a buffer record needs besides its slots: bins, fencing marks, headers
RECORD_OVERHEAD_BYTES = 4096

_ENCODER = msgspec.msgpack.Encoder()


def max_entry_bytes(record_size_limit: int, slots_per_record: int) -> int:
    """Largest encoded entry that keeps a full buffer record under the limit."""
    return (record_size_limit - RECORD_OVERHEAD_BYTES) // slots_per_record - SLOT_OVERHEAD_BYTES


def _check_value(value: Any, path: str) -> None:
    kind = type(value)
    if value is None or kind in (bool, float, str, bytes, bytearray):
        return
    if kind is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise errors.UnsupportedEntryError(f"{path} = {value} does not fit a signed 64-bit integer")
        return
    if kind is list:
        for index, item in enumerate(value):
            _check_value(item, f"{path}[{index}]")
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) not in (str, int, bytes):
                raise errors.UnsupportedEntryError(
                    f"{path} has a key of type {type(key).__name__}; dict keys must be str, int or bytes"
                )
            _check_value(item, f"{path}[{key!r}]")
        return
    hint = " (use a list)" if kind is tuple else ""
    raise errors.UnsupportedEntryError(
        f"{path} is a {kind.__name__}, which the store cannot keep{hint}; entries are made of"
        " None, bool, int, float, str, bytes, list and dict"
    )


def check_entries(entries: Iterable[Any], limit_bytes: int) -> list[Any]:
    """Validate every entry (type and size) and return them as a list."""
    checked = []
    for index, entry in enumerate(entries):
        _check_value(entry, f"entry {index}")
        size = len(_ENCODER.encode(entry))
        if size > limit_bytes:
            raise errors.EntryTooLargeError(
                f"entry {index} is {size} bytes encoded; this queue's slots hold at most"
                f" {limit_bytes} bytes (lower slots_per_record or raise the record size limit)",
                size=size,
                limit=limit_bytes,
            )
        checked.append(entry)
    return checked


def bytes_as_json(value: Any) -> Any:
    """JSON ``default`` hook: bytes become ``{"$bytes": base64}``; anything else is refused."""
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
