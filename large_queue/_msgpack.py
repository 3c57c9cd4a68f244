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
        return _SORTED.encode(_with_other_keys_packed(value))


def _with_other_keys_packed(value: Any) -> Any:
    """``value`` (a dict or list) with each map whose keys are not all str packed already, keys in order.

    msgspec then sorts the str-keyed maps itself and writes the packed ones
    as they are: a record's bins (str keys) holding a map of offsets is
    packed in a third of the time that ordering every map by hand takes.
    """
    if type(value) is dict:
        for key in value:
            if type(key) is not str:
                return msgspec.Raw(_AS_GIVEN.encode(_key_ordered(value)))
        return {
            key: _with_other_keys_packed(item) if type(item) in _NESTED else item
            for key, item in value.items()
        }
    if type(value) is list:
        return [_with_other_keys_packed(item) if type(item) in _NESTED else item for item in value]
    return value


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
