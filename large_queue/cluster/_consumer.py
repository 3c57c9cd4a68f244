"""A node's consumer of a shared queue: owns it in turn, delivers, takes acks.

A background thread (:mod:`large_queue.cluster._turns`, with its timeline)
heartbeats the node, watches the owner record, takes
ownership when it is handed over or when the owner has been silent past the
timeout (if this node is the next interested live node in node-id order), and
hands ownership on when the time slice is over and another node wants it.
``receive`` delivers only while this node owns the queue (consumers are
stopped otherwise) and never starts a delivery after the slice is over.

While owning, a node needs no queue lock: a delivery is one read (the slots
it needs; with the metadata record, in one batch, only when it must look
past the tail it has already seen) and one owner-guarded write; an ack is
one owner-guarded write. The queue's head (what producers see as
consumed) advances to the acked prefix now and then, under the queue lock;
in a queue consumed by groups, to the lowest acked position of any group
(:mod:`large_queue.cluster._groups`).

A receive given a ``timeout`` waits for entries by polling the store with a
backoff that doubles from 5 ms up to ``max_poll_interval`` (kept across
calls until something is delivered), so an idle consumer costs a bounded
number of commands per second and its iterator never spins.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from large_queue import _records as rec
from large_queue import _retention, errors
from large_queue._frozen import frozen
from large_queue._lifecycle import seconds as checked_seconds
from large_queue._read_ahead import ReadAhead
from large_queue._txn import internal
from large_queue._waiting import IdlePoller
from large_queue.appends._prefix import settle_plain
from large_queue.cluster import _groups
from large_queue.cluster._dead_letters import DeadLetters, move_dying
from large_queue.cluster._deliveries import Deliveries
from large_queue.cluster._messages import Message, OwnershipEvent
from large_queue.cluster._ownership import Ownership, acked_position
from large_queue.cluster._slots import decoded, read_slots
from large_queue.cluster._turns import Turns
from large_queue.lock import LockGrant
from large_queue.queue import Entry, Queue

_new_object = object.__new__
#: the longest wait, delay or visibility timeout a consumer takes (seconds): ten years
_LONGEST = _retention.MAX_AGE_LIMIT
#: the shortest timeout and poll interval a consumer takes (seconds)
_SHORTEST = 0.001
#: buffer records a delivery pass looks at once it met only lost entries (older than max_age, say)
_SKIM_RECORDS = 4
#: passes over lost entries one delivery makes before it returns (each moves the cursor on)
_SKIMS_AT_ONCE = 16

log = logging.getLogger("large_queue.cluster")


#: the most of a nack's ``error`` kept for the entry's dead letter (the rest is cut, marked with an ellipsis)
MAX_ERROR_CHARS = 1000


class Consumer(Turns):
    """One node's consumer of a queue shared by many nodes.

    Example::

        with queue.consumer(node_id="a", time_slice=5.0) as consumer:
            for message in consumer:
                handle(message.value)
                message.ack()

    ``timeout`` is how long this node, silent, counts as alive (others
    judge it by the timeout it states, not by theirs);
    ``time_slice`` how long an owner keeps the queue while other nodes wait;
    ``max_in_flight`` bounds delivered, unacked entries.

    ``group`` names the consumer group (created on first use): every group
    sees every entry. ``visibility_timeout`` (seconds, None: never) is how
    long a delivered message may go unacked before it is delivered again,
    also while this node owns the queue. After ``max_deliveries``
    deliveries an entry goes to ``dead_letter`` (a queue) instead, exactly
    once. ``on_data_loss``: "report" (log and count entries overwritten
    before they were acked) or "fail" (also raise ``DataLossError``).
    """

    def __init__(
        self,
        queue: Queue,
        node_id: str,
        *,
        time_slice: float = 5.0,
        timeout: float = 10.0,
        poll_interval: float | None = None,
        max_in_flight: int = 1000,
        on_event: Callable[[OwnershipEvent], None] | None = None,
        group: str | None = None,
        visibility_timeout: float | None = 30.0,
        max_deliveries: int | None = None,
        dead_letter: Queue | None = None,
        on_data_loss: str = "report",
        max_poll_interval: float = 0.1,
    ) -> None:
        time_slice = checked_seconds("time_slice", time_slice, most=_LONGEST)
        timeout = checked_seconds("timeout", timeout, most=_LONGEST)
        max_poll_interval = checked_seconds("max_poll_interval", max_poll_interval)
        for name, value in (
            ("timeout", timeout),
            ("max_poll_interval", max_poll_interval),
            ("poll_interval", poll_interval),
        ):
            if value is not None and checked_seconds(name, value) < _SHORTEST:
                raise errors.InvalidArgumentError(
                    f"{name} must be at least {_SHORTEST:g} s, got {value!r}: shorter, the consumer's"
                    " watcher or its waits would spin, writing to the store without pause"
                )
        if poll_interval is not None and poll_interval > timeout / 2:
            raise errors.InvalidArgumentError(
                f"poll_interval must be at most half the timeout ({timeout / 2:g} s), got {poll_interval!r}:"
                " the owner proves it is alive once a poll, and other nodes take the queue from an owner"
                " silent for the timeout"
            )
        if type(max_in_flight) is not int or max_in_flight < 1:
            raise errors.InvalidArgumentError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        if visibility_timeout is not None:
            visibility_timeout = checked_seconds("visibility_timeout", visibility_timeout, most=_LONGEST)
        if on_data_loss not in ("report", "fail"):
            raise errors.InvalidArgumentError(
                f"on_data_loss must be 'report' or 'fail', got {on_data_loss!r}"
            )
        if (max_deliveries is None) != (dead_letter is None):
            raise errors.InvalidArgumentError(
                "max_deliveries and dead_letter go together: give both or neither"
            )
        if max_deliveries is not None and (type(max_deliveries) is not int or max_deliveries < 1):
            raise errors.InvalidArgumentError(
                f"max_deliveries must be a positive int, got {max_deliveries!r}"
            )
        if dead_letter is not None and not isinstance(dead_letter, Queue):
            raise errors.InvalidArgumentError(
                f"dead_letter must be a Queue (Queue.open(...) of the dead-letter queue), got {dead_letter!r}"
            )
        if group is not None:
            _groups.check_group(group)
        self.queue = queue
        self.node_id = node_id
        self.group = group
        self.ownership = Ownership(queue, node_id, timeout=timeout, group=group)
        self.dead_letters = (
            DeadLetters(queue, group, dead_letter, max_deliveries)
            if dead_letter is not None and max_deliveries is not None
            else None
        )
        self.on_data_loss = on_data_loss
        self.max_poll_interval = max_poll_interval
        self._idle = IdlePoller(max_poll_interval)  # waiting receives poll an empty queue no faster than this
        self.time_slice = time_slice
        self.timeout = timeout
        self.poll_interval = poll_interval or max(_SHORTEST, min(0.5, timeout / 5, time_slice / 4))
        self.max_in_flight = max_in_flight
        self._on_event = on_event
        self._capacity = queue.capacity
        self._sync_every = max(1, min(queue.capacity // 4, 1000))
        self._lock = threading.Condition(threading.RLock())
        self._owning = False
        self._epoch = 0
        self._cursor = 0
        self._inflight: dict[int, int] = {}
        self.deliveries = Deliveries(visibility_timeout)
        self._lost = 0  # stored counts of the group: entries lost to overwriting, moved to dead letters
        self._lost_range = range(0)  # the offsets of the last loss found
        #: the last delivery pass met only lost entries (older than max_age, overwritten): the next
        #: looks further ahead, and the receive does not wait for it (see _deliver)
        self._skimming = False
        self._dead: dict[int, int] = {}
        self._dead_lettered = 0
        #: (offset, value, enqueued_at_ms, deliveries) of entries to move to the dead-letter queue
        self._dying: list[tuple[int, Any, int, int]] = []
        self._next_others_look = 0.0  # monotonic: when a hand-over in grace looks for other nodes again
        self._move_failures: dict[int, int] = {}  # offset -> failed moves to the dead-letter queue in a row
        self._synced = 0  # the acked position the queue's head was last synced to
        self._owner_since = 0.0
        self._last_owner_write = 0.0
        self._commits = 0  # deliveries and acks committed by this node
        self._queue_head = 0
        self._seen_tail = 0  # the highest tail read from the metadata record while owning
        self._ahead = ReadAhead()  # slots read ahead of the cursor, delivered with no command
        self._closed = threading.Event()
        self._pid = os.getpid()  # the process whose thread watches ownership (see _here)
        self._thread: threading.Thread | None = None
        #: the queue (or group) found deleted by the watcher's last tick: receive raises it
        self._gone: errors.LargeQueueError | None = None

    # --- life cycle ------------------------------------------------------------------

    def start(self) -> Consumer:
        """Join the queue's (or group's) nodes and start watching ownership.

        A group is created on first use. The ungrouped consumer of a queue
        consumed by groups is refused (``GroupsInUseError``). Starting it
        again does nothing; a closed consumer cannot start again (make a new
        one).
        """
        if self._closed.is_set():
            raise errors.InvalidArgumentError(
                f"the consumer of node {self.node_id!r} on queue {self.queue.name!r} is closed:"
                " make a new one"
            )
        if self._thread is not None:
            self._here()
            return self
        self._pid = os.getpid()
        if self.group is not None:
            _groups.ensure(self.queue, self.group)
        else:
            self._refuse_groups(self.queue.current_metadata().groups)
        self.ownership.join()
        try:
            self._tick(starting=True)
        except BaseException:  # not started: no node stays listed as waiting for a turn it never takes
            with contextlib.suppress(errors.LargeQueueError), self._lock:
                if self._owning:
                    self._hand_over(final=True)
                self.ownership.heartbeat(interested=False)
            raise
        self._thread = threading.Thread(target=self._run, name=f"large-queue-{self.node_id}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Hand ownership on (if owning), lose interest and stop.

        In a process forked from the one that started it, it only stops this
        copy: ownership belongs to the original.
        """
        self._closed.set()
        if os.getpid() != self._pid:
            return
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._owning:
                with contextlib.suppress(errors.LargeQueueError):
                    self._hand_over(final=True)
            self._lock.notify_all()
        if self._thread is not None:  # a consumer never started has no node record to update
            with contextlib.suppress(errors.LargeQueueError):
                self.ownership.heartbeat(interested=False)

    def __enter__(self) -> Consumer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def owning(self) -> bool:
        """True while this node owns the queue."""
        return self._owning

    @property
    def epoch(self) -> int:
        """The epoch of this node's current (or last) ownership."""
        return self._epoch

    # --- consuming --------------------------------------------------------------------

    def receive(self, max_entries: int = 1, *, timeout: float | None = None) -> list[Message]:
        """Deliver up to ``max_entries`` entries.

        With ``timeout`` (seconds), waits up to that long for this node to own
        the queue and for entries to be published, returning as soon as any
        are delivered. Without it, waits up to the consumer's ``timeout`` for
        ownership and returns at once if nothing is there. Costs one batch get
        and one write; entries delivered before and not acked (by an earlier
        owner, or past their visibility timeout) come first, marked as
        redelivered. A delivery whose write stays in doubt delivers nothing
        (logged): its entries come again, marked redelivered if it applied.
        """
        return cast("list[Message]", self._receive(max_entries, timeout, auto_ack=False))  # no Entry

    def dequeue(self, max_entries: int = 1, *, timeout: float | None = None) -> list[Entry]:
        """Deliver and consume at once (at most once, like ``Queue.dequeue``). 2 round trips."""
        return cast("list[Entry]", self._receive(max_entries, timeout, auto_ack=True))  # no Message

    def __iter__(self) -> Iterator[Message]:
        while not self._closed.is_set():
            yield from self.receive(1, timeout=self.poll_interval)

    def ack(self, messages: list[Message]) -> None:
        """Acknowledge delivered messages in one write.

        ``OwnershipLostError`` if this node no longer owns the queue under the
        epoch that delivered them; ``DeliveryExpiredError`` (nothing acked) if
        one of them was delivered again since. A message already acked is
        left as it is. Once the ack's write has applied, the call succeeds:
        moving the queue's head after it is retried later if it fails (logged).
        """
        if isinstance(messages, (list, tuple)) and not messages:
            return  # nothing to settle, owning or not
        with self._lock:
            offsets = {m.offset for m in self._current(messages) if m.offset in self._inflight}
            if not offsets:
                return
            inflight = {o: c for o, c in self._inflight.items() if o not in offsets}
            self._commit(self._cursor, inflight)
            self.deliveries.acked(offsets)
            self._sync_queue_head()

    def nack(self, message: Message, *, delay: float = 0.0, error: str | None = None) -> None:
        """Release ``message`` to be delivered again after ``delay`` seconds. No store command."""
        delay = checked_seconds("delay", delay, zero=True, most=_LONGEST)
        if error is not None and not isinstance(error, str):
            raise errors.InvalidArgumentError(
                "error must be a str or None (it goes into the entry's dead letter),"
                f" got {type(error).__name__}: pass str(exc)"
            )
        if error is not None:
            try:
                error.encode()
            except UnicodeEncodeError:  # a lone surrogate: no dead letter could hold it
                raise errors.InvalidArgumentError(
                    f"error must be valid unicode text, got {error!r}"
                ) from None
            if len(error) > MAX_ERROR_CHARS:  # kept whole, it could make the letter too large to store
                error = error[: MAX_ERROR_CHARS - 1] + "\u2026"
        with self._lock:
            if self._current([message]) and message.offset in self._inflight:
                self.deliveries.nacked(message.offset, delay, error)
                self._lock.notify_all()

    def extend(self, message: Message, seconds: float) -> None:
        """Keep ``message`` from being delivered again for ``seconds`` more. No store command."""
        seconds = checked_seconds("seconds", seconds, most=_LONGEST)
        with self._lock:
            current = self._current([message])
            if not current or message.offset not in self.deliveries.held:
                raise errors.DeliveryExpiredError(
                    f"offset {message.offset} of queue {self.queue.name!r} is no longer held by this"
                    " delivery (acked, nacked or timed out): it cannot be extended",
                    queue=self.queue.name,
                    offset=message.offset,
                )
            self.deliveries.extended(message.offset, seconds)

    def _refuse_groups(self, groups: tuple[str, ...]) -> None:
        """``GroupsInUseError`` (ownership ended) if this consumer has no group and ``groups`` exist.

        Checked at start, before each take of the queue and at each read of
        the metadata record while owning: a group made meanwhile fenced this
        consumer (:func:`_groups.create`), and it must not take the queue back.
        """
        if self.group is not None or not groups:
            return
        self._lose()
        refused = errors.GroupsInUseError(
            f"queue {self.queue.name!r} is consumed by groups {list(groups)}: consume it as one of"
            " them (group=...), or delete them to consume it without a group",
            queue=self.queue.name,
        )
        if self._thread is not None:  # running: its receives raise it until a tick finds no group
            if self._gone is None:  # said once, as the watcher says a deleted queue
                log.warning("node %r: %s", self.node_id, refused)
            self._gone = refused
        raise refused

    def _current(self, messages: list[Message]) -> list[Message]:
        """``messages``, checked to be this consumer's and this ownership's latest deliveries (else raise).

        A message acked since it was delivered is left out (acking it again
        changes nothing): one an earlier ownership of this node delivered
        whose offset is below the cursor and not in flight, and one this
        node's last ownership delivered and acked, whoever owns the queue now.
        """
        self._here()
        if not isinstance(messages, (list, tuple)):
            raise errors.InvalidArgumentError(
                f"messages must be a list of messages (ack([message]), or message.ack()), got {messages!r}"
            )
        epoch, inflight, cursor, owning = self._epoch, self._inflight, self._cursor, self._owning
        current: list[Message] = []
        stale: list[int] = []
        for m in messages:  # one loop: an ack of one message is the common call
            if type(m) is not Message or m.consumer is not self:
                raise errors.InvalidArgumentError(
                    f"{m!r} was not delivered by this consumer (node {self.node_id!r} of queue"
                    f" {self.queue.name!r}, group {self.group!r}): settle each message with its own"
                    " consumer, as message.ack() does"
                )
            if m.epoch == epoch and owning:
                current.append(m)
            elif m.offset in inflight or m.offset >= cursor or (m.epoch != epoch and not owning):
                stale.append(m.offset)
            # else acked since it was delivered: by this ownership (this node's commit of it stands,
            # whoever owns the queue now), or by a later one of this node
        if stale:
            raise errors.OwnershipLostError(
                f"node {self.node_id!r} cannot settle offsets {stale}:"
                " it no longer owns the queue under the epoch that delivered them; the new owner"
                " redelivers them",
                queue=self.queue.name,
                node_id=self.node_id,
            )
        messages = current
        again = [m.offset for m in messages if inflight.get(m.offset, m.delivery_count) != m.delivery_count]
        if again:
            raise errors.DeliveryExpiredError(
                f"offsets {again} of queue {self.queue.name!r} were delivered again since these messages"
                " (their visibility timeout passed, or they were nacked): only the latest delivery counts",
                queue=self.queue.name,
                offsets=again,
            )
        return messages

    def _here(self) -> None:
        """``InvalidArgumentError`` in a process forked from the one that started this consumer.

        A forked child has a copy of the consumer, its owner's name and epoch,
        but not its thread: two processes delivering as one owner would each
        deliver every entry. Each process makes its own consumer.
        """
        if os.getpid() != self._pid:
            raise errors.InvalidArgumentError(
                f"the consumer of node {self.node_id!r} on queue {self.queue.name!r} was started in process"
                f" {self._pid}, not in this one ({os.getpid()}): a forked process makes its own consumer"
                " (with its own node id)"
            )

    def _receive(self, max_entries: int, timeout: float | None, *, auto_ack: bool) -> list[Message | Entry]:
        self._here()
        if self._thread is None and not self._closed.is_set():
            raise errors.InvalidArgumentError(
                f"the consumer of node {self.node_id!r} on queue {self.queue.name!r} was never started:"
                " use it as a context manager (with queue.consumer(...) as consumer) or call start() first"
            )
        if self._closed.is_set():  # (one closed while a receive waits ends that receive with [])
            raise errors.InvalidArgumentError(
                f"the consumer of node {self.node_id!r} on queue {self.queue.name!r} is closed: it delivers"
                " nothing more (make a new one)"
            )
        if type(max_entries) is not int or max_entries < 1:
            raise errors.InvalidArgumentError(f"max_entries must be a positive int, got {max_entries!r}")
        if timeout is not None:
            timeout = checked_seconds("timeout", timeout, zero=True, most=_LONGEST)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._lock:
            while True:
                if self._closed.is_set():
                    return []
                gone = self._gone
                if gone is not None and not self._owning:  # until a tick finds it again (made anew)
                    raise gone.with_traceback(None)
                if self._owning and self._slice_over():
                    self._hand_over(final=False)  # keeps the queue if nobody else wants it
                pause = self.poll_interval  # not owning: the watcher thread notifies a take
                if self._owning and not self._slice_over():
                    due = self.deliveries.next_due(self._inflight)  # a nacked or timed-out delivery
                    if (
                        not timeout  # None: look once now; 0: look once, whatever the backoff says
                        or time.monotonic() >= self._idle.next_poll()
                        or (due is not None and due <= self.deliveries.clock())
                    ):
                        delivered = self._deliver_now(max_entries, auto_ack)
                        if delivered:
                            self._idle.found_something()
                            return delivered
                        if self._skimming and timeout and time.monotonic() < deadline:
                            # lost entries passed, more to pass: no backoff for that (acks waiting
                            # on the lock go first)
                            self._lock.wait(0)
                            continue
                        if not self._skimming:
                            self._idle.found_nothing()
                        if timeout is None:
                            return delivered
                        due = self.deliveries.next_due(self._inflight)
                    pause = max(0.0, self._idle.next_poll() - time.monotonic())
                    if due is not None:
                        pause = min(pause, max(0.0, due - self.deliveries.clock()))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._lock.wait(min(remaining, pause))

    def _deliver_now(self, max_entries: int, auto_ack: bool) -> list[Message | Entry]:
        """One delivery as owner: read and commit (one group), then what may wait on the lock or others."""
        commits = self._commits
        lost = self._lost
        lost_in: range | None = None
        for _ in range(_SKIMS_AT_ONCE):
            losing = self._lost
            with self.queue.backend.grouped():  # reads and commit: one transaction where groups are
                delivered = self._deliver(max_entries, auto_ack)
            if self._lost != losing:  # the passes' losses, said as one (from the first to the last offset)
                found = self._lost_range
                if lost_in is not None:
                    found = range(min(lost_in.start, found.start), max(lost_in.stop, found.stop))
                lost_in = self._lost_range = found
            if delivered or not self._skimming or not self._owning:  # (a commit in doubt: not owning)
                break
        if self._dying:
            move_dying(self)
        if self._commits != commits:
            self._sync_queue_head()  # may wait for the queue lock: never inside a group
        if self._lost != lost and self.on_data_loss == "fail":
            where = self._lost_range
            raise errors.DataLossError(
                f"{self._lost - lost} entries of queue {self.queue.name!r} (offsets {where.start}.."
                f"{where.stop - 1}) were overwritten by producers, dropped for their age (max_age) or purged"
                f" before {self._who()} acked them (they are counted as lost; the next receive goes on"
                " after them)",
                queue=self.queue.name,
                group=self.group,
                count=self._lost - lost,
                lost=where,
            )
        return delivered

    def _overwritten(self, offset: int) -> None:
        log.warning(
            "queue %r: offset %d was overwritten before %s acked it", self.queue.name, offset, self._who()
        )

    def _who(self) -> str:
        return f"group {self.group!r}" if self.group is not None else f"node {self.node_id!r}"

    def _deliver(self, max_entries: int, auto_ack: bool) -> list[Message | Entry]:
        shape = self.queue.shape
        self.deliveries.expire()
        redeliver = self.deliveries.due(self._inflight)[:max_entries]
        budget = min(max_entries, self._capacity) - len(redeliver)  # no more are there to deliver
        if not auto_ack:
            budget = min(budget, self.max_in_flight - len(self._inflight))
        looked = budget
        if self._skimming and budget > 0:  # among lost entries: look past them a few records at once
            looked = max(budget, min(self._capacity, _SKIM_RECORDS * shape.slots_per_record))
        candidates = range(self._cursor, self._cursor + max(looked, 0))
        read = read_slots(self.queue, redeliver, candidates, self._seen_tail, self._ahead)
        if read.metadata is not None:
            self._refuse_groups(read.metadata.groups)
            self._queue_head, self._seen_tail = read.metadata.head, read.metadata.tail
        slot_at = read.slot_at
        # Below the head: dropped by overwriting producers before this consumer acked them.
        lost = max(0, self._queue_head - self._cursor) + sum(
            1 for o in self._inflight if o < self._queue_head
        )
        cursor = max(self._cursor, self._queue_head)
        fresh = [o for o in candidates if cursor <= o < self._seen_tail]

        settled_end = None
        # the settled entries' (value, enqueued_at_ms) by offset
        known: dict[int, tuple[Any, int]] = {}
        # offsets whose slot a later lap took, or whose entry is older than max_age: lost, like those
        # below the head
        lost_again: set[int] = set()
        if self.queue.reserved and fresh:  # only the published prefix; a hole waited on long enough is closed
            run = read.run(fresh[0], fresh[-1] + 1)
            settled = settle_plain(fresh[0], run) if run is not None else None  # the common read: all entries
            if settled is None:
                settled = self.queue.prefix.settle(fresh[0], fresh[-1] + 1, slot_at)
            entries = settled.entries
            if len(entries) == settled.end - fresh[0]:  # every offset settled is an entry: the common case
                fresh = fresh[: len(entries)]
            else:
                published = {offset for offset, _, _ in entries}
                fresh = [o for o in fresh if o < settled.end and o in published]
            known = decoded(self.queue.encoding, entries)
            settled_end = settled.end
            for offset in settled.overwritten:  # below the tail this owner saw: the head was not read
                self._overwritten(offset)
                lost_again.add(offset)
            if settled.end == cursor and not redeliver:
                self.queue.prefix.close_overdue(settled)
        inflight = {o: c for o, c in self._inflight.items() if o >= self._queue_head}
        delivered: list[Message | Entry] = []
        cutoff = _retention.expired_before(self.queue, self.queue.store_clock)
        expired = 0
        queue_head, dead_letters, epoch, group = self._queue_head, self.dead_letters, self._epoch, self.group
        taken = 0  # fresh offsets delivered or moved to dead letters: at most the budget
        stopped_at = None  # where a pass that looked past its budget stopped taking
        due = len(redeliver)
        for index, offset in enumerate([*redeliver, *fresh]):
            if offset < queue_head:
                continue  # counted as lost above
            if index >= due and taken >= budget:
                stopped_at = offset  # looked ahead past lost entries: the rest is for the next pass
                break
            entry = known.get(offset)
            if entry is None:  # not settled above (a redelivery, a locked queue's entry): from its slot
                entry = rec.slot_entry(
                    self.queue.name, shape.record_of(offset), slot_at(offset), offset, self.queue.encoding
                )
            count = inflight.pop(offset, 0) + 1
            if entry is None:
                self._overwritten(offset)
                lost_again.add(offset)
                continue
            if cutoff is not None and entry[1] < cutoff:  # older than max_age
                expired += 1
                lost_again.add(offset)
                continue
            taken += index >= due
            if dead_letters is not None and (offset in self._dead or count > dead_letters.max_deliveries):
                inflight[offset] = count - 1  # moved after this commit (see _dead_letters.move_dying)
                self._dying.append((offset, entry[0], entry[1], count - 1))
                continue
            if auto_ack:
                delivered.append(frozen(Entry, offset=offset, value=entry[0], enqueued_at_ms=entry[1]))
            else:
                inflight[offset] = count
                message = _new_object(Message)  # a frozen Message, its fields set at once (as frozen() does)
                fields = message.__dict__
                fields["offset"] = offset
                fields["value"] = entry[0]
                fields["enqueued_at_ms"] = entry[1]
                fields["delivery_count"] = count
                fields["epoch"] = epoch
                fields["group"] = group
                fields["consumer"] = self
                delivered.append(message)
        if stopped_at is not None:
            cursor = max(cursor, stopped_at)
            lost_again = {offset for offset in lost_again if offset < stopped_at}  # met again next pass
        elif settled_end is not None:
            cursor = max(cursor, settled_end)  # past what is delivered and what is closed
        else:
            cursor = max(cursor, fresh[-1] + 1) if fresh else cursor
        # only lost entries met, and more may follow: the next pass looks further, at once
        self._skimming = bool(lost_again) and taken == 0 and cursor < self._seen_tail
        lost += len(lost_again)
        if expired:
            self.queue.counters.add(entries_expired=expired)  # said below, with the rest of the loss
        if lost:  # what was lost: below the head (the cursor's run, in-flight offsets), and lost_again
            gone = [*lost_again, *(o for o in self._inflight if o < self._queue_head)]
            if self._queue_head > self._cursor:
                gone += [self._cursor, self._queue_head - 1]
            self._lost_range = range(min(gone), max(gone) + 1)
        if lost and self.on_data_loss == "fail":
            # Nothing is delivered this time, so that the error comes before any entry after the loss:
            # only the loss is committed (overwriting takes the oldest first, so the lost are a prefix).
            cursor = max(self._cursor, self._queue_head, *(o + 1 for o in lost_again if o >= self._cursor))
            inflight = {
                o: c for o, c in self._inflight.items() if o >= self._queue_head and o not in lost_again
            }
            delivered, self._dying = [], []
        if not delivered and cursor == self._cursor and inflight == self._inflight and not lost:
            return []
        counts = {"lost": self._lost + lost} if lost else {}
        if lost:
            log.warning(
                "queue %r: %s lost %d entries (overwritten by producers, older than max_age, or purged)",
                self.queue.name,
                self._who(),
                lost,
            )
        try:
            self._commit(cursor, inflight, **counts)
        except errors.OwnershipLostError:
            self._dying, self._skimming = [], False
            return []  # nothing was delivered; the new owner has it all
        except errors.OutcomeUnknownError as exc:
            # Nothing is handed out either way, and nothing is lost either way:
            #   applied:     the entries are in flight in the owner record; whoever owns
            #                it next (this node once it reads the record again) delivers
            #                them again at once, since no consumer holds them;
            #   not applied: the record's cursor is still before them: delivered fresh.
            # This node's own state may be behind the record: it reads it again before
            # delivering more (the watcher takes the queue back if it is still its own).
            log.warning("queue %r: %s delivers nothing this time: %s", self.queue.name, self._who(), exc)
            self._dying, self._skimming = [], False
            self._lose()
            return []
        if not auto_ack:
            self.deliveries.delivered([m.offset for m in delivered])
        return delivered

    def _commit(self, cursor: int, inflight: dict[int, int], **counts: Any) -> None:
        try:
            self.ownership.commit(self._epoch, cursor=cursor, inflight=inflight, **counts)
        except errors.OwnershipLostError:
            self._lose()
            raise
        self._cursor, self._inflight = cursor, inflight
        self._lost = counts.get("lost", self._lost)
        self._dead = counts.get("dead", self._dead)
        self._dead_lettered = counts.get("dead_lettered", self._dead_lettered)
        self._last_owner_write = time.monotonic()
        self._commits += 1
        self._event("commit")

    def _sync_queue_head(self, *, force: bool = False) -> None:
        """Advance the queue's head to the acked prefix when it lags far enough (or ``force``).

        Producers see free space only up to the head; it never passes an entry
        that is unacked (by any group), so no producer can overwrite one
        unless it appends with ``overwrite_if_full``.

        It runs after a commit that already took effect (an ack, a delivery),
        so it never raises: the head only lags until the next sync. Raising
        would tell the caller that the ack failed when it was applied::

            t=0.000  ack(8 messages): the owner write commits them acked.
            t=0.001  the head sync takes the queue lock; the process is paused.
            t=1.150  resumed, the lock's commit times out: were this raised,
                     the caller would count 8 applied acks as failed.
        """
        acked = acked_position(self._cursor, self._inflight)
        if acked <= max(self._queue_head, self._synced) or (
            acked - max(self._queue_head, self._synced) < self._sync_every and not force
        ):
            return
        try:
            head = _groups.move_head(
                self.queue, internal(f"{self.node_id}:head"), lambda grant: self._head_target(grant, acked)
            )
        except errors.LargeQueueError as exc:
            log.warning(
                "queue %r: %s could not move the head to %d now (the next sync will): %s",
                self.queue.name,
                self._who(),
                acked,
                exc,
            )
            return
        if head is None:
            return
        self._synced = acked
        self._queue_head = head

    def _head_target(self, grant: LockGrant, acked: int) -> int:
        """Where the head may go: this consumer's acked position, or the lowest of every group's."""
        if self.group is None:
            if grant.groups:
                log.warning(
                    "queue %r: consumer groups %s were created while node %r consumed it without a group;"
                    " the head is left to them",
                    self.queue.name,
                    list(grant.groups),
                    self.node_id,
                )
                return grant.head
            return acked
        if self.group not in grant.groups:
            return grant.head  # the group was deleted: its next owner write says so
        return min(acked, _groups.acked_floor(self.queue, grant.groups, grant.head))
