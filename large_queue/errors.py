"""The one error tree of large_queue.

Every error the library raises derives from :class:`LargeQueueError`. Store
errors (from Aerospike or the embedded store) are mapped to the
:class:`BackendError` branch through one table in each backend, so callers see
the same classes whichever store they use. Errors are picklable with all their
details: Spark ships an executor's error to the driver by pickling it.

``LargeQueueError`` also carries ``reason`` (its message), so code written
against the original ``ASAborted`` exception keeps working: ``ASAborted`` is
an alias of the root class.
"""

from __future__ import annotations

from typing import Any


class LargeQueueError(Exception):
    """Root of every error raised by large_queue.

    Keyword details given to the constructor become attributes
    (``err.txn_id``, ``err.in_doubt``, ...) and survive pickling.
    """

    def __init__(self, message: str | None = None, **details: Any) -> None:
        if message is None:  # ASAborted(reason=...), as the original exception was made
            message = str(details.pop("reason", ""))
        super().__init__(message)
        self.__dict__.update(details)

    @property
    def reason(self) -> str:
        """The message, as the original ``ASAborted.reason`` exposed it."""
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.reason,), dict(self.__dict__))


# --- bad input -------------------------------------------------------------


class InvalidArgumentError(LargeQueueError, ValueError):
    """A parameter has a value the library cannot accept (nothing was written)."""


class UnsupportedEntryError(LargeQueueError, TypeError):
    """An entry holds a value of a type the store cannot keep (nothing was written)."""


class EntryTooLargeError(LargeQueueError, ValueError):
    """An entry is larger than one slot of its buffer record can hold (nothing was written)."""


# --- queue-level outcomes --------------------------------------------------


class QueueError(LargeQueueError):
    """A queue operation could not be carried out."""


class QueueExistsError(QueueError):
    """``create`` was asked for a queue that already exists."""


class QueueNotFoundError(QueueError):
    """The queue's metadata record does not exist."""


class QueueFullError(QueueError):
    """The queue holds ``capacity`` entries and overwriting was not allowed."""


class CorruptQueueError(QueueError):
    """A metadata or buffer record does not have the shape the queue expects."""


class LockError(QueueError):
    """Base of the errors about the queue lock."""


class LockNotAcquiredError(LockError):
    """The queue lock stayed held by others for the whole acquire timeout."""


class LockLostError(LockError):
    """This holder's lock was broken (it expired and another holder took it).

    Nothing this holder wrote became visible: its buffer writes were refused
    by fencing or are beyond the committed tail, and its commit was refused.
    ``taken_back`` is True where the lock passed to another call carrying the
    same txn id (a call made again before the first had ended): the txn's
    outcome is then that call's, which ``queue.outcome(txn_id)`` tells.
    """


class ReservationClosedError(QueueError):
    """An append was not published before readers closed its offsets (or overwriting producers reused them).

    Nothing of the append is visible, and it will never become visible:
    appending the same entries again is safe.
    """


class EntriesGoneError(QueueError):
    """A dequeue repeated with its txn id committed the first time, but its entries are no longer stored.

    ``offsets`` is the range the first call removed. A lock-mode queue erases
    dequeued slots at the next dequeue from their record; any queue reuses
    them a lap later. The entries were delivered to the first call only.
    """

    offsets: range | None = None


class OwnershipLostError(QueueError):
    """This node no longer owns the queue: a commit or ack under its old epoch was refused.

    Entries it delivered and had not acked are redelivered by the new owner.
    """


class GroupsInUseError(QueueError):
    """The queue is consumed by consumer groups: destructive dequeues and the ungrouped consumer are refused.

    Every group must see every entry, so nothing may remove entries behind
    their backs. Delete the groups (``large-queue groups NAME --delete G``) to
    dequeue directly again.
    """


class GroupNotFoundError(QueueError):
    """No consumer group of that name exists on the queue."""


class DataLossError(QueueError):
    """Entries a consumer had not acked are gone: overwritten, or dropped for their age.

    Overwritten by producers that append with ``overwrite_if_full``, or
    dropped from the head for being older than the queue's ``max_age``.

    ``lost`` runs from the first offset lost to the last (entries acked
    between them, where the losses are not one run, are not lost: ``count``
    says how many were). The loss is recorded in the group
    (its ``lost`` count) before this is raised, so the next receive goes on
    after the lost range.
    """

    lost: range | None = None


class DeliveryExpiredError(QueueError):
    """A message was delivered again since (its visibility timeout passed, or it was nacked).

    Only the latest delivery of an entry may be acked, nacked or extended.
    """


class OutcomeUnknownError(QueueError):
    """A write timed out after it may have been applied (``in_doubt``).

    The library never retries such a write blindly. ``txn_id`` names the
    operation, ``stage`` says which step was in doubt and ``detail`` what is
    known about the outcome; ``offsets`` (enqueue) or ``entries`` (dequeue)
    are what the operation would have added or removed.
    """

    txn_id: str | None = None
    stage: str = ""
    detail: str = ""
    offsets: range | None = None
    entries: tuple[Any, ...] | list[Any] = ()


# --- store-level errors ----------------------------------------------------


class BackendError(LargeQueueError):
    """The store refused or failed a command; ``code`` is the store's result code.

    ``in_doubt`` is True when the command may have been applied anyway.
    """

    code: int | None = None
    in_doubt: bool = False


class RecordNotFoundError(BackendError):
    """The record does not exist."""


class RecordExistsError(BackendError):
    """A create-only write found the record already there."""


class GenerationMismatchError(BackendError):
    """A write guarded by a generation check found another generation."""


class ConditionNotMetError(BackendError):
    """A command's condition (Aerospike filter expression) was false; nothing was applied."""


class CorruptRecordError(BackendError):
    """A record's stored data cannot be read back (damaged bytes, or values the client cannot decode)."""


class StoreFileError(BackendError):
    """The embedded store's file cannot be used: missing directory, not a store, damaged, read-only."""


class RecordTooLargeError(BackendError):
    """The record would exceed the store's record size limit; nothing was applied."""


class BinNameError(BackendError):
    """A bin name is longer than 15 bytes or otherwise invalid."""


class BinTypeError(BackendError):
    """An operation does not apply to the type of value held in the bin."""


class NamespaceNotFoundError(BackendError):
    """The namespace is not configured on the store."""


class BackendTimeoutError(BackendError):
    """The command timed out. ``in_doubt`` is True when it may have been applied."""


class BackendBusyError(BackendError):
    """The store is overloaded (hot key, full device); the command was not applied."""


class BackendUnavailableError(BackendError):
    """The store cannot be reached (connection or cluster error)."""


class BackendUsageError(BackendError):
    """The store rejected the command as malformed (a client-side parameter error)."""
