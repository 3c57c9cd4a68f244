"""Destructive dequeues: take the lock, read the head's slots, commit the new head.

One way per append mode, both under the queue lock:

- ``appends="reserve"`` (:func:`settled_once`): the head's slots are read
  and settled (:mod:`large_queue.appends._prefix`); the dequeue stops at the
  first reserved offset not yet published, and closes that hole first when
  it is at the head and has been open past the hole timeout.
- ``appends="lock"`` (:func:`locked_once`): the slots hold what the
  producers wrote under the lock; each read also erases the slots below the
  head that no earlier dequeue erased (``erased_below``).

Either way the commit writes the new head (and the txn's receipt) and
releases the lock in one guarded command: a dequeuer whose lock broke while
it was paused commits nothing (``LockLostError``), and the entries it read
are delivered by the next holder.

Where the store sends a read beside a write in one round trip (Aerospike),
a reserve queue's handle reads the slots where its last dequeue left the
head together with the acquire (:class:`HeadGuess`). The timeline of a
guess that goes wrong (a lone consumer C, a producer P)::

    t=0.0  C's dequeue took 40..41: its guess of the next head is 42.
    t=0.1  P reserves 42 and pauses before publishing it.
    t=0.2  C sends the acquire with a read of slot 42 beside it; the read
           sees [-1] (an older lap's slot: 42 is not published).
    t=0.2  P publishes 42, just after C's read and before its lock.
    t=0.2  C holds the lock with head 42: the guessed slot does not hold
           its own offset, so C reads slot 42 again under the lock, sees
           the entry and delivers it. Holes are only ever judged (and
           closed) on slots read while holding the lock.
    t=0.3  C's next 16 dequeues send no guess; then it guesses again.

A slot that holds its own offset (published, or closed) keeps it until the
head passes it, so such a slot says the same whether it was read just
before the lock was taken or just after: only those are taken from a guess.

For the same reason a reserve queue's dequeue reads ahead
(:mod:`large_queue._read_ahead`): the common read, and a guess, take up to
16 slots, and the next dequeues take the entries found there with no read:
under the lock, an acquire and a commit as plain commands; where nobody took
the lock since this handle's last commit, one command that moves the head
without it (:mod:`large_queue._quick_take`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from large_queue import _locked, _receipts, _retention, errors
from large_queue import _records as rec
from large_queue._entries import Entry
from large_queue._frozen import frozen
from large_queue._read_ahead import ReadAhead
from large_queue.appends._prefix import Settled, settle_plain
from large_queue.backends import Backend, ListGetRange, Operation, ReadBeside
from large_queue.fencing import same_queue
from large_queue.lock import LockGrant

if TYPE_CHECKING:
    from large_queue.queue import Queue

log = logging.getLogger("large_queue")

#: dequeues that send no guessed read after a guess that missed (another consumer moved the head)
GUESSES_PAUSED_AFTER_A_MISS = 16


#: offsets past a hole at the head whose hole clocks start with its own (see HoleWatch.note): a
#: producer object's largest batch (2,000), noted at each dequeue that meets the hole
_NOTED_BEHIND_A_HOLE = 2_048


def now(
    queue: Queue,
    max_entries: int,
    txn: str,
    mine: bool,
    *,
    deadline: float | None = None,
    counted: bool = True,
) -> list[Entry]:
    """Dequeue what is there now; ``mine``: ``txn`` is the caller's (receipts, repeats).

    ``deadline`` (``time.monotonic()``): a busy lock is waited for until then
    at most (``LockNotAcquiredError``). ``counted``: this is the caller's
    whole call, counted once in ``dequeue_calls`` however many locked passes
    it took (a waiting dequeue counts its call itself).
    """
    once = settled_once if queue.reserved else locked_once
    while True:
        within = None if deadline is None else deadline - time.monotonic()
        taken, again = once(queue, max_entries, txn, mine, within)
        if taken or not again:
            if counted:
                queue.counters.bump("dequeue_calls")
            return taken


def settled_once(
    queue: Queue, max_entries: int, txn: str, mine: bool, within: float | None = None
) -> tuple[list[Entry], bool]:
    """One locked dequeue of the published prefix (``appends="reserve"``); True: try again.

    Entries this handle read ahead are taken without the lock where nobody took it since this
    handle's last commit (:mod:`large_queue._quick_take`).
    """
    if not mine and (taken := queue.quick_takes.take(queue, max_entries, txn)) is not None:
        new_head = taken[-1].offset + 1
        queue.holes.forget(new_head)
        queue.head_guess.left_at(new_head)
        dequeued(queue, taken, 0, 0)
        return taken, False
    guess = queue.head_guess.read(max_entries)
    beside = None if guess is None else guess.read
    with queue.lock.holding(txn, receipt=mine, beside=beside, within=within) as grant:
        if grant.receipt is not None:
            return queue._repeated_dequeue(grant), False
        _refuse_groups(queue, grant)
        grant, read, settled = read_settled(queue, grant, max_entries, guess)
        expired, taken = _retention.split_expired(read, grant.now_ms, queue.max_age_ms)
        closed = False
        if not read and settled.end == grant.head and settled.pending:  # a hole at the head
            # what was reserved behind it when the acquire read the tail waits on the same clock
            queue.holes.note(range(settled.end, min(grant.tail, settled.end + _NOTED_BEHIND_A_HOLE)))
            closed = queue.prefix.close_overdue(settled)
        receipt = _receipt(queue, grant, mine, settled.end, taken)
        queue.lock.commit(
            grant, head=settled.end, published=settled.end, receipt=receipt, known={"entries": taken}
        )
    queue.holes.forget(settled.end)
    queue.head_guess.left_at(settled.end if taken else None)  # an empty queue: no guess until entries come
    queue.quick_takes.left(
        grant.token, settled.end, full=len(taken) == max_entries, alone=queue.quick_takes.alone(grant.token)
    )
    dequeued(queue, taken, len(settled.overwritten), expired)
    return taken, closed or (not taken and settled.end > grant.head)


def locked_once(
    queue: Queue, max_entries: int, txn: str, mine: bool, within: float | None = None
) -> tuple[list[Entry], bool]:
    """One locked dequeue (``appends="lock"``); True: try again (entries were overwritten)."""
    with queue.lock.holding(txn, receipt=mine, within=within) as grant:
        if grant.receipt is not None:
            return queue._repeated_dequeue(grant), False
        _refuse_groups(queue, grant)
        grant, read, skipped, new_head = read_entries(queue, grant, max_entries)
        expired, taken = _retention.split_expired(read, grant.now_ms, queue.max_age_ms)
        receipt = _receipt(queue, grant, mine, new_head, taken)
        queue.lock.commit(
            grant, head=new_head, erased_below=grant.head, receipt=receipt, known={"entries": taken}
        )
    dequeued(queue, taken, skipped, expired)
    return taken, (skipped > 0 or expired > 0) and not taken


def _receipt(queue: Queue, grant: LockGrant, mine: bool, new_head: int, taken: list[Entry]) -> Any:
    """The receipt a dequeue's commit leaves: for a caller's txn that took entries.

    Its offsets run from the first entry taken (not the head: what was
    passed over before it, overwritten or expired, was not taken) to the new head.
    """
    if not mine or not taken:
        return None
    return queue.receipts.committed(grant.txn_id, _receipts.DEQUEUE, range(taken[0].offset, new_head))


def dequeued(queue: Queue, taken: list[Entry], overwritten: int, expired: int) -> None:
    """Count a committed dequeue's entries, and say what it passed over: overwritten and expired ones.

    Only after the commit is it certain: a holder whose lock broke may see reused slots. The
    overwritten ones are counted by the append that dropped them (``entries_overwritten``), not
    again here: handles of one queue published together would count them twice.
    """
    queue.counters.add(entries_dequeued=len(taken))
    if overwritten:
        log.warning(
            "queue %r: %d entries were overwritten before they were dequeued", queue.name, overwritten
        )
    if expired:
        _retention.report(queue, expired)
        if not taken:  # the head is old: drop what else has expired at once, not a read at a time
            _retention.drop_expired(queue)


def _refuse_groups(queue: Queue, grant: LockGrant) -> None:
    """A destructive dequeue of a queue consumed by groups is refused (the lock is then released)."""
    if grant.groups:
        raise errors.GroupsInUseError(
            f"queue {queue.name!r} is consumed by groups {list(grant.groups)}: every group must see every"
            " entry, so dequeuing directly is refused; consume it with queue.consumer(..., group=...),"
            " or delete the groups first",
            queue=queue.name,
        )


class Guess(NamedTuple):
    """A read of the head's slots sent beside the lock's acquire: ``slots`` of them from offset ``head``."""

    head: int
    slots: int
    read: ReadBeside


class HeadGuess:
    """Where a handle's last dequeue left the head, and the read of its slots to send with the acquire."""

    def __init__(self, queue: Queue, head: int, ahead: ReadAhead) -> None:
        self.backend: Backend = queue.backend
        self.keys = queue.keys
        self.shape = queue.shape
        self._guard = None if queue.incarnation is None else same_queue(queue.incarnation)
        self._next_head: int | None = head
        self._paused = 0
        self._ahead = ahead
        self._verdicts = queue.prefix.verdicts

    def read(self, max_entries: int) -> Guess | None:
        """The read to send beside the acquire: only where the store sends both in one round trip,
        not where the slots were read ahead already, and not for a while after a wrong guess
        (another consumer moved the head meanwhile). It reads ahead (:mod:`large_queue._read_ahead`)."""
        if not self.backend.reads_beside or self._next_head is None:
            return None
        if self._paused:
            self._paused -= 1
            return None
        head = self._next_head
        per_record = self.shape.slots_per_record
        first = head % per_record
        count = min(max_entries, per_record - first)
        if self._ahead.covering(head, head + count) is not None:
            return None
        count = self._ahead.next_read(head, count, first, per_record, head + per_record)
        read: list[Operation] = [ListGetRange(rec.SLOTS, first, count)]
        return Guess(head, count, (self.keys.buffer(self.shape.record_of(head)), read, self._guard))

    def left_at(self, head: int | None) -> None:
        """The head a committed dequeue left (None: it found nothing, so guess nothing next)."""
        self._next_head = head

    def slots(self, grant: LockGrant, guess: Guess | None, stop: int) -> list[Any] | None:
        """The slots of ``[grant.head, stop)`` as the guessed read saw them: None if it read another head.

        Their offsets are not checked here: see :meth:`holds_own`. The
        plain entries it saw up to the tail are kept, read ahead.
        """
        if guess is None or grant.beside is None:  # none sent (the lock was busy), or it failed
            return None
        head = grant.head
        slots = grant.beside.get(rec.SLOTS)
        if type(slots) is not list or guess.head != head:
            self._paused = GUESSES_PAUSED_AFTER_A_MISS  # another consumer moved the head
            return None
        if stop > head + len(slots):
            return None  # the range goes on into the next record: read it all under the lock
        self._ahead.keep(stop, slots[stop - head : grant.tail - head], self._verdicts)  # past what it takes
        return slots[: stop - head]

    def holds_own(self, head: int, slots: list[Any]) -> bool:
        """Whether each guessed slot from ``head`` held its own offset (published or closed: final).

        Anything else (a hole not yet published, a slot of another lap) is
        False: read again under the lock, and guess nothing for a while.
        """
        try:  # one comparison of lists: a third of the time of a test per slot
            own = [slot[0] for slot in slots] == list(range(head, head + len(slots)))
        except (TypeError, IndexError, KeyError):  # a slot that is no list, or empty: read it under the lock
            own = False
        if not own:
            self._paused = GUESSES_PAUSED_AFTER_A_MISS
        return own


def read_settled(
    queue: Queue, grant: LockGrant, max_entries: int, guess: Guess | None = None
) -> tuple[LockGrant, list[Entry], Settled]:
    """Read up to ``max_entries`` slots from the head under the lock, and settle them.

    Slots read ahead by this handle (:mod:`large_queue._read_ahead`; the
    head this grant read has not passed them), or seen by the read guessed
    beside the acquire (``guess``), are not read again.
    """
    head = grant.head
    stop = head + min(max_entries, grant.tail - head)
    per_record = queue.shape.slots_per_record
    first = head % per_record
    got = queue.read_ahead.covering(head, stop)  # each a published entry: final, taken
    if got is None and stop > head:
        got = queue.head_guess.slots(grant, guess, stop)  # slots from the head
    settled = None if got is None else settle_plain(head, got)  # each a published entry: final, taken
    if settled is None and got is not None and not queue.head_guess.holds_own(head, got):
        got = None  # a slot the guess saw may have changed since: read it under the lock
    read = None  # what the common read found, read ahead
    if settled is None and got is None and head < stop <= head + per_record - first:  # the common read
        count = queue.read_ahead.next_read(head, stop - head, first, per_record, grant.tail)
        grant, read = _locked.buffer_command(
            queue, grant, queue.shape.record_of(head), [], read=ListGetRange(rec.SLOTS, first, count)
        )
        got = read[: stop - head]
        if len(got) != stop - head:  # a short slot list: let settle name the first missing slot
            got = [*got, *[None] * (stop - head - len(got))]
        settled = settle_plain(head, got)
    if settled is None and got is not None:
        from_head = got
        settled = queue.prefix.settle(head, stop, lambda offset: from_head[offset - head])
    if read is not None:  # what it read past what it takes, kept once settled (verdicts known then)
        queue.read_ahead.keep(stop, read[stop - head :], queue.prefix.verdicts)
    if settled is None:  # a read spanning records
        grant, slots = _read_slots(queue, grant, head, stop)
        settled = queue.prefix.settle(head, stop, slots.__getitem__)
    return grant, queue._entries(settled.entries), settled


def _read_slots(queue: Queue, grant: LockGrant, head: int, stop: int) -> tuple[LockGrant, dict[int, Any]]:
    """The slots of offsets ``[head, stop)``, one command per buffer record, under the lock.

    Returns the (possibly renewed) grant and the slots by offset.
    """
    shape = queue.shape
    slots: dict[int, Any] = {}
    for record, runs in shape.runs(head, stop).items():
        first = min(shape.slot_of(run.start) for run in runs)
        last = max(shape.slot_of(run[-1]) for run in runs)
        grant, got = _locked.buffer_command(
            queue, grant, record, [], read=ListGetRange(rec.SLOTS, first, last - first + 1)
        )
        for run in runs:
            start = shape.slot_of(run.start) - first
            slots.update(zip(run, got[start : start + len(run)], strict=True))
    return grant, slots


def read_entries(queue: Queue, grant: LockGrant, max_entries: int) -> tuple[LockGrant, list[Entry], int, int]:
    """The middle step of a locked dequeue: read the head entries, one command per record.

    Also erases this record's slots below the head. Returns the (possibly
    renewed) grant, the entries in offset order, how many slots no longer
    held their entry, and the head to commit.
    """
    shape = queue.shape
    head, tail = grant.head, grant.tail
    stop = head + min(max_entries, tail - head)
    taken: list[Entry] = []
    skipped = 0
    erasable = shape.runs(_first_erasable(queue, grant), head)
    by_record = shape.runs(head, stop)
    for record, runs in by_record.items():
        first = min(shape.slot_of(run.start) for run in runs)
        last = max(shape.slot_of(run[-1]) for run in runs)
        erase = _locked.erasures(queue, erasable.get(record, []))
        grant, slots = _locked.buffer_command(
            queue, grant, record, erase, read=ListGetRange(rec.SLOTS, first, last - first + 1)
        )
        for run in runs:
            index = shape.slot_of(run.start) - first
            part = slots[index : index + len(run)]
            plain = settle_plain(run.start, part) if len(part) == len(run) else None
            if plain is not None:  # the common read: each slot a plain entry of its own offset
                taken += queue._entries(plain.entries)
                continue
            for offset in run:
                slot = slots[index]
                index += 1
                found = rec.slot_entry(queue.name, record, slot, offset, queue.encoding)
                if found is None:
                    skipped += 1
                else:
                    taken.append(frozen(Entry, offset=offset, value=found[0], enqueued_at_ms=found[1]))
    if any(len(runs) > 1 for runs in by_record.values()):
        taken.sort(key=lambda entry: entry.offset)  # a record's second run came before other records'
    return grant, taken, skipped, stop


def _first_erasable(queue: Queue, grant: LockGrant) -> int:
    """The lowest dequeued offset whose slot may still hold its value and may be erased.

    Offsets below ``erased_below`` were erased by earlier dequeues; a slot
    more than one record's worth below the head is left to be reused;
    ``o + capacity >= tail`` means no committed entry has taken the slot since.
    """
    return max(0, grant.erased_below, grant.head - queue.shape.slots_per_record, grant.tail - queue.capacity)
