"""Creating, opening and deleting queues: the records a queue is made of, written and removed in order.

A create claims the name with a create-only metadata record (``ready`` 0),
writes the buffer records (noting its progress every
:data:`CREATE_PROGRESS_EVERY`), and only then sets ``ready``: an interrupted
create is reported as such and deleted in proportion to what it made.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

from large_queue import _records as rec
from large_queue import errors
from large_queue._entries import (
    NATIVE,
    RECORD_OVERHEAD_BYTES,
    SLOT_OVERHEAD_BYTES,
    check_encoding,
    max_entry_bytes,
)
from large_queue._retention import check_max_age
from large_queue.backends import Backend, RecordKey, Write, WriteMode
from large_queue.fencing import same_queue

MIN_ENTRY_BYTES = 16
MIN_RECORD_SIZE_LIMIT = 8192
# the default number of slots per record leaves each slot at least this much room
DEFAULT_MIN_SLOT_BYTES = 1024
# Buffer records a queue may have. Creating and deleting a queue take one command per
# buffer record (about 100 s for a million on Aerospike here), and each record holds
# 64 bytes of Aerospike's primary index in memory on every node.
MAX_RECORD_COUNT = 1_000_000
#: bounds of the receipt log: a receipt of the longest txn id takes about 170 bytes of the metadata record,
#: and the log of closed runs beside it (as many, at most) about 30 more each
MIN_RECEIPTS = 2
MAX_RECEIPTS = 4000
RECEIPT_BYTES = 200
#: a create records its progress every this many buffer records, so that deleting
#: an interrupted create touches only the records it made
CREATE_PROGRESS_EVERY = 1000


def positive_int(name: str, value: object) -> int:
    """``value`` if it is a positive int, else ``InvalidArgumentError`` naming ``name``."""
    if type(value) is not int or value < 1:
        raise errors.InvalidArgumentError(f"{name} must be a positive int, got {value!r}")
    return value


def flag(name: str, value: object) -> bool:
    """``value`` if it is a bool, else ``InvalidArgumentError`` naming ``name`` (``"false"`` is truthy)."""
    if type(value) is not bool:
        raise errors.InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    return value


def seconds(name: str, value: object, *, most: float = 86400.0, zero: bool = False) -> float:
    """``value`` if it is a number of seconds, positive (or 0 with ``zero``) and at most ``most``.

    Else ``InvalidArgumentError`` naming ``name``: a bool, a string, NaN or
    infinity is refused, not turned into an ``OverflowError`` or a spin later.
    """
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not (number >= 0 if zero else number > 0) or not number <= most:
        least = ">= 0" if zero else "> 0"
        raise errors.InvalidArgumentError(
            f"{name} must be a number of seconds {least} and <= {most:g}, got {value!r}"
        )
    return float(number)


def check_options(
    name: str,
    *,
    capacity: int,
    slots_per_record: int | None,
    lock_ttl: float,
    record_size_limit: int | None,
    appends: str,
    hole_timeout: float,
) -> None:
    """The checks of :func:`create` that need no store: ``InvalidArgumentError`` naming the first bad option.

    The command line makes them before it opens a store (which makes an
    embedded store's file).
    """
    rec.check_name("queue name", name, rec.MAX_QUEUE_NAME_BYTES)
    positive_int("capacity", capacity)
    if slots_per_record is not None:
        positive_int("slots_per_record", slots_per_record)
    if type(lock_ttl) not in (int, float) or not 0.001 <= lock_ttl <= 86400:
        raise errors.InvalidArgumentError(f"lock_ttl must be 0.001 to 86400 seconds, got {lock_ttl!r}")
    if appends not in (rec.LOCKED_APPENDS, rec.RESERVED_APPENDS):
        raise errors.InvalidArgumentError(
            f"appends must be {rec.RESERVED_APPENDS!r} or {rec.LOCKED_APPENDS!r}, got {appends!r}"
        )
    if type(hole_timeout) not in (int, float) or not 0.001 <= hole_timeout <= 86400:
        raise errors.InvalidArgumentError(
            f"hole_timeout must be 0.001 to 86400 seconds, got {hole_timeout!r}"
        )
    if record_size_limit is not None and (
        type(record_size_limit) is not int or record_size_limit < MIN_RECORD_SIZE_LIMIT
    ):
        raise errors.InvalidArgumentError(
            f"record_size_limit must be an int of at least {MIN_RECORD_SIZE_LIMIT} bytes,"
            f" got {record_size_limit!r}"
        )


def create(
    backend: Backend,
    name: str,
    *,
    capacity: int,
    slots_per_record: int | None,
    namespace: str | None,
    buffer_namespace: str | None,
    lock_ttl: float,
    record_size_limit: int | None,
    encoding: str,
    appends: str,
    hole_timeout: float,
    receipts: int | None = None,
    receipt_ttl: float = rec.DEFAULT_RECEIPT_AGE,
    max_age: float | None = None,
) -> str:
    """Check the options, then write a new queue's records; returns its namespace.

    See ``Queue.create`` for the options; ``QueueExistsError`` if the name is taken.
    """
    check_options(
        name,
        capacity=capacity,
        slots_per_record=slots_per_record,
        lock_ttl=lock_ttl,
        record_size_limit=record_size_limit,
        appends=appends,
        hole_timeout=hole_timeout,
    )
    namespace = rec.check_name("namespace", namespace or backend.default_namespace, rec.MAX_NAMESPACE_BYTES)
    buffer_namespace = rec.check_name(
        "buffer namespace", buffer_namespace or namespace, rec.MAX_NAMESPACE_BYTES
    )
    encoding = check_encoding(encoding)
    store_limit = backend.max_record_bytes(buffer_namespace)
    if store_limit < MIN_RECORD_SIZE_LIMIT:
        raise errors.InvalidArgumentError(
            f"the store's records hold at most {store_limit} bytes in namespace {buffer_namespace!r};"
            f" a queue needs at least {MIN_RECORD_SIZE_LIMIT}"
        )
    metadata_limit = backend.max_record_bytes(namespace)
    if receipts is None:  # as many as the default, or as fit the metadata record
        fitting = (metadata_limit - RECORD_OVERHEAD_BYTES) // RECEIPT_BYTES
        receipts = max(MIN_RECEIPTS, min(rec.DEFAULT_RECEIPT_KEEP, fitting))
    if type(receipts) is not int or not MIN_RECEIPTS <= receipts <= MAX_RECEIPTS:
        raise errors.InvalidArgumentError(
            f"receipts must be an int from {MIN_RECEIPTS} to {MAX_RECEIPTS:,}, got {receipts!r}"
        )
    if receipts * RECEIPT_BYTES + RECORD_OVERHEAD_BYTES > metadata_limit:
        raise errors.InvalidArgumentError(
            f"receipts={receipts} may not fit the metadata record: namespace {namespace!r} holds records"
            f" of at most {metadata_limit} bytes, and a receipt takes up to {RECEIPT_BYTES}"
        )
    if type(receipt_ttl) not in (int, float) or not 1 <= receipt_ttl <= 30 * 86400:
        raise errors.InvalidArgumentError(
            f"receipt_ttl must be 1 to {30 * 86400} seconds (30 days), got {receipt_ttl!r}"
        )
    max_age_ms = check_max_age(max_age)
    if record_size_limit is None:
        record_size_limit = store_limit
    elif record_size_limit > store_limit:
        raise errors.InvalidArgumentError(
            f"record_size_limit={record_size_limit} is more than the store's records hold in namespace"
            f" {buffer_namespace!r} ({store_limit} bytes)"
        )
    if slots_per_record is None:
        fitting = (record_size_limit - RECORD_OVERHEAD_BYTES) // (
            DEFAULT_MIN_SLOT_BYTES + SLOT_OVERHEAD_BYTES
        )
        slots_per_record = max(1, min(capacity, 100, fitting))
    entry_limit = max_entry_bytes(record_size_limit, slots_per_record)
    if entry_limit < MIN_ENTRY_BYTES:
        raise errors.InvalidArgumentError(
            f"slots_per_record={slots_per_record} leaves {entry_limit} bytes per entry in a"
            f" {record_size_limit}-byte record; use fewer slots per record"
        )
    record_count = math.ceil(capacity / slots_per_record)
    if record_count > MAX_RECORD_COUNT:
        raise errors.InvalidArgumentError(
            f"capacity={capacity} needs {record_count:,} buffer records of {slots_per_record} slots;"
            f" a queue has at most {MAX_RECORD_COUNT:,} (creating and deleting it take a command per"
            " record, and each holds index memory on every node): use more slots per record or a"
            " smaller capacity",
        )
    keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=buffer_namespace)
    incarnation = os.urandom(8).hex()
    metadata_bins = {
        rec.FORMAT: rec.FORMAT_VERSION if encoding == NATIVE else rec.ENCODED_FORMAT_VERSION,
        rec.READY: 0,
        rec.CREATED: 0,
        rec.HEAD: 0,
        rec.TAIL: 0,
        rec.LOCK_OWNER: rec.NO_OWNER,
        rec.LOCK_TTL_MS: max(1, round(lock_ttl * 1000)),
        rec.FENCE_EPOCH: 0,
        rec.FENCE_COUNTER: 0,
        rec.RECORD_COUNT: record_count,
        rec.SLOTS_PER_RECORD: slots_per_record,
        rec.BUFFER_NAMESPACE: buffer_namespace,
        rec.MAX_ENTRY_BYTES: entry_limit,
        rec.INCARNATION: incarnation,
        rec.RECEIPT_KEEP: receipts,
        rec.RECEIPT_AGE_MS: round(receipt_ttl * 1000),
    }
    if max_age_ms is not None:
        metadata_bins[rec.MAX_AGE_MS] = max_age_ms
    reserved = appends == rec.RESERVED_APPENDS
    if reserved:
        metadata_bins[rec.FORMAT] = rec.MARKED_FORMAT_VERSION
        metadata_bins[rec.SKIPPED_TO] = 0
        metadata_bins[rec.HOLE_MS] = max(1, round(hole_timeout * 1000))
        metadata_bins[rec.PUBLISHED] = 0
        metadata_bins[rec.LOCK_AT] = 0
    if encoding != NATIVE or reserved:
        metadata_bins[rec.ENCODING] = encoding
    # The create-only metadata write claims the name; buffers come next and
    # the queue becomes usable only when ``ready`` is set, so an interrupted
    # create is reported as such instead of looking like a broken queue.
    try:
        backend.put(keys.metadata, metadata_bins, mode=WriteMode.CREATE_ONLY)
    except errors.RecordExistsError:
        existing = backend.get(keys.metadata, [rec.DELETING])
        going = " (it is being deleted, or its delete was interrupted: delete it again)"
        raise errors.QueueExistsError(
            f"queue {name!r} already exists in namespace {namespace!r}"
            f"{going if existing is not None and existing.bins.get(rec.DELETING) else ''}",
            queue=name,
        ) from None
    empty_buffer = rec.empty_buffer(slots_per_record, (0, 0), incarnation, reserved=reserved)
    try:
        for index in range(record_count):
            backend.put(keys.buffer(index), empty_buffer)
            if (index + 1) % CREATE_PROGRESS_EVERY == 0:
                backend.put(keys.metadata, {rec.CREATED: index + 1}, mode=WriteMode.UPDATE_ONLY)
    except BaseException:
        with contextlib.suppress(errors.LargeQueueError):  # what it can; a later delete does the rest
            delete(backend, name, namespace)
        raise
    backend.put(keys.metadata, {rec.READY: 1}, mode=WriteMode.UPDATE_ONLY)
    return namespace


def read_metadata(backend: Backend, name: str, namespace: str) -> rec.Metadata:
    """The queue's metadata record, validated; ``QueueNotFoundError`` if there is none."""
    keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=namespace)
    try:
        record = backend.get(keys.metadata, rec.STATE_BINS)  # not the receipt log: it may be 100s of KB
    except errors.CorruptRecordError as exc:
        raise errors.CorruptQueueError(
            f"the metadata record of queue {name!r} cannot be read ({exc})", queue=name
        ) from exc
    if record is None:
        raise errors.QueueNotFoundError(
            f"queue {name!r} does not exist in namespace {namespace!r}", queue=name
        )
    if record.bins.get(rec.DELETING):
        raise errors.QueueNotFoundError(
            f"queue {name!r} in namespace {namespace!r} is being deleted (or its delete was interrupted:"
            " Queue.delete, or large-queue delete, finishes it)",
            queue=name,
        )
    return rec.parse_metadata(name, record.bins)


def delete(backend: Backend, name: str, namespace: str | None) -> bool:
    """Delete a queue's records (see ``Queue.delete``); False if it did not exist."""
    rec.check_name("queue name", name, rec.MAX_QUEUE_NAME_BYTES)
    namespace = rec.check_name("namespace", namespace or backend.default_namespace, rec.MAX_NAMESPACE_BYTES)
    keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=namespace)
    while True:
        try:
            record = backend.get(keys.metadata)
        except errors.CorruptRecordError:  # its shape is unreadable: buffers are removed until one is missing
            backend.remove(keys.metadata)
            index = 0
            while backend.remove(keys.buffer(index)):
                index += 1
            remove_ownership(backend, keys.group(None))
            return True
        if record is None:
            return False
        # Marked first, removed last. The timeline it must not meet:
        #   t=0  a delete removes the metadata record, then buffers 0..999 of 300,000.
        #   t=1  it is interrupted (Ctrl-C, a crash, the store unreachable).
        #   t=2  nothing says the other 299,000 exist: no delete, check or list finds them again.
        # Marked, the queue is gone for every handle (its incarnation changes: their commands are
        # refused) and for every open, while the record still says what to remove; a later delete
        # finds it and finishes.
        # The mark is guarded by the incarnation read: a record that changed since (another
        # delete finished, and the name was created again) is read again, and its own shape is
        # what the buffers to remove are counted from.
        first = next(_existing_buffers(record.bins, name, namespace), None)
        if first is not None:  # a store without the buffers' namespace refuses it before anything is marked
            with contextlib.suppress(errors.CorruptRecordError):  # (its namespace is there: removed below)
                backend.get(first)
        incarnation = record.bins.get(rec.INCARNATION)
        marks = {rec.DELETING: 1, rec.INCARNATION: _DELETING}
        try:
            if isinstance(incarnation, str):
                backend.operate(
                    keys.metadata,
                    [Write(bin_name, value) for bin_name, value in marks.items()],
                    condition=same_queue(incarnation),
                )
            else:  # a queue of a format before incarnations: nothing tells its creations apart
                backend.put(keys.metadata, marks, mode=WriteMode.UPDATE_ONLY)
        except errors.RecordNotFoundError:
            return False  # another delete finished first
        except errors.ConditionNotMetError:
            continue
        for key in _existing_buffers(record.bins, name, namespace):
            backend.remove(key)
        groups = record.bins.get(rec.GROUPS)
        for group in groups if isinstance(groups, list) else []:
            if isinstance(group, str):
                remove_ownership(backend, keys.group(group))
        remove_ownership(backend, keys.group(None))
        backend.remove(keys.metadata)
        return True


#: the incarnation a queue being deleted has: no handle's (they are random hex)
_DELETING = "deleting"


def remove_ownership(backend: Backend, keys: rec.OwnerKeys) -> None:
    """Remove one cursor's ownership records: its owner record, its node list, its nodes' heartbeats.

    The owner record goes first. A node's heartbeat that finds its own
    record gone reads the owner record, and joins again where it is there
    (a group made anew): the timeline it must not meet is

        t=0  a delete removes node n's record and the node list.
        t=1  n's heartbeat finds its record gone, finds the owner record
             (not removed yet) and joins: its record and the list are back.
        t=2  the delete removes the owner record: the two outlive the group.

    With the owner record gone first, such a heartbeat finds it gone and
    writes nothing; one that lands before the node records go is undone
    when they go.
    """
    nodes = backend.get(keys.nodes)
    node_ids = nodes.bins.get(rec.NODES) if nodes is not None else None
    backend.remove(keys.owner)
    backend.remove(keys.nodes)
    for node_id in node_ids if isinstance(node_ids, list) else []:
        if isinstance(node_id, str):
            backend.remove(keys.node(node_id))


def _existing_buffers(metadata: dict[str, Any], name: str, namespace: str) -> Iterator[RecordKey]:
    """Keys of the buffer records a queue's metadata says exist (an interrupted create made only some)."""
    record_count = metadata.get(rec.RECORD_COUNT)
    buffer_namespace = metadata.get(rec.BUFFER_NAMESPACE, namespace)
    if type(record_count) is not int or not isinstance(buffer_namespace, str):
        return
    created = metadata.get(rec.CREATED)
    if metadata.get(rec.READY) != 1 and type(created) is int:
        record_count = min(record_count, created + CREATE_PROGRESS_EVERY)
    keys = rec.QueueKeys(name=name, metadata_namespace=namespace, buffer_namespace=buffer_namespace)
    for index in range(record_count):
        yield keys.buffer(index)
