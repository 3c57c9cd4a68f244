"""Buffer records into Arrow record batches: the hot loop of a Spark read.

A task reads its segment in chunks of ``RECORDS_PER_BATCH_GET`` buffer
records, one batch get each, and turns every chunk into one Arrow record
batch. The cost that shapes this module is Python objects: decoding a row
into Python values cannot be avoided, so everything after it works a chunk at
a time in C. Slots are transposed into columns with ``zip``, a chunk's values
become JSON in one ``orjson`` call, and Arrow compute splits that text into
rows. No Python function is called once per row.

A queue whose entries are stored as JSON (``encoding="json"``) skips the
decoding of values altogether: its stored text is the ``value`` column, which
cuts the work per row by about 40%. Its entries are decoded only for columns
that need the values themselves (``valueFormat=binary``, a user schema).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
from collections.abc import Iterator
from typing import Any

import msgspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from large_queue import _records as rec
from large_queue import errors
from large_queue._entries import JSON, MSGPACK, NATIVE, bytes_as_json, decode_entry, json_keys
from large_queue.queue import Queue
from large_queue.spark._options import data_loss, recreated

log = logging.getLogger("large_queue.spark")

META_COLUMNS = ("queue", "offset", "enqueued_at", "value")
# 100 records of 100 slots: 10,000 rows a batch get and an Arrow batch. Larger
# chunks read no faster (the decoded objects outgrow the CPU caches).
RECORDS_PER_BATCH_GET = 100

_MSGPACK = msgspec.msgpack.Encoder()
# A raw newline between values: orjson copies a Fragment verbatim, and JSON text
# never holds an unescaped newline, so the output splits into one piece a value.
_ROW_END = orjson.Fragment(b"\n")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while one chunk is decoded.

    A chunk creates tens of thousands of containers that all stay alive until
    its Arrow batch is built; the collector would scan them over and over and
    free none (a third of the read's time, measured). Reference counting still
    frees every object; the collector's previous state is restored on exit.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclasses.dataclass
class Rows:
    """The live slots of one chunk, as columns."""

    offsets: list[int] = dataclasses.field(default_factory=list)
    values: list[Any] = dataclasses.field(default_factory=list)
    times: list[int] = dataclasses.field(default_factory=list)

    def add(self, slots: list[Any], first: int, lo: int, hi: int, lost: list[int]) -> None:
        """Take offsets [lo, hi) from ``slots`` (offset ``lo`` is slot ``first``).

        A slot holding another offset (a later lap overwrote it, or the slot
        was erased) is added to ``lost`` instead.
        """
        window = slots[first : first + hi - lo]
        try:
            offsets, values, times = zip(*window, strict=True)
        except (TypeError, ValueError):  # an erased slot (None) or a malformed one
            offsets = ()
        if offsets == tuple(range(lo, hi)):  # the common case: every slot holds its entry
            self.offsets.extend(offsets)
            self.values.extend(values)
            self.times.extend(times)
            return
        for index, offset in enumerate(range(lo, hi)):
            slot = window[index] if index < len(window) else None
            if isinstance(slot, list) and len(slot) == 3 and slot[0] == offset:
                self.offsets.append(offset)
                self.values.append(slot[1])
                self.times.append(slot[2])
            else:
                lost.append(offset)

    def add_settled(
        self, queue: Queue, slots: list[Any], first: int, lo: int, hi: int, lost: list[int]
    ) -> None:
        """:meth:`add` for a queue with lock-free appends: its entries, without closed reservations.

        Offsets a later lap overwrote (parts of a spanning batch whose last
        slot it overwrote included), and any past a hole (which the planned
        range never reaches), are added to ``lost``.
        """
        settled = queue.prefix.settle(lo, hi, lambda offset: slots[first + offset - lo])
        for offset, value, enqueued_at_ms in settled.entries:
            self.offsets.append(offset)
            self.values.append(value)
            self.times.append(enqueued_at_ms)
        lost.extend(settled.overwritten)
        lost.extend(range(settled.end, hi))


def json_column(queue: str, offsets: list[int], values: list[Any]) -> pa.Array:
    """Every value as JSON text (bytes as ``{"$bytes": base64}``), from one orjson call.

    The values are interleaved with ``_ROW_END``, so the text reads
    ``[v0,\\n,v1,\\n,...,\\n]``; split on newlines, each piece is one value with
    one separator character on either side. A float JSON has no number for
    is written as the token Spark's JSON reader takes for it (``NaN``,
    ``Infinity``, ``-Infinity``, as ``from_json`` reads by default): orjson
    would write ``null``, so text holding ``null`` is looked at again.
    """
    interleaved = [_ROW_END] * (2 * len(values))
    interleaved[::2] = values
    text = _dumps(queue, offsets, interleaved)
    if b"null" in text:
        spelled = [_spelled(value) for value in values]
        if any(new is not old for new, old in zip(spelled, values, strict=True)):
            interleaved[::2] = spelled
            text = _dumps(queue, offsets, interleaved)
    pieces = pc.split_pattern(pa.array([text], pa.binary()), b"\n").flatten()
    return pc.binary_slice(pieces.slice(0, len(values)), 1, -1).cast(pa.string())


def _dumps(queue: str, offsets: list[int], interleaved: list[Any]) -> bytes:
    """One orjson call over a chunk's values (see :func:`json_column`)."""
    try:
        try:
            return orjson.dumps(interleaved, default=bytes_as_json)
        except TypeError:  # a dict with int or bytes keys: the slower option writes them as strings
            keyed = [json_keys(value) for value in interleaved]
            return orjson.dumps(keyed, default=bytes_as_json, option=orjson.OPT_NON_STR_KEYS)
    except TypeError as exc:
        raise errors.UnsupportedEntryError(
            f"entries of queue {queue!r} (offsets {offsets[0]}..{offsets[-1]}) cannot be shown as JSON:"
            f" {exc}; read them with valueFormat=binary"
        ) from None


_NAN = orjson.Fragment(b"NaN")
_INFINITIES = {math.inf: orjson.Fragment(b"Infinity"), -math.inf: orjson.Fragment(b"-Infinity")}


def _spelled(value: Any) -> Any:
    """``value`` with its non-finite floats as Spark's JSON tokens; ``value`` itself if it holds none."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else _INFINITIES.get(value, _NAN)
    if kind is dict:
        items = {key: _spelled(item) for key, item in value.items()}
        return value if all(items[key] is item for key, item in value.items()) else items
    if kind is list:
        elements = [_spelled(item) for item in value]
        return value if all(new is old for new, old in zip(elements, value, strict=True)) else elements
    return value


def stored_column(queue: str, rows: Rows, encoding: str) -> pa.Array:
    """What a JSON- or msgpack-encoded queue stores, as it is (JSON text, msgpack bytes): none decoded."""
    try:
        column = pa.array(rows.values, pa.binary())
        if encoding == JSON:
            column = column.view(pa.string())
            column.validate(full=True)  # UTF-8, as Spark strings must be
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise errors.CorruptQueueError(
            f"queue {queue!r} (offsets {rows.offsets[0]}..{rows.offsets[-1]}) holds a slot that is not"
            f" {encoding} bytes: {exc}",
            queue=queue,
        ) from None
    return column


def decoded_values(queue: str, rows: Rows, encoding: str) -> list[Any]:
    """The entries themselves, for columns that need more than a queue's stored bytes."""
    if encoding == NATIVE:
        return rows.values
    try:
        return [decode_entry(encoding, value) for value in rows.values]
    except ValueError as exc:
        raise errors.CorruptQueueError(
            f"queue {queue!r} (offsets {rows.offsets[0]}..{rows.offsets[-1]}) holds no valid entry: {exc}",
            queue=queue,
        ) from None


def record_batch(
    queue: str,
    value_format: str,
    schema: StructType,
    arrow_schema: pa.Schema,
    rows: Rows,
    encoding: str = NATIVE,
) -> pa.RecordBatch:
    """The Arrow record batch of ``rows`` (stored as ``encoding`` keeps entries) in ``schema``'s columns."""
    columns: dict[str, pa.Array] = {}
    names = schema.fieldNames()
    count = len(rows.offsets)
    others = [name for name in names if name not in META_COLUMNS]
    as_stored = (encoding, value_format) in ((JSON, "json"), (MSGPACK, "binary"))
    needs_entries = others or ("value" in names and not as_stored)
    values = decoded_values(queue, rows, encoding) if needs_entries else rows.values
    if "queue" in names:
        columns["queue"] = pa.repeat(pa.scalar(queue, pa.string()), count)
    if "offset" in names:
        first = rows.offsets[0]
        if rows.offsets[-1] - first + 1 == count:  # increasing offsets with no gap: built in C
            columns["offset"] = pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), count), start=first - 1)
        else:
            columns["offset"] = pa.array(rows.offsets, pa.int64())
    if "enqueued_at" in names:
        millis = pa.array(rows.times, pa.int64()).cast(pa.timestamp("ms"))
        columns["enqueued_at"] = millis.cast(arrow_schema.field("enqueued_at").type)
    if "value" in names:
        if as_stored:
            columns["value"] = stored_column(queue, rows, encoding)
        elif value_format == "binary":
            columns["value"] = pa.array(list(map(_MSGPACK.encode, values)), pa.binary())
        else:
            columns["value"] = json_column(queue, rows.offsets, values)
    if others:
        dicts = [v if isinstance(v, dict) else {} for v in values]
        _refuse_truncation(queue, rows.offsets, dicts, [arrow_schema.field(name) for name in others])
        fitted = [{name: row.get(name) for name in others} for row in dicts]
        fields = pa.schema([arrow_schema.field(name) for name in others])
        try:
            parsed = pa.RecordBatch.from_pylist(fitted, schema=fields)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            offset, why = _first_misfit(rows.offsets, fitted, fields) or (rows.offsets[0], exc)
            raise errors.InvalidArgumentError(
                f"the entry at offset {offset} of queue {queue!r} does not fit the given schema: {why}"
            ) from None
        for name in others:
            columns[name] = parsed.column(name)
    return pa.RecordBatch.from_arrays([columns[name] for name in names], schema=arrow_schema)


def _first_misfit(
    offsets: list[int], rows: list[dict[str, Any]], fields: pa.Schema
) -> tuple[int, Exception] | None:
    """The first of ``rows`` (read at ``offsets``) that Arrow refuses as ``fields``, and why.

    Looked for one row at a time once the chunk as a whole was refused.
    """
    for offset, row in zip(offsets, rows, strict=True):
        try:
            pa.RecordBatch.from_pylist([row], schema=fields)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            return offset, exc
    return None


def _refuse_truncation(
    queue: str, offsets: list[int], dicts: list[dict[str, Any]], fields: list[pa.Field]
) -> None:
    """``InvalidArgumentError`` for a float with a fraction where the schema has an integer column.

    Arrow would keep its integer part (2.99 as 2) without a word; every other
    value that does not fit its column is refused by Arrow itself.
    """
    checked = [field for field in fields if _has_integers(field.type)]
    for offset, row in zip(offsets, dicts, strict=True) if checked else ():
        for field in checked:
            if _truncated(row.get(field.name), field.type):
                raise errors.InvalidArgumentError(
                    f"the entry at offset {offset} of queue {queue!r} does not fit the given schema: field"
                    f" {field.name!r} ({field.type}) would lose the fraction of {row.get(field.name)!r}"
                )


def _has_integers(kind: pa.DataType) -> bool:
    """Whether ``kind`` is, or holds, an integer type."""
    if pa.types.is_integer(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_has_integers(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _has_integers(kind.key_type) or _has_integers(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_integers(kind.value_type)
    return False


def _truncated(value: Any, kind: pa.DataType) -> bool:
    """Whether Arrow would drop a fraction of ``value`` (or of a value inside it) as ``kind``."""
    if value is None:
        return False
    if pa.types.is_integer(kind):
        return type(value) is float and not value.is_integer()
    if pa.types.is_struct(kind) and isinstance(value, dict):
        return any(
            _truncated(value.get(kind.field(i).name), kind.field(i).type) for i in range(kind.num_fields)
        )
    if pa.types.is_map(kind) and isinstance(value, dict):
        return any(_truncated(k, kind.key_type) or _truncated(v, kind.item_type) for k, v in value.items())
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and isinstance(value, list):
        return any(_truncated(item, kind.value_type) for item in value)
    return False


def _chunk(
    queue: Queue,
    blocks: range,
    start: int,
    stop: int,
    lost: list[int],
    value_format: str,
    schema: StructType,
    arrow_schema: pa.Schema,
) -> pa.RecordBatch | None:
    """One batch get over ``blocks``, as one record batch (None if every slot was lost).

    The metadata record comes in the same batch get: if it is no longer the
    queue's creation the read began in (deleted, or deleted and created again,
    whose new entries take the same offsets), :class:`_Recreated` is raised
    and nothing of the chunk is kept.
    """
    per_record = queue.shape.slots_per_record
    keys = [queue.keys.buffer(queue.shape.record_of(block * per_record)) for block in blocks]
    records = queue.backend.batch_get([*keys, queue.keys.metadata])
    metadata = records.pop()
    if metadata is None or metadata.bins.get(rec.INCARNATION) != queue.incarnation:
        raise _Recreated
    rows = Rows()
    for block, record in zip(blocks, records, strict=True):
        lo = max(start, block * per_record)
        hi = min(stop, (block + 1) * per_record)
        slots = record.bins.get(rec.SLOTS) if record is not None else None
        if isinstance(slots, list) and queue.reserved:
            rows.add_settled(queue, slots, lo % per_record, lo, hi, lost)
        elif isinstance(slots, list):
            rows.add(slots, lo % per_record, lo, hi, lost)
        else:
            lost.extend(range(lo, hi))
    if not rows.offsets:
        return None
    return record_batch(queue.name, value_format, schema, arrow_schema, rows, queue.encoding)


class _Recreated(Exception):
    """The queue was deleted (and maybe created again) since the read began."""


def read_segment(
    queue: Queue,
    start: int,
    stop: int,
    *,
    value_format: str,
    fail_on_data_loss: bool,
    schema: StructType,
    incarnation: str | None,
) -> Iterator[pa.RecordBatch]:
    """Offsets [start, stop) of ``queue`` as Arrow record batches, one batch get per chunk.

    ``incarnation`` is the queue's creation the offsets were planned in: if
    the queue was deleted and created again since, its entries at those
    offsets are other entries, never read as these (an error, or with
    ``fail_on_data_loss`` off a warning and nothing more of the segment).
    """
    per_record = queue.shape.slots_per_record
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    first_block = start // per_record
    last_block = (stop - 1) // per_record
    lost: list[int] = []
    for chunk_start in range(first_block, last_block + 1, RECORDS_PER_BATCH_GET):
        blocks = range(chunk_start, min(chunk_start + RECORDS_PER_BATCH_GET, last_block + 1))
        try:
            if queue.incarnation != incarnation:
                raise _Recreated
            with collector_paused():  # the chunk's Python objects are freed before the collector resumes
                batch = _chunk(queue, blocks, start, stop, lost, value_format, schema, arrow_schema)
        except _Recreated:
            gone_from = max(start, chunk_start * per_record)
            if fail_on_data_loss:
                raise recreated(queue.name, gone_from, stop) from None
            log.warning(
                "queue %r was deleted or created again while it was read: offsets %d..%d skipped",
                queue.name,
                gone_from,
                stop - 1,
            )
            return
        if lost and fail_on_data_loss:
            raise data_loss(queue.name, lost[0], lost[-1] + 1)
        if batch is not None:
            yield batch
    if lost:
        log.warning(
            "queue %r: skipped %d entries no longer in the queue (%d..%d)",
            queue.name,
            len(lost),
            lost[0],
            lost[-1],
        )
