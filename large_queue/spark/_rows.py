"""What a row written to a queue becomes: its entry, shaped by the DataFrame's schema.

A row with a ``value`` column is that value, decoded as reads encode it (a
string is JSON text, bytes are msgpack; ``valueFormat`` says so explicitly,
and ``valueFormat=text`` keeps a string as it is). Any other row is the row
as a dict. Spark types with no Aerospike counterpart become text: a
``timestamp`` (an instant) as ISO 8601 in UTC with its ``+00:00`` offset, a
``timestamp_ntz``, a ``date`` and a ``time`` as ISO 8601 without one, a
``decimal`` as its digits. The schema says which is which: PySpark hands both timestamp
kinds to Python as naive datetimes (an instant in the worker's local time),
so the value alone cannot tell an instant from a wall-clock reading. In the
hour a worker's zone repeats at the end of daylight saving time, two instants
reach Python as one wall-clock time: run workers in UTC (``TZ=UTC``) where
that matters.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Callable
from typing import Any

import msgspec
from pyspark.sql import Row
from pyspark.sql.types import ArrayType, DataType, MapType, StructType, TimestampType

from large_queue import errors
from large_queue._entries import finite
from large_queue.spark._options import SourceOptions

Convert = Callable[[Any], Any]


def entry_maker(options: SourceOptions, schema: StructType) -> Callable[[Row], Any]:
    """The function from one row of ``schema`` to the entry it is enqueued as."""
    if "value" not in schema.fieldNames():
        whole = _converter(schema)
        return lambda row: whole(row)
    value_type = schema["value"].dataType
    as_native = _converter(value_type)
    text = options.value_format == "text"
    decoding = options.value_format if options.value_format_given and not text else None

    def entry(row: Row) -> Any:
        value = row["value"]
        if value is None or (text and isinstance(value, str)):
            return value
        how = decoding
        if how is None and not text:
            how = (
                "json"
                if isinstance(value, str)
                else "binary"
                if isinstance(value, (bytes, bytearray))
                else None
            )
        if how is None:
            return as_native(value)
        try:
            return _from_json(value) if how == "json" else msgspec.msgpack.decode(value)
        except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as exc:
            raise errors.InvalidArgumentError(
                f"a value is not {how} as the value column's type (or valueFormat) says: {exc}"
                " (valueFormat=text keeps a string value as it is)"
            ) from None

    return entry


def _from_json(text: str | bytes | bytearray) -> Any:
    """JSON text as reads write it: also with the ``NaN`` and ``Infinity`` tokens Spark's JSON takes.

    Integers are read exact, however long (an entry check refuses those
    past 64 bits), and a number past a double's range is refused
    (``ValueError``), not made a float or an infinity.
    """
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:  # the standard library's reader takes those tokens (ValueError if not)
        return json.loads(text, parse_float=finite)


#: Spark types whose values an entry can hold (as themselves, or as text: see the module)
_STORABLE = frozenset(
    {
        "StringType",
        "CharType",
        "VarcharType",
        "BinaryType",
        "BooleanType",
        "ByteType",
        "ShortType",
        "IntegerType",
        "LongType",
        "FloatType",
        "DoubleType",
        "DecimalType",
        "DateType",
        "TimestampType",
        "TimestampNTZType",
        "TimeType",
        "NullType",
    }
)
#: ... and those that may key a map (a store's map keys are str, int or bytes)
_KEYS = _STORABLE - {"BooleanType", "FloatType", "DoubleType", "NullType"}


#: ... and those that stay within JSON's types (bytes do not), for a JSON-encoded queue
_JSON = _STORABLE - {"BinaryType"}
#: ... and those that key a map in a JSON-encoded queue (they become text)
_JSON_KEYS = frozenset(
    {
        "StringType",
        "CharType",
        "VarcharType",
        "DecimalType",
        "DateType",
        "TimestampType",
        "TimestampNTZType",
        "TimeType",
    }
)


def check_writable(schema: StructType, *, as_json: bool = False) -> None:
    """``InvalidArgumentError`` naming a column whose type no entry can hold, before anything is written.

    A row with a ``value`` column of string or binary type is that column
    decoded (checked entry by entry as it is enqueued); otherwise every
    column's type, at every depth, must be one an entry can hold: with
    ``as_json`` (a JSON-encoded queue), one of JSON's (no bytes; map keys
    that become strings).
    """
    if "value" in schema.fieldNames():
        value_type = schema["value"].dataType
        if type(value_type).__name__ not in ("StringType", "CharType", "VarcharType", "BinaryType"):
            _check_type("value", value_type, as_json)
        return
    for field in schema.fields:
        _check_type(field.name, field.dataType, as_json)


def _check_type(path: str, data_type: DataType, as_json: bool, *, key: bool = False) -> None:
    if isinstance(data_type, StructType) and not key:
        for field in data_type.fields:
            _check_type(f"{path}.{field.name}", field.dataType, as_json)
    elif isinstance(data_type, ArrayType) and not key:
        _check_type(f"{path}[]", data_type.elementType, as_json)
    elif isinstance(data_type, MapType) and not key:
        _check_type(f"{path} (its keys)", data_type.keyType, as_json, key=True)
        _check_type(f"{path} (its values)", data_type.valueType, as_json)
    elif type(data_type).__name__ not in (_JSON_KEYS if key else _JSON) and as_json:
        what = "key a map in" if key else "be stored in"
        raise errors.InvalidArgumentError(
            f"column {path} is of type {data_type.simpleString()}, which cannot {what} an entry of a"
            " JSON-encoded queue: cast or drop it, or write to a queue of another encoding"
        )
    elif type(data_type).__name__ not in (_KEYS if key else _STORABLE):
        what = "key a map in an entry" if key else "be stored in an entry"
        raise errors.InvalidArgumentError(
            f"column {path} is of type {data_type.simpleString()}, which cannot {what}: cast or drop it"
            " before writing to a queue"
        )


def _converter(data_type: DataType) -> Convert:
    """A function from a value of ``data_type`` (as PySpark hands it over) to an Aerospike-native one."""
    if isinstance(data_type, StructType):
        fields = [(field.name, _converter(field.dataType)) for field in data_type.fields]

        def struct(value: Any) -> Any:
            if value is None:
                return None
            return {name: convert(value[name]) for name, convert in fields}

        return struct
    if isinstance(data_type, ArrayType):
        element = _converter(data_type.elementType)
        return lambda value: None if value is None else [element(item) for item in value]
    if isinstance(data_type, MapType):
        key, item = _converter(data_type.keyType), _converter(data_type.valueType)
        return lambda value: None if value is None else {key(k): item(v) for k, v in value.items()}
    if isinstance(data_type, TimestampType):
        return _instant
    return _plain


#: how far from the ends of Python's datetimes (year 1, year 9999) a neighbour's local offset is taken
_NEIGHBOUR = datetime.timedelta(days=2)


def _instant(value: datetime.datetime | None) -> str | None:
    """A ``timestamp`` (naive, in this worker's local time) as ISO 8601 in UTC."""
    if value is None:
        return None
    try:
        return value.astimezone(datetime.timezone.utc).isoformat()
    # within a day of either end of the range, Python's search for the local offset steps past it
    except (OverflowError, ValueError):
        neighbour = value + _NEIGHBOUR if value.year == 1 else value - _NEIGHBOUR
        offset = neighbour.astimezone().utcoffset() or datetime.timedelta()
    try:
        return (value - offset).replace(tzinfo=datetime.timezone.utc).isoformat()
    except OverflowError:
        raise errors.UnsupportedEntryError(
            f"timestamp {value.isoformat()} (this worker's local time) is outside years 1 to 9999 in UTC,"
            " which an entry cannot hold: run workers in UTC (TZ=UTC) or filter it out"
        ) from None


def _plain(value: Any) -> Any:
    """A value of any other type, as Aerospike stores it."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


__all__ = ["check_writable", "entry_maker"]
