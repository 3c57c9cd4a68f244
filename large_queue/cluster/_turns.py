"""Taking turns at owning a queue: the consumer's watcher thread and its hand-overs.

Every ``poll_interval`` the watcher heartbeats the node, reads the owner
record and acts on it: it takes the queue when it is handed to this node,
or when the owner has been silent past the timeout the owner stated and
this node is the next interested live node in node-id order; it proves the
owner alive while this node owns it; and it hands the queue on when the
time slice is over and another node wants it. The timeline of a take::

    t=0    node A owns the queue (epoch 6) and is paused (SIGSTOP).
    t=10   A has been silent past the timeout it stated: B, the next
           interested live node, takes the record (epoch 7), guarded on
           the owner and epoch it read and on A's silence.
    t=10+  B delivers what A had in flight again, marked redelivered.
    t=12   A resumes: its next write (a delivery, an ack, a keep-alive) is
           refused on its epoch, its acks raise OwnershipLostError, and its
           watcher finds B the owner: A waits for its turn.

:class:`Turns` holds these steps for :class:`~large_queue.cluster._consumer.Consumer`,
whose state they read and change under its lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from large_queue import errors
from large_queue.cluster._messages import OwnershipEvent
from large_queue.cluster._ownership import Ownership, OwnerState, successor

if TYPE_CHECKING:
    from large_queue._read_ahead import ReadAhead
    from large_queue.cluster._deliveries import Deliveries
    from large_queue.queue import Queue

log = logging.getLogger("large_queue.cluster")


class Turns:
    """The ownership watcher of a consumer (see the module's timeline)."""

    # the consumer's state these steps use (set by Consumer.__init__)
    queue: Queue
    node_id: str
    group: str | None
    ownership: Ownership
    deliveries: Deliveries
    timeout: float
    time_slice: float
    poll_interval: float
    _lock: threading.Condition
    _closed: threading.Event
    _gone: errors.LargeQueueError | None
    _on_event: Callable[[OwnershipEvent], None] | None
    _owning: bool
    _epoch: int
    _cursor: int
    _inflight: dict[int, int]
    _lost: int
    _dead: dict[int, int]
    _dead_lettered: int
    _synced: int
    _move_failures: dict[int, int]
    _seen_tail: int
    _ahead: ReadAhead
    _owner_since: float
    _last_owner_write: float
    _next_others_look: float

    if TYPE_CHECKING:

        def _sync_queue_head(self, *, force: bool = False) -> None: ...

        def _refuse_groups(self, groups: tuple[str, ...]) -> None: ...

    def _run(self) -> None:
        """The watcher: a tick every poll interval until closed (a failed tick is logged, the next tries).

        A queue (or group) deleted under the consumer ends its ownership at
        once and is logged once, not at every poll; every ``receive`` from
        then on raises it (``QueueNotFoundError``, ``GroupNotFoundError``; a
        consumer with no group, ``GroupsInUseError`` once groups were made),
        so a loop over the consumer ends instead of waiting for ever, until
        a tick finds it again (a group made anew; a queue made anew is
        another queue to this consumer's handle: open it and make a new
        consumer). A store that fails every tick (a server down) is logged
        as a warning when its error changes and when the ticks work again,
        not at every poll; each failure's traceback is logged at DEBUG.
        """
        failing: str | None = None  # the kind of error the ticks have been failing with
        while not self._closed.wait(self.poll_interval):
            try:
                self._tick()
                if failing is not None:
                    log.warning("node %r: ownership checks work again", self.node_id)
                    failing = None
                if self._gone is not None:
                    with self._lock:
                        self._gone = None
            except (errors.QueueNotFoundError, errors.GroupNotFoundError, errors.GroupsInUseError) as exc:
                with self._lock:
                    self._lose()
                    if self._gone is None:
                        log.warning("node %r: %s", self.node_id, exc)
                    self._gone = exc
                    self._lock.notify_all()  # a receive waiting for ownership raises it now
            except errors.LargeQueueError as exc:
                kind = type(exc).__name__
                if kind != failing:
                    log.warning(
                        "node %r: ownership check failed (tried again every poll): %s", self.node_id, exc
                    )
                    failing = kind
                log.debug("node %r: ownership check failed", self.node_id, exc_info=True)
            except Exception:  # a bug must not end the heartbeats of a consumer that looks open
                log.exception("node %r: ownership check failed unexpectedly", self.node_id)

    def _tick(self, *, starting: bool = False) -> None:
        if isinstance(self._gone, errors.QueueNotFoundError):
            # no heartbeat for a queue that is gone (or another now): a node that looks alive and
            # interested would be handed the queue, and hold it up until it fell silent
            self.queue.current_metadata()
        self.ownership.heartbeat(interested=True)
        with self._lock:
            # Read under the lock. Read before it, the state could predate a hand-over
            # that a receive() made meanwhile:
            #   t=0  tick reads owner=A, epoch 6
            #   t=1  receive() (holding the lock) hands over: owner=B, epoch 7
            #   t=2  tick takes the lock, sees owner=A but not owning, "becomes" owner
            #        at epoch 6 again; its writes are refused, yet it reports a take.
            state = self.ownership.read()
            if state.owner == self.node_id and state.instance != self.ownership.instance:
                # Handed to this node id and not claimed yet, or held by another consumer given
                # the same node id: claimed when unclaimed, when this consumer starts (a restart
                # takes over from its old self at once) or when the holder has gone silent.
                if self._owning:
                    self._lose()
                silent = state.silent_ms > state.timeout_ms
                if state.instance and not starting and not silent:
                    return
                if state.instance and not silent:
                    log.warning(
                        "node %r: another consumer with this node id held queue %r (epoch %d): this one takes"
                        " over; its unacked entries are delivered again",
                        self.node_id,
                        self.queue.name,
                        state.epoch,
                    )
                if self._take(state, owner_gone=silent and bool(state.instance)):
                    self._become_owner(self.ownership.read())
                return
            if state.owner == self.node_id:
                if not self._owning or self._epoch != state.epoch:
                    self._become_owner(state)
                    return
                if time.monotonic() - self._last_owner_write > self.timeout / 4:
                    try:
                        self.ownership.keep_alive(self._epoch)
                        self._last_owner_write = time.monotonic()
                    except errors.OwnershipLostError:
                        self._lose()
                        return
                if self._slice_over():
                    self._hand_over(final=False)
                return
            if self._owning:
                self._lose()
            if state.owner == "":
                if self.group is None:  # unowned as after the first group's creation: every node is told
                    self._refuse_groups(self.queue.current_metadata().groups)
                gone, after = False, state.last_owner
                candidates = self.ownership.live_interested()
            elif state.silent_ms > state.timeout_ms:
                gone, after = True, state.owner
                candidates = self.ownership.live_interested(excluding=state.owner)
            else:
                return
            if successor(after, candidates) == self.node_id and self._take(state, owner_gone=gone):
                self._become_owner(self.ownership.read())

    def _take(self, state: OwnerState, *, owner_gone: bool) -> int | None:
        """Take the queue from ``state`` (see :meth:`Ownership.take`); refused while groups consume it.

        The metadata is read first (takes are rare): a queue deleted and
        created again under this consumer has owner records of the same
        names, which this consumer's handle of the old queue must not take
        (``QueueNotFoundError``)::

            t=0  consumer A of group g on queue q; q is deleted, and made
                 again with a group g; consumer B of the new g starts.
            t=1  A's watcher finds the new g unowned: without this read it
                 took it, and held it for a whole time slice while every
                 receive of A raised; B waited for it.
        """
        metadata = self.queue.current_metadata()
        if self.group is None:
            self._refuse_groups(metadata.groups)
        return self.ownership.take(state, owner_gone=owner_gone)

    def _become_owner(self, state: OwnerState) -> None:
        if state.owner != self.node_id or state.instance != self.ownership.instance:
            return  # taken and lost again before we looked
        self._owning = True
        self._epoch = state.epoch
        self._cursor = state.cursor
        self._inflight = dict(state.inflight)
        self._lost, self._dead, self._dead_lettered = state.lost, dict(state.dead), state.dead_lettered
        self._synced = 0
        self.deliveries.reset()
        self._move_failures.clear()
        self._seen_tail = 0  # the first delivery reads the metadata (and finds a queue created again)
        self._ahead.clear()
        self._owner_since = self._last_owner_write = time.monotonic()
        self._event("take")
        self._lock.notify_all()

    def _lose(self) -> None:
        if self._owning:
            self._owning = False
            self.deliveries.reset()
            self._event("lost")

    def _slice_over(self) -> bool:
        return time.monotonic() - self._owner_since > self.time_slice

    def _hand_over(self, *, final: bool) -> None:
        """Pass the queue to the next interested live node, if any (stopConsumers).

        No delivery starts once the slice is over; messages this node's
        consumers still hold get up to half the timeout to be acked first, so
        that a busy consumer does not turn them into redeliveries.
        """
        now = time.monotonic()
        grace_over = now - self._owner_since > self.time_slice + self.timeout / 2
        waiting = self.deliveries.held and not final and not grace_over
        if waiting and now < self._next_others_look:
            return  # held messages' grace: who else wants the queue is looked up once a poll, not per call
        self._next_others_look = now + self.poll_interval
        others = self.ownership.live_interested(excluding=self.node_id)
        if not others and not final:
            self._owner_since = time.monotonic()  # nobody else wants it: a new slice, at once
            return
        if waiting:
            return
        self._sync_queue_head(force=True)
        if self.ownership.hand_over(self._epoch, successor(self.node_id, others)):
            self._event("release")
        self._owning = False
        self.deliveries.reset()
        self._lock.notify_all()

    def _event(self, kind: str) -> None:
        """Tell ``on_event``. Its failure is logged, never raised: the change it reports has happened
        (an ack's write applied, ownership taken), and the watcher thread must go on."""
        if self._on_event is not None:
            try:
                self._on_event(
                    OwnershipEvent(kind=kind, node_id=self.node_id, epoch=self._epoch, at_ns=time.time_ns())
                )
            except Exception:
                log.exception(
                    "node %r: the on_event callback failed on a %r event (ignored)", self.node_id, kind
                )
