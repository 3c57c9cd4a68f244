"""The queue lock: held in the metadata record, broken when it expires.

One command acquires the lock: if the lock is free, or its holder has not
written the metadata record for longer than the lock TTL *as measured by the
store's clock* (``SinceUpdateTime`` on Aerospike), it sets the owner,
increments the fencing counter and returns head, tail and the new token.
Client clocks are never compared, so clients on machines whose clocks
disagree still agree on when a lock has expired.

The failure story, as a timeline (lock TTL 2 s)::

    t=0.0  A acquires: owner=A, token 7, head=10, tail=40.
    t=0.1  A pauses for 5 s.
    t=2.1  The metadata record has not been written for 2 s: the lock has
           expired. B's acquire breaks it: owner=B, token 8.
    t=2.2  B enqueues at offset 40 and commits tail=41 (owner=B, token 8 still
           current), releasing the lock.
    t=5.1  A resumes. Its buffer write is refused by fencing if B wrote the same
           record; its commit ("owner is A and the counter is still 7") is
           refused in every case. A gets LockLostError; nothing it did is
           visible.

A holder that needs longer than the TTL calls :meth:`QueueLock.renew`, which
rewrites the record (restarting the server-side clock) only while it still
holds the lock.

In a queue whose producers append without the lock (formats 3 and 4,
:mod:`large_queue.appends`), every reservation writes the metadata record, so
"time since the last write" says nothing about the holder. There the acquire
and every renewal store the store's own clock in ``lock_at`` (computed by the
store, in the same command), and the lock has expired when the store's clock
is more than the TTL past it: still one clock, the store's. Head is written
as the larger of the stored head and the holder's, because an overwriting
producer may have moved it meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from large_queue import errors
from large_queue._frozen import frozen
from large_queue._guarded import guarded_write
from large_queue._records import (
    DELETING,
    ERASED_BELOW,
    FENCE_COUNTER,
    FENCE_EPOCH,
    GROUPS,
    HEAD,
    INCARNATION,
    LOCK_AT,
    LOCK_OWNER,
    LOCK_TTL_MS,
    NO_OWNER,
    PUBLISHED,
    RECEIPTS,
    SKIPPED_TO,
    TAIL,
    QueueKeys,
)
from large_queue._stats import Counters
from large_queue.backends import (
    Backend,
    Compute,
    Evaluate,
    Increment,
    LogPut,
    MapGet,
    Operation,
    Read,
    ReadBeside,
    ReadSinceUpdate,
    Record,
    Write,
)
from large_queue.backends.conditions import (
    Bound,
    Condition,
    IntBin,
    NowMs,
    Param,
    SinceUpdateMs,
    StrBin,
    all_of,
    any_of,
    eq,
    gt,
    max_of,
    sub,
)
from large_queue.fencing import DEFAULT_COUNTER_LIMIT, FencingToken

log = logging.getLogger("large_queue")

#: what an in-doubt error tells the caller to do
RECOVERY = (
    "If the call carried your txn_id, queue.outcome(txn_id) tells whether it committed, and calling it"
    " again with the same txn_id is safe (an enqueue is not repeated, a dequeue returns the same entries)."
)


#: the longest wait a LockPolicy takes, in seconds (NaN and infinity are refused with it)
MOST_LOCK_WAIT = 86400.0


@dataclass(frozen=True, kw_only=True)
class LockPolicy:
    """How long and how often to try for a held lock.

    Attempts back off exponentially with full jitter from ``initial_wait``
    up to ``max_wait`` seconds, for at most ``acquire_timeout`` seconds.
    """

    acquire_timeout: float = 10.0
    initial_wait: float = 0.0005
    max_wait: float = 0.05

    def __post_init__(self) -> None:
        numbers = all(
            type(v) in (int, float) for v in (self.acquire_timeout, self.initial_wait, self.max_wait)
        )
        if not (
            numbers
            and 0 <= self.acquire_timeout <= MOST_LOCK_WAIT
            and 0 < self.initial_wait <= self.max_wait <= MOST_LOCK_WAIT
        ):
            raise errors.InvalidArgumentError(
                "LockPolicy needs 0 <= acquire_timeout and 0 < initial_wait <= max_wait, each at most"
                f" {MOST_LOCK_WAIT:g} s (a day), got {self!r}"
            )


@dataclass(frozen=True, kw_only=True)
class LockGrant:
    """What one successful acquire returned."""

    txn_id: str
    token: FencingToken
    head: int
    tail: int
    acquired_at: float  # time.monotonic() when granted: local durations only, never compared across machines
    erased_below: int = 0  # dequeued slots below this offset were already erased
    groups: tuple[str, ...] = ()  # the queue's consumer groups (see large_queue.cluster.groups)
    #: this txn's receipt as stored when it took the lock (asked for with ``receipt=True``), else None
    receipt: list[Any] | None = None
    #: the store's clock (ms) when the lock was taken: the ``enqueued_at_ms`` of the entries it enqueues,
    #: and the "now" that retention by age (``max_age``) judges the head's entries by
    now_ms: int = 0
    #: what the read sent beside the acquire saw (:meth:`QueueLock.holding`'s ``beside``), None if
    #: none was sent or it failed: a guess, read before or after the lock was taken
    beside: dict[str, Any] | None = None


#: the result under which a command reads the store's clock (ms), and the operation that reads it:
#: one object, so that stores build it once (the acquire, a reservation, an outcome lookup send it)
STORE_CLOCK = "now"
READ_STORE_CLOCK = Evaluate(STORE_CLOCK, NowMs())
#: what an acquire does besides naming its owner: a new token, and the state the holder needs
_TAKE_AND_READ = (
    Increment(FENCE_COUNTER, 1),
    Read(HEAD),
    Read(TAIL),
    Read(FENCE_EPOCH),
    Read(FENCE_COUNTER),
    Read(ERASED_BELOW),
    Read(GROUPS),
    READ_STORE_CLOCK,
)
#: the lock has no owner, or its owner has been silent longer than the TTL
_FREE_OR_EXPIRED = any_of(eq(StrBin(LOCK_OWNER), NO_OWNER), gt(SinceUpdateMs(), IntBin(LOCK_TTL_MS)))
#: ... where producers write the record without the lock: its holder last said so too long ago
_FREE_OR_EXPIRED_AT = any_of(
    eq(StrBin(LOCK_OWNER), NO_OWNER), gt(sub(NowMs(), IntBin(LOCK_AT)), IntBin(LOCK_TTL_MS))
)
#: ... or it is held by the txn that asks again: a caller retrying its own call after an in-doubt
#: outcome takes its lock back at once (its earlier attempt is fenced off by the new token)
_FREE_EXPIRED_OR_MINE = any_of(*_FREE_OR_EXPIRED.parts, eq(StrBin(LOCK_OWNER), Param("txn")))
_FREE_EXPIRED_OR_MINE_AT = any_of(*_FREE_OR_EXPIRED_AT.parts, eq(StrBin(LOCK_OWNER), Param("txn")))
_STAMP = Compute(LOCK_AT, NowMs())
#: the result name under which :meth:`Lock.expired` reads how long the holder has been silent
_SILENT = "silent_ms"
#: the result name under which an acquire reads the owner it replaces
_PREVIOUS_OWNER = "prev_owner"
#: ... and the operation that reads it (one object, so that stores compile it once)
_READ_PREVIOUS_OWNER = Evaluate(_PREVIOUS_OWNER, StrBin(LOCK_OWNER))
_HEAD_AT_LEAST = max_of(IntBin(HEAD), Param("head"))
_PUBLISHED_AT_LEAST = max_of(IntBin(PUBLISHED), Param("published"))
_SKIPPED_AT_LEAST = max_of(IntBin(SKIPPED_TO), Param("skipped"))


_HELD_BY = all_of(
    eq(StrBin(LOCK_OWNER), Param("owner")),
    eq(IntBin(FENCE_EPOCH), Param("epoch")),
    eq(IntBin(FENCE_COUNTER), Param("counter")),
)
#: ... in the queue as it was opened (queues created before incarnations were kept have none)
_HELD_BY_IN = all_of(*_HELD_BY.parts, eq(StrBin(INCARNATION), Param("incarnation")))


def replaced_error(queue: str, *, created_again: bool, deleting: bool = False) -> errors.QueueNotFoundError:
    """The error for a handle whose queue was deleted (and maybe created again) since it was opened.

    ``deleting``: the record found is that of a delete under way (or interrupted).
    """
    if deleting:
        return errors.QueueNotFoundError(
            f"queue {queue!r} is being deleted (or its delete was interrupted: deleting it again finishes"
            " it); nothing was written",
            queue=queue,
        )
    again = " and created again" if created_again else ""
    return errors.QueueNotFoundError(
        f"queue {queue!r} was deleted{again} since this handle opened it;"
        " nothing was written (open it again)",
        queue=queue,
    )


def gone_error(queue: str, found: Record | None) -> errors.QueueNotFoundError:
    """:func:`replaced_error` for the metadata record ``found`` in place of the handle's (None: none)."""
    return replaced_error(
        queue,
        created_again=found is not None,
        deleting=found is not None and bool(found.bins.get(DELETING)),
    )


class _Busy(Exception):
    """The lock is held and has not expired; try again."""


class QueueLock:
    """The lock of one queue's metadata record."""

    def __init__(
        self,
        backend: Backend,
        keys: QueueKeys,
        *,
        policy: LockPolicy = LockPolicy(),
        counter_limit: int = DEFAULT_COUNTER_LIMIT,
        incarnation: str | None = None,
        counters: Counters | None = None,
        stamped: bool = False,
    ) -> None:
        self.backend = backend
        #: where the lock's commands, waits, breaks and losses are counted
        self.counters = counters or Counters()
        self.keys = keys
        self.policy = policy
        self.counter_limit = counter_limit
        #: the queue this lock belongs to, as opened: commits are refused in a queue re-created since
        self.incarnation = incarnation
        #: expiry judged from ``lock_at`` (queues whose producers write the record without the lock)
        self.stamped = stamped
        self._free_or_expired = _FREE_OR_EXPIRED_AT if stamped else _FREE_OR_EXPIRED
        self._stamp: list[Operation] = [_STAMP] if stamped else []
        #: what an acquire does after naming its owner (built once: stores build its commands once)
        self._take_and_read: tuple[Operation, ...] = (*self._stamp, *_TAKE_AND_READ)

    @staticmethod
    def held_by(grant: LockGrant, incarnation: str | None = None) -> Condition:
        """The lock is still this grant's (same owner, no later token), in the queue ``incarnation``."""
        values: dict[str, int | str] = {
            "owner": grant.txn_id,
            "epoch": grant.token.epoch,
            "counter": grant.token.counter,
        }
        if incarnation is None:
            return Bound(_HELD_BY, values)
        return Bound(_HELD_BY_IN, {**values, "incarnation": incarnation})

    def replaced(self) -> errors.QueueNotFoundError | None:
        """The error for a queue deleted (or deleted and created again) since it was opened, else None.

        One read; called only after a guarded write was refused, to say why.
        """
        found = self._metadata_record()
        return found if isinstance(found, errors.QueueNotFoundError) else None

    def _metadata_record(self) -> Record | errors.QueueNotFoundError:
        """The metadata record, or the error if it is not the queue this lock was opened on. One read."""
        record = self.backend.get(self.keys.metadata)
        if record is None or record.bins.get(INCARNATION) != self.incarnation:
            return gone_error(self.keys.name, record)
        return record

    def expired(self) -> bool:
        """Whether the lock's holder has been silent for longer than its TTL (the next acquire breaks it).

        One read, of the metadata record, for the command line's gauges.
        """
        silent: Operation = (
            Evaluate(_SILENT, sub(NowMs(), IntBin(LOCK_AT))) if self.stamped else ReadSinceUpdate(_SILENT)
        )
        try:
            state = self.backend.operate(self.keys.metadata, [Read(LOCK_OWNER), Read(LOCK_TTL_MS), silent])
        except errors.RecordNotFoundError:
            raise self.replaced_error(created_again=False) from None
        owner, ttl_ms, silent_ms = state.get(LOCK_OWNER), state.get(LOCK_TTL_MS), state.get(_SILENT)
        return bool(owner) and type(ttl_ms) is int and type(silent_ms) is int and silent_ms > ttl_ms

    def why_lost(self, grant: LockGrant, what: str) -> errors.QueueError | None:
        """Why ``grant``'s write was refused, where the metadata record tells; else None (expired).

        One read, after the refusal: the queue deleted (or created again)
        since it was opened, or the lock taken by another call carrying the
        same txn id (``LockLostError`` with ``taken_back``, counted in
        ``locks_lost``)::

            t=0  call A (txn "order-7") takes the lock, token 5.
            t=0  call B, the same call sent again at once (txn "order-7"),
                 finds the lock held by its own txn and takes it back: token 6.
            t=1  B commits; its receipt is the txn's.
            t=1  A's write is refused (6 > 5): A committed nothing, and says
                 so with ``taken_back``. Made again with the txn id, it
                 answers with B's result (``queue.outcome`` tells it too).

        A's call is not made again by the library: by then later calls with
        txn ids may have pushed B's receipt out of the log, and only the
        caller knows how long ago it began (``queue.outcome(txn_id, within=)``).
        """
        found = self._metadata_record()
        if isinstance(found, errors.QueueNotFoundError):
            return found
        receipts = found.bins.get(RECEIPTS)
        if found.bins.get(LOCK_OWNER) != grant.txn_id and not (
            type(receipts) is dict and grant.txn_id in receipts
        ):
            return None
        self.counters.bump("locks_lost")
        return errors.LockLostError(
            f"lock of queue {self.keys.name!r} passed from txn {grant.txn_id!r} (token {grant.token}) to"
            f" another call carrying the same txn id before {what}: this call committed nothing (where"
            " calls keep receipts, the txn's outcome is the other call's: made again with the txn id, a"
            " call answers with it, and queue.outcome(txn_id) tells)",
            queue=self.keys.name,
            txn_id=grant.txn_id,
            taken_back=True,
        )

    def replaced_error(self, *, created_again: bool) -> errors.QueueNotFoundError:
        """The error for a handle whose queue was deleted (and maybe created again) since it was opened."""
        return replaced_error(self.keys.name, created_again=created_again)

    def try_acquire(
        self,
        txn_id: str,
        *,
        receipt: bool = False,
        beside: ReadBeside | None = None,
    ) -> LockGrant:
        """One attempt; raises ``_Busy`` when the lock is held and unexpired.

        ``receipt``: ``txn_id`` is the caller's: also read its receipt (in the
        same command), and take the lock back if this txn holds it already.
        ``beside``: a read of another record (key, read operations, condition)
        sent with the acquire where the store does that in one round trip
        (:meth:`Backend.operate_and_read`); what it saw is the grant's ``beside``.
        """
        self.counters.bump("commands")
        # the owner evaluated is the one replaced
        operations: list[Operation] = [_READ_PREVIOUS_OWNER, Write(LOCK_OWNER, txn_id), *self._take_and_read]
        condition: Condition = self._free_or_expired
        if receipt:
            operations.append(MapGet(RECEIPTS, txn_id))
            mine = _FREE_EXPIRED_OR_MINE_AT if self.stamped else _FREE_EXPIRED_OR_MINE
            condition = Bound(mine, {"txn": txn_id})
        seen: dict[str, Any] | None = None
        try:
            if beside is not None and self.backend.reads_beside:
                state, seen = self.backend.operate_and_read(
                    self.keys.metadata, operations, beside, condition=condition
                )
            else:
                state = self.backend.operate(self.keys.metadata, operations, condition=condition)
        except errors.ConditionNotMetError:
            self.counters.bump("lock_waits")
            raise _Busy() from None
        except errors.BackendTimeoutError as exc:
            if not exc.in_doubt:
                raise _Busy() from exc  # not applied: an ordinary failed attempt
            state = self._resolve_acquire(txn_id, exc)
            receipts = state.get(RECEIPTS)
            state = {**state, RECEIPTS: receipts.get(txn_id) if receipt and type(receipts) is dict else None}
        except errors.RecordNotFoundError:
            raise errors.QueueNotFoundError(
                f"queue {self.keys.name!r} does not exist", queue=self.keys.name
            ) from None
        grant = frozen(
            LockGrant,
            txn_id=txn_id,
            token=frozen(FencingToken, epoch=state[FENCE_EPOCH], counter=state[FENCE_COUNTER]),
            head=state[HEAD],
            tail=state[TAIL],
            acquired_at=time.monotonic(),
            erased_below=state.get(ERASED_BELOW) or 0,
            groups=tuple(state.get(GROUPS) or ()),
            receipt=state.get(RECEIPTS) if receipt else None,
            now_ms=state[STORE_CLOCK],
            beside=seen,
        )
        # held, but silent past the TTL; a lock this txn held already is taken back, not broken, only
        # where the acquire may take it back (with a receipt): otherwise it too had expired
        previous = state.get(_PREVIOUS_OWNER, NO_OWNER)
        broken = previous != NO_OWNER and (previous != txn_id or not receipt)
        if broken:
            log.warning(
                "queue %r: took over the lock from %r, silent past the lock TTL; whatever it writes"
                " from now on is fenced off (token %d.%d)",
                self.keys.name,
                previous,
                state[FENCE_EPOCH],
                state[FENCE_COUNTER],
            )
        self.counters.add(size=grant.tail - grant.head, locks_broken=int(broken))
        if grant.token.counter >= self.counter_limit:
            grant = self._start_epoch(grant)
        return grant

    def _resolve_acquire(self, txn_id: str, cause: Exception) -> dict[str, Any]:
        """An acquire timed out in doubt: read whether it took the lock.

        The increment it carries must not be repeated blindly. If the record
        names this txn as owner, the acquire was applied and its token is the
        record's counter (any later acquire would have replaced the owner).
        Otherwise it was not applied, or it was and the lock has since been
        broken; either way this txn holds nothing and may simply try again.
        """
        self.counters.bump("commands")
        try:
            state = self.backend.operate(
                self.keys.metadata,
                [
                    Read(LOCK_OWNER),
                    Read(RECEIPTS),
                    *(op for op in _TAKE_AND_READ if not isinstance(op, Increment)),
                ],
            )
        except errors.RecordNotFoundError:
            raise errors.QueueNotFoundError(
                f"queue {self.keys.name!r} does not exist", queue=self.keys.name
            ) from None
        if state.get(LOCK_OWNER) != txn_id:
            raise _Busy() from cause
        return state

    def _start_epoch(self, grant: LockGrant) -> LockGrant:
        """Wrap the counter: epoch+1, counter 0, only while this grant holds the lock."""
        self._guarded(
            grant,
            # absolute values, so that repeating it after a timeout is harmless
            [Write(FENCE_EPOCH, grant.token.epoch + 1), Write(FENCE_COUNTER, 0)],
            "starting a new fencing epoch",
        )
        return dataclasses.replace(grant, token=FencingToken(grant.token.epoch + 1, 0))

    def acquire(self, txn_id: str) -> LockGrant:
        """Acquire the lock, retrying with jittered backoff; ``LockNotAcquiredError`` on timeout."""
        try:
            return self.try_acquire(txn_id)  # the common, uncontended case: no retry machinery
        except _Busy:
            return self._acquire_after_refusal(txn_id)

    def holding(
        self,
        txn_id: str,
        *,
        receipt: bool = False,
        beside: ReadBeside | None = None,
        within: float | None = None,
    ) -> Holding:
        """The lock for one operation's body, which commits or releases the grant itself.

        The lock is released if the body fails before its commit
        (:class:`ReleasingOnError`). When the lock is free at once, the
        acquire and the whole body are one group of commands
        (:meth:`Backend.grouped`: one transaction on the embedded store); a
        busy lock is waited for outside any group, for the acquire timeout
        or ``within`` seconds (a caller's deadline), whichever is shorter.
        ``receipt`` and ``beside`` (sent with the first attempt only): see
        :meth:`try_acquire`.
        """
        return Holding(self, txn_id, receipt, beside, within)

    def _acquire_after_refusal(
        self, txn_id: str, *, receipt: bool = False, within: float | None = None
    ) -> LockGrant:
        """Wait, then try again, backing off, until the lock is ours or the acquire timeout (or
        ``within`` seconds, if shorter) has passed."""
        timeout = self.policy.acquire_timeout if within is None else min(self.policy.acquire_timeout, within)
        retrying = Retrying(
            retry=retry_if_exception_type(_Busy),
            wait=wait_random_exponential(multiplier=self.policy.initial_wait, max=self.policy.max_wait),
            stop=stop_after_delay(max(0.0, timeout)),
            reraise=True,
        )
        time.sleep(random.uniform(0, self.policy.initial_wait))  # the first of the waits, after the refusal
        try:
            for attempt in retrying:
                with attempt:
                    return self.try_acquire(txn_id, receipt=receipt)
        except _Busy:
            pass
        raise errors.LockNotAcquiredError(
            f"could not acquire the lock of queue {self.keys.name!r} within"
            f" {timeout:g} s: another holder keeps it",
            queue=self.keys.name,
            txn_id=txn_id,
        )

    def _guarded(
        self,
        grant: LockGrant,
        operations: list[Operation],
        what: str,
        known: dict[str, Any] | None = None,
        *,
        same_queue: bool = True,
        count_unknown: bool = True,
    ) -> None:
        """Write to the metadata record only while ``grant`` holds the lock (see :mod:`large_queue._guarded`).

        ``same_queue`` also requires the queue to be the one this lock was
        opened on. ``known`` (offsets, entries) is attached to an ``OutcomeUnknownError``,
        which is counted in ``outcomes_unknown`` unless ``count_unknown`` is False
        (the caller may still settle the outcome, and counts it if it cannot).
        """
        try:
            guarded_write(
                self.backend,
                self.keys.metadata,
                operations,
                self.held_by(grant, self.incarnation if same_queue else None),
                lost=lambda: self.why_lost(grant, what) or self._lost(grant, what),
                unknown=lambda cause: self._unknown(grant, what, known, cause, count_unknown),
                sent=lambda: self.counters.bump("commands"),
            )
        except errors.RecordNotFoundError:  # deleted meanwhile, by another process
            raise errors.QueueNotFoundError(
                f"queue {self.keys.name!r} was deleted before {what} of txn {grant.txn_id!r};"
                " nothing was committed",
                queue=self.keys.name,
            ) from None

    def _lost(self, grant: LockGrant, what: str) -> errors.LockLostError:
        self.counters.bump("locks_lost")
        return errors.LockLostError(
            f"lock of queue {self.keys.name!r} was lost by txn {grant.txn_id!r}"
            f" (token {grant.token}) before {what}: it expired and was broken;"
            " nothing was committed",
            queue=self.keys.name,
            txn_id=grant.txn_id,
        )

    def _unknown(
        self,
        grant: LockGrant,
        what: str,
        known: dict[str, Any] | None,
        cause: errors.BackendTimeoutError,
        counted: bool = True,
    ) -> errors.OutcomeUnknownError:
        if counted:
            self.counters.bump("outcomes_unknown")
        return errors.OutcomeUnknownError(
            f"{what} for txn {grant.txn_id!r} on queue {self.keys.name!r} timed out and may or may not"
            f" have been applied; it was not repeated blindly. {RECOVERY}",
            queue=self.keys.name,
            txn_id=grant.txn_id,
            stage=what,
            detail=f"token {grant.token}; head {grant.head} and tail {grant.tail} when locked ({cause})",
            **(known or {}),
        )

    def renew(self, grant: LockGrant) -> LockGrant:
        """Restart the lock's expiry clock; ``LockLostError`` if it is no longer held."""
        self._guarded(grant, [Write(LOCK_OWNER, grant.txn_id), *self._stamp], "renewing the lock")
        return dataclasses.replace(grant, acquired_at=time.monotonic())

    def commit(
        self,
        grant: LockGrant,
        *,
        head: int | None = None,
        tail: int | None = None,
        erased_below: int | None = None,
        published: int | None = None,
        groups: list[str] | None = None,
        receipt: LogPut | None = None,
        known: dict[str, Any] | None = None,
        skipped_to: int | None = None,
    ) -> None:
        """Publish new head/tail and release, in one write, only if still held.

        ``erased_below`` records how far dequeued slots have been erased;
        ``published`` how far the holder found every offset settled (formats 3 and 4);
        ``groups`` the queue's consumer groups from now on; ``receipt`` the
        txn's receipt (:mod:`large_queue._receipts`), written by the same command.
        ``known`` is attached to an ``OutcomeUnknownError`` if the outcome
        cannot be told (what the operation would have changed). ``skipped_to``
        (format 4): this head move may pass unpublished offsets below it.
        """
        operations: list[Operation] = [Write(LOCK_OWNER, NO_OWNER)]
        # whether it changes what callers see (head, tail, groups); else only hints and the lock
        changes = (
            (head is not None and head != grant.head)
            or (tail is not None and tail != grant.tail)
            or (groups is not None and tuple(groups) != grant.groups)
        )
        if head is not None and head != grant.head:
            # an overwriting producer may have moved the head past ours meanwhile (formats 3 and 4)
            operations.append(
                Compute(HEAD, _HEAD_AT_LEAST, {"head": head}) if self.stamped else Write(HEAD, head)
            )
        if published is not None and self.stamped:
            operations.append(Compute(PUBLISHED, _PUBLISHED_AT_LEAST, {"published": published}))
        if skipped_to is not None:
            operations.append(Compute(SKIPPED_TO, _SKIPPED_AT_LEAST, {"skipped": skipped_to}))
        if tail is not None and tail != grant.tail:
            operations.append(Write(TAIL, tail))
        if erased_below is not None and erased_below != grant.erased_below:
            operations.append(Write(ERASED_BELOW, erased_below))
        if groups is not None and tuple(groups) != grant.groups:
            operations.append(Write(GROUPS, list(groups)))
        if receipt is None and not changes:  # in doubt, it changed nothing a caller's result depends on
            try:
                self._guarded(grant, operations, "the commit", known, count_unknown=False)
            except errors.OutcomeUnknownError:  # the lock is free, or expires; the hints grow again
                log.info("queue %r: a commit that changed no head or tail timed out", self.keys.name)
            return
        if receipt is None:
            self._guarded(grant, operations, "the commit", known)
            return
        operations.append(receipt)
        try:
            self._guarded(grant, operations, "the commit", known, count_unknown=False)
        except errors.OutcomeUnknownError:
            if not self._left_receipt(grant.txn_id):
                self.counters.bump("outcomes_unknown")
                raise

    def _left_receipt(self, txn_id: str) -> bool:
        """After an in-doubt commit that writes a receipt: True if the receipt is there (it was applied).

        The acquire found no receipt for the txn, so one now was written by
        this commit. None found leaves the outcome unknown: the commit may
        still arrive (it would be refused once the lock is taken again).
        """
        self.counters.bump("commands")
        try:
            found = self.backend.operate(self.keys.metadata, [MapGet(RECEIPTS, txn_id)])
        except errors.LargeQueueError:
            return False
        return found.get(RECEIPTS) is not None

    def release(self, grant: LockGrant) -> None:
        """Release without changing head or tail.

        Releasing only frees the lock this grant holds, so it is allowed even in
        a queue created again since: a handle that finds its queue replaced does
        not leave the new queue locked until the lock expires. A release whose
        outcome cannot be told (it timed out, and its repeat found the lock not
        ours) changes nothing the caller's result depends on: the lock is free,
        or will be when it expires. It is logged, not raised::

            t=0  D dequeues from an empty queue: acquire, read, nothing there.
            t=1  D's release times out; the store may have applied it.
            t=2  D's repeat is refused: the first applied (the lock is free,
                 maybe taken by E since), or E broke it meanwhile.
            t=3  D returns None: its dequeue took nothing, whichever it was.
        """
        try:
            self._guarded(
                grant,
                [Write(LOCK_OWNER, NO_OWNER)],
                "releasing the lock",
                same_queue=False,
                count_unknown=False,
            )
        except errors.OutcomeUnknownError:
            log.info("queue %r: a release of the lock timed out; it is free, or expires", self.keys.name)


class ReleasingOnError:
    """Releases a grant's lock when the body fails before its commit, so others need not wait the TTL.

    Not after a lost lock (nothing to release) nor an in-doubt commit:
    releasing then could turn "maybe applied" into a wrong answer for
    nobody's benefit; that lock simply expires. (A class, not a generator:
    it is entered by every operation.)
    """

    def __init__(self, lock: QueueLock, grant: LockGrant) -> None:
        self.lock = lock
        self.grant = grant

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, (errors.LockLostError, errors.OutcomeUnknownError)):
            return
        try:
            self.lock.release(self.grant)
        except errors.LargeQueueError:
            log.debug("could not release the lock after an error", exc_info=True)


class Holding:
    """The lock for one operation's body: see :meth:`QueueLock.holding` (a class, as ReleasingOnError is)."""

    def __init__(
        self,
        lock: QueueLock,
        txn_id: str,
        receipt: bool = False,
        beside: ReadBeside | None = None,
        within: float | None = None,
    ) -> None:
        self.lock = lock
        self.txn_id = txn_id
        self.receipt = receipt
        self.beside = beside
        self.within = within
        self._group: contextlib.AbstractContextManager[None] | None = None
        self._releasing: ReleasingOnError | None = None

    def __enter__(self) -> LockGrant:
        try:
            with self.lock.backend.waiting_at_most(self.within):  # the embedded store's writer lock too
                grant = self._acquire()
            self._releasing = ReleasingOnError(self.lock, grant)
        except BaseException as exc:
            # An interrupt after the acquire (its group open) ends the group here: ``__exit__`` is
            # not called for an ``__enter__`` that raised. The lock is left to expire.
            if self._group is not None:
                group, self._group = self._group, None
                group.__exit__(type(exc), exc, exc.__traceback__)
            if not isinstance(exc, errors.BackendBusyError) or self.within is None:
                raise
            raise errors.LockNotAcquiredError(  # the caller's deadline came first: as a busy lock's
                f"could not acquire the lock of queue {self.lock.keys.name!r} within {self.within:g} s:"
                f" {exc}",
                queue=self.lock.keys.name,
                txn_id=self.txn_id,
            ) from exc
        return grant

    def _acquire(self) -> LockGrant:
        group = self.lock.backend.grouped()
        group.__enter__()
        try:
            grant = self.lock.try_acquire(self.txn_id, receipt=self.receipt, beside=self.beside)
        except _Busy:
            group.__exit__(None, None, None)  # never wait inside a group
            grant = self.lock._acquire_after_refusal(self.txn_id, receipt=self.receipt, within=self.within)
        except BaseException as exc:
            group.__exit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            self._group = group
        return grant

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            assert self._releasing is not None
            self._releasing.__exit__(exc_type, exc, tb)
        finally:
            if self._group is not None:
                self._group.__exit__(exc_type, exc, tb)


__all__ = [
    "READ_STORE_CLOCK",
    "STORE_CLOCK",
    "Holding",
    "LockGrant",
    "LockPolicy",
    "QueueLock",
    "ReleasingOnError",
    "replaced_error",
]
