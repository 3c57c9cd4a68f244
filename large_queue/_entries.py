"""Checking entries before anything is written, and how a queue stores them.

An entry must be made of Aerospike-native values: None, bool, int (signed 64
bit), float, str, bytes, and lists and dicts of those (dict keys: str, int or
bytes). Each entry must also fit one slot of its buffer record, so a full
record never exceeds the store's record size limit.

A queue keeps its entries in one of three encodings, chosen when it is created:

- ``native``: each entry is stored as the store's own values (Aerospike
  lists, maps, strings...), any of the types above but strings holding NUL
  (Aerospike cuts a string at its first NUL). Other Aerospike clients read
  such entries as they are.
- ``msgpack``: each entry is stored as its msgpack encoding, in a bytes
  value: the same types, NUL included. The store's client then converts one
  bytes value a slot instead of a tree of values, which halves what the
  Aerospike client spends on a slot it writes or reads (about 1.8 against
  0.9 us a small entry here; 0.2-0.35 us of it goes to msgspec's encoding or
  decoding), so batches and the producer object go faster.
- ``json``: each entry is stored as its JSON text, in a bytes value. Only
  JSON's types are accepted (no bytes, string keys only, finite floats).

Dicts come back with their keys in Aerospike's order on every store and in
every encoding: int keys, then str keys, then bytes keys, each sorted. So
dequeuers get the same Python values back from each encoding (``bytearray``
comes back as ``bytes``). What an encoding changes is what is stored: a
reader who wants JSON text or msgpack bytes (the Spark connector's
``value`` column) takes a JSON or msgpack queue's stored bytes as they are,
instead of decoding every entry and writing it out again.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from large_queue import errors
from large_queue._msgpack import pack, unpack

#: the integers a store keeps (Aerospike's): signed 64-bit
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Lists and dicts within lists and dicts, at most: Aerospike's client cannot read back
# a slot whose entry is nested 63 deep (the slot adds two levels), so the
# same, rounder limit holds on every store and encoding.
MAX_NESTING_DEPTH = 32
# bytes a slot adds around its value: list header, offset, timestamp
SLOT_OVERHEAD_BYTES = 24
# bytes a buffer record needs besides its slots: bins, fencing marks, headers
RECORD_OVERHEAD_BYTES = 4096

_ENCODER = msgspec.msgpack.Encoder()


def max_entry_bytes(record_size_limit: int, slots_per_record: int) -> int:
    """Largest encoded entry that keeps a full buffer record under the limit."""
    return (record_size_limit - RECORD_OVERHEAD_BYTES) // slots_per_record - SLOT_OVERHEAD_BYTES


class _Refused(Exception):
    """An entry's part that cannot be stored: ``path`` from the inside out, and why."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []


def unstorable(value: Any) -> str | None:
    """Why Aerospike would not keep ``value`` as it is (None if it would), checked as a native entry is.

    For a bin's value: the stores refuse it (a tuple, a set, an int past 64
    bits, a map with float keys, a str holding a NUL) rather than change it.
    """
    try:
        _check_value(value, False, True, 0)
    except _Refused as refused:
        return f"{''.join(reversed(refused.path))} {refused.problem}"
    return None


def _check_value(value: Any, as_json: bool, cuts_nul: bool, depth: int) -> None:
    """Raise ``_Refused`` for the first part of ``value`` that cannot be stored.

    The path to it is collected on the way out, so an entry that passes
    costs no string building; a container's plain strings, ints and floats
    are checked in its own loop, without a call each (most entries are
    flat dicts and lists). ``as_json``: only JSON's types; ``cuts_nul``: no
    NUL in a str (the store's own strings: a native queue on Aerospike).
    """
    kind = type(value)
    if kind is list or kind is dict:
        _check_depth(depth)
        is_dict = kind is dict
        passed = None  # the last part checked: a list of one object repeated ([[-1]] * 100) costs one call
        for label, item in value.items() if is_dict else enumerate(value):
            if is_dict and (type(label) is not str or (cuts_nul and "\x00" in label)):
                _check_key(label, as_json)  # a plain str key needs no call
            item_kind = type(item)
            if item_kind is str and (not cuts_nul or "\x00" not in item):
                continue
            if item_kind is int and INT64_MIN <= item <= INT64_MAX:
                continue
            if item is passed:
                continue
            try:
                _check_value(item, as_json, cuts_nul, depth + 1)
            except _Refused as refused:
                refused.path.append(f"[{label!r}]")
                raise
            passed = item
        return
    if kind is str:
        if cuts_nul and "\x00" in value:
            raise _Refused(f"is a str holding a NUL character: {_NUL}")
        return
    if kind is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise _Refused(f"= {value} does not fit a signed 64-bit integer")
        return
    if kind is float:
        if as_json and not math.isfinite(value):
            raise _Refused(f"= {value}, which JSON cannot hold")
        return
    if value is None or kind is bool:
        return
    if kind is bytes or kind is bytearray:
        if as_json:
            raise _Refused(
                f"is {kind.__name__}, which JSON cannot hold; this queue stores entries as JSON"
                " (create it with encoding='msgpack' or 'native' to keep bytes)"
            )
        return
    hint = " (use a list)" if kind is tuple else ""
    raise _Refused(
        f"is a {kind.__name__}, which the store cannot keep{hint}; entries are made of"
        " None, bool, int, float, str, bytes, list and dict"
    )


def _check_key(key: Any, as_json: bool) -> None:
    key_kind = type(key)
    if key_kind not in ((str,) if as_json else (str, int, bytes)):
        raise _Refused(
            f"has a key of type {key_kind.__name__}; dict keys must be"
            + (" str in a JSON-encoded queue" if as_json else " str, int or bytes")
        )
    if key_kind is str and "\x00" in key:  # reached for a str key only where NUL is refused
        raise _Refused(f"has a key holding a NUL character ({key!r}): {_NUL}")
    if key_kind is int and not INT64_MIN <= key <= INT64_MAX:
        raise _Refused(f"has a key {key} that does not fit a signed 64-bit integer")


def _check_depth(depth: int) -> None:
    if depth == MAX_NESTING_DEPTH:
        raise _Refused(
            f"is nested deeper than {MAX_NESTING_DEPTH} lists and dicts, more than the stores can read back"
        )


_NUL = (
    "Aerospike cuts a str at its first NUL character, so a native queue refuses it"
    " (store bytes, or create the queue with encoding='msgpack' or 'json', which keep it)"
)


NATIVE = "native"
MSGPACK = "msgpack"
JSON = "json"
ENCODINGS = (NATIVE, MSGPACK, JSON)
#: how a new queue stores its entries unless told
DEFAULT_ENCODING = MSGPACK


def check_encoding(encoding: object) -> str:
    """Return ``encoding`` if it is one a queue can use, else raise."""
    if encoding not in ENCODINGS:
        raise errors.InvalidArgumentError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    return str(encoding)


def check_entries(
    entries: Iterable[Any], limit_bytes: int, encoding: str = NATIVE, *, alone: bool = False
) -> list[Any]:
    """Validate every entry (type and size); return them as ``encoding`` stores them.

    A refusal names the entry by its index in ``entries`` (``entry 3``), or
    as ``the entry`` when it was sent ``alone``.
    """
    if isinstance(entries, (str, bytes, bytearray, dict)) or not isinstance(entries, Iterable):
        raise errors.InvalidArgumentError(
            f"entries must be an iterable of entries (a list, say), got {type(entries).__name__}:"
            " enqueue(entry) appends one"
        )
    as_json = encoding == JSON
    packed = encoding == MSGPACK
    cuts_nul = encoding == NATIVE
    checked = []
    for index, entry in enumerate(entries):
        try:
            if not as_json and type(entry) is dict and _flat_and_plain(entry):
                # the common entry, checked without a call for each of its parts
                checked.append(pack(entry) if packed else entry)
                continue
            _check_value(entry, as_json, cuts_nul, 0)
            if as_json:
                entry = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)  # keys in order, as native maps
            elif packed:
                entry = pack(entry)
        except _Refused as refused:
            path = "".join(reversed(refused.path))
            raise errors.UnsupportedEntryError(
                f"{_named(index, alone)}{path} {refused.problem}", entry_index=_index(index, alone)
            ) from None
        except (TypeError, OverflowError, UnicodeEncodeError) as exc:  # a lone surrogate: not UTF-8
            raise errors.UnsupportedEntryError(
                f"{_named(index, alone)} cannot be stored: {exc}", entry_index=_index(index, alone)
            ) from None
        checked.append(entry)
    _check_sizes(checked, limit_bytes, native=cuts_nul, alone=alone)
    return checked


def _named(index: int, alone: bool) -> str:
    """How a refusal names entry ``index``: by its index in a batch, or as the one entry sent."""
    return "the entry" if alone else f"entry {index}"


def _index(index: int, alone: bool) -> int | None:
    """A refusal's ``entry_index``: the entry's index in its batch, None for the one entry sent."""
    return None if alone else index


def check_entry(entry: Any, limit_bytes: int, encoding: str = NATIVE) -> Any:
    """:func:`check_entries` of one entry: the entry as ``encoding`` stores it.

    A flat entry is checked and sized at once; anything else (and every
    refusal, with its message) goes the way of a batch.
    """
    if encoding != JSON and type(entry) is dict and _flat_and_plain(entry):
        try:
            if encoding == NATIVE:  # at most 2 bytes more for each key and value stored (_native_extra)
                if len(_ENCODER.encode(entry)) + 4 * len(entry) <= limit_bytes:
                    return entry
            elif len(stored := pack(entry)) + _BYTES_HEADER <= limit_bytes:
                return stored
        except (UnicodeEncodeError, TypeError, OverflowError):
            pass  # refused below, with the message a batch gives
    return check_entries([entry], limit_bytes, encoding, alone=True)[0]


#: the most a bytes value's msgpack header adds to it (what a slot holds of a msgpack entry)
_BYTES_HEADER = 5


def _flat_and_plain(entry: dict[Any, Any]) -> bool:
    """True if every key of ``entry`` is a str and every value a str or a 64-bit int, none with a NUL."""
    for key, item in entry.items():
        if type(key) is not str or "\x00" in key:
            return False
        kind = type(item)
        if kind is str:
            if "\x00" in item:
                return False
        elif kind is not int or not INT64_MIN <= item <= INT64_MAX:
            return False
    return True


def _check_sizes(checked: list[Any], limit_bytes: int, *, native: bool = False, alone: bool = False) -> None:
    """``EntryTooLargeError`` for the first entry whose encoding exceeds ``limit_bytes``.

    A list encodes as a short header and its items, so a run of entries
    whose encoding fits the limit holds no entry that does not. The batch
    is encoded whole; if it is larger than the limit, in runs sized to fit
    about half the limit each (a batch of 100 small entries: 4 encodings,
    not 101); only a run that still does not fit is encoded entry by entry.
    ``native``: also count the bytes Aerospike adds to a native entry
    (:func:`_native_extra`), walked only where they could matter: each str
    or bytes encodes in at least one byte and gains at most two, so an
    encoding of at most a third of the limit fits whatever it holds.
    """
    try:
        count = len(checked)
        encoded = len(_ENCODER.encode(checked))  # the entries and a list header: never less than one entry
        if encoded * (3 if native else 1) <= limit_bytes:
            return
        more = [_native_extra(entry) for entry in checked] if native else [0] * count
        if count > 1:
            total = encoded + sum(more)
            if total <= limit_bytes:
                return
            run = max(1, count * limit_bytes // (2 * total))
        else:
            run = 1
        for start in range(0, count, run):
            stop = start + run
            if run > 1 and len(_ENCODER.encode(checked[start:stop])) + sum(more[start:stop]) <= limit_bytes:
                continue
            for index in range(start, min(stop, count)):
                size = len(_ENCODER.encode(checked[index])) + more[index]
                if size > limit_bytes:
                    raise errors.EntryTooLargeError(
                        f"{_named(index, alone)} is {size} bytes as stored; this queue's slots hold at most"
                        f" {limit_bytes} bytes (lower slots_per_record or raise the record size limit)",
                        size=size,
                        limit=limit_bytes,
                        entry_index=_index(index, alone),
                    )
    except (UnicodeEncodeError, TypeError, OverflowError) as exc:  # a lone surrogate: not UTF-8
        index = _first_unencodable(checked)
        raise errors.UnsupportedEntryError(
            f"{_named(index, alone)} cannot be stored: {exc}", entry_index=_index(index, alone)
        ) from None


def _native_extra(value: Any) -> int:
    """The most a native entry grows in an Aerospike record beyond its msgpack encoding.

    Aerospike keeps each str and bytes inside a list or map (and the entry
    itself, an item of its slot) with a type byte before its contents, and
    that byte can also lengthen its length header: at most 2 bytes each.
    """
    kind = type(value)
    if kind is str or kind is bytes or kind is bytearray:
        return 2
    if kind is list:
        return sum(_native_extra(item) for item in value)
    if kind is dict:
        return sum(_native_extra(key) + _native_extra(item) for key, item in value.items())
    return 0


def _first_unencodable(checked: list[Any]) -> int:
    for index, entry in enumerate(checked):
        try:
            _ENCODER.encode(entry)
        except (UnicodeEncodeError, TypeError, OverflowError):
            return index
    return 0


def decode_entry(encoding: str, stored: Any) -> Any:
    """The entry that a slot's stored value holds; ``ValueError`` if it holds no valid entry."""
    if encoding == NATIVE:
        return stored
    if not isinstance(stored, (bytes, bytearray)):  # Aerospike's client hands out blobs as bytearray
        raise ValueError(f"a {encoding}-encoded queue's slot holds {type(stored).__name__}, not its bytes")
    if encoding == MSGPACK:
        return unpack(stored)  # msgspec.DecodeError is a ValueError
    return orjson.loads(stored)  # orjson.JSONDecodeError is a ValueError


def bytes_as_json(value: Any) -> Any:
    """JSON ``default`` hook: bytes become ``{"$bytes": base64}``; anything else is refused."""
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_key(key: Any) -> Any:
    """A map key as JSON can hold it (a JSON key is a string): an int as its decimal text, bytes as
    ``"$bytes:<base64>"``."""
    if isinstance(key, (bytes, bytearray)):
        return "$bytes:" + base64.b64encode(bytes(key)).decode()
    if type(key) is int:
        return str(key)
    return key


def json_keys(value: Any) -> Any:
    """``value`` with every int and bytes map key in it as :func:`json_key` says (the same object if none is).

    ``TypeError`` where a key so written is one the map holds already (``1`` beside ``"1"``): JSON
    would hold the two as one key, and a reader would keep only one of their values.
    """
    kind = type(value)
    if kind is dict:
        items: dict[Any, Any] = {}
        changed = False
        for key, item in value.items():
            shown, inner = json_key(key), json_keys(item)
            if shown is not key and shown in value:
                raise TypeError(f"key {key!r} and key {shown!r} would be one key in JSON")
            changed = changed or shown is not key or inner is not item
            items[shown] = inner
        return items if changed else value
    if kind is list:
        elements = [json_keys(item) for item in value]
        return value if all(new is old for new, old in zip(elements, value, strict=True)) else elements
    return value


def finite(text: str) -> float:
    """A JSON number's text as a float (``parse_float``), ``ValueError`` if past a double's range."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of the range of a double")
    return value


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One queue entry: its offset, its value and when it was enqueued (ms since the epoch, store's clock).

    The time is the store's when the enqueue took its offsets (the lock, or
    the reservation), so entries of producers on machines whose clocks
    disagree still order by it.
    """

    offset: int
    value: Any
    enqueued_at_ms: int


_new_object = object.__new__


def entries_of(
    rows: Iterable[tuple[int, Any, int]], decode: Callable[[Any], Any] | None = None
) -> list[Entry]:
    """Entries of ``(offset, value, enqueued_at_ms)`` rows, in their order, each value ``decode``d if given.

    A dequeue makes them by the hundred: each instance's ``__dict__`` is
    filled in place (as :func:`large_queue._frozen.frozen` does, without its
    call per entry), about 0.3 us an entry where ``Entry(...)`` takes 1 us.
    Whatever ``decode`` raises goes to the caller.
    """
    made: list[Entry] = []
    append = made.append
    for offset, value, enqueued_at_ms in rows:
        entry = _new_object(Entry)
        fields = entry.__dict__
        fields["offset"] = offset
        fields["value"] = value if decode is None else decode(value)
        fields["enqueued_at_ms"] = enqueued_at_ms
        append(entry)
    return made
