"""msgpack with every map's keys in Aerospike's order, for the embedded store's records and for entries.

Aerospike gives a map back with its keys sorted: int keys, then str keys,
then bytes keys, each sorted. Whatever is written here as msgpack (the
embedded store's records, a ``msgpack``-encoded queue's entries) is written
in that order, so a dict comes back the same from every store and encoding.
msgspec does the work: it is the fastest msgpack codec for Python.
"""

from __future__ import annotations

from typing import Any

import msgspec

_SORTED = msgspec.msgpack.Encoder(order="sorted")  # str keys sorted, as Aerospike orders them
_AS_GIVEN = msgspec.msgpack.Encoder()
# Aerospike's order of map keys of different types
_KEY_TYPE_RANK = {int: 0, str: 1, bytes: 2}
_NESTED = (dict, list)

#: decodes what :func:`pack` wrote (``msgspec.DecodeError``, a ``ValueError``, for anything else)
unpack = msgspec.msgpack.Decoder().decode


def pack(value: Any) -> bytes:
    """``value`` as msgpack, its maps' keys in Aerospike's order.

    ``TypeError`` for a value msgpack cannot hold, ``OverflowError`` for an
    int beyond 64 bits, ``UnicodeEncodeError`` for a str that is not UTF-8.
    """
    try:
        return _SORTED.encode(value)
    except TypeError:  # a map with int or bytes keys: msgspec sorts str keys only
        return _AS_GIVEN.encode(_key_ordered(value))


def _key_ordered(value: Any) -> Any:
    """``value`` with every dict's keys in Aerospike's order.

    Keys of one type (a map of offsets, say) sort as they are; only values
    that are lists or dicts are looked into.
    """
    if type(value) is dict:
        kinds = {type(key) for key in value}
        if len(kinds) == 1:
            keys = sorted(value)
        else:
            keys = sorted(value, key=lambda key: (_KEY_TYPE_RANK.get(type(key), 3), key))
        return {key: _key_ordered(item) if type(item := value[key]) in _NESTED else item for key in keys}
    if type(value) is list:
        return [_key_ordered(item) if type(item) in _NESTED else item for item in value]
    return value
