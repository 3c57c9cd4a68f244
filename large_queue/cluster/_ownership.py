"""Ownership records of a queue and the one-command steps of the protocol.

Records, in the queue's set and metadata namespace:

- ``queue-owner``: ``owner`` (node id, "" when unowned), ``instance`` (which
  consumer of that node id holds it: a token made per consumer object, ""
  while handed over and not yet claimed), ``epoch`` (grows at every change
  of owner), ``last_owner``, ``cursor`` (next offset to deliver) and
  ``inflight`` (offset -> delivery count of entries delivered, not acked).
  Every write the owner makes is guarded by "instance and epoch are mine"
  (the instance names the owner), and each one is also the owner's heartbeat: the record's time since
  last update, on the store's clock, tells whether the owner is alive.
- ``queue-nodes``: the ids of nodes that ever joined (a generation-checked list).
- ``queue-node-<id>``: one per node, rewritten by its heartbeat, with
  ``interested`` (1 or 0). A node silent longer than the timeout is gone.

Each node states its own ``timeout`` in its node record (``timeout_ms``) and,
while it owns the queue, in the owner record (``owner_timeout``, beside the
instance that took it, so that a take by a version that does not know the
bin leaves nothing stale to be believed): a node is judged gone only
once it has been silent for longer than the timeout it stated, whatever
timeout the judge was given. Nodes given different timeouts would otherwise
take a queue from a live owner::

    t=0    A (timeout 60 s) owns the queue; it rewrites the owner record
           every 15 s (a quarter of its timeout).
    t=6    B (timeout 5 s) reads the owner record, silent for 6 s. Judged
           by B's own timeout A would be gone, and B would take the queue
           and deliver A's unacked entries again while A still works on
           them. Judged by the 60 s A stated, A is alive: B waits.
    t=61   A has written nothing for 61 s (dead, or paused): B takes over.

A record that states no timeout (written before nodes stated theirs, or an
owner record handed over and not yet claimed) is judged by the judge's own.

The failure story, as a timeline (timeout 10 s)::

    t=0    A owns the queue at epoch 4 and delivers offsets 100..109 (the
           write records them in ``inflight``).
    t=1    A is paused (GC, SIGSTOP) before acking them.
    t=11   The owner record has not been written for 10 s: A counts as gone.
           B, the next interested live node after A in node-id order, takes
           ownership: owner=B, epoch=5, guarded by "owner is A, epoch is 4
           and the record is silent past the timeout".
    t=11   B redelivers 100..109 (delivery count 2, marked redelivered).
    t=20   A resumes and acks 100..109: its write is guarded by epoch 4 and
           is refused; A gets OwnershipLostError, stops its consumers and
           rejoins as a non-owner. B's consumers ack them once.

Two consumers given one node id (a process restarted before its old self
was seen gone, or one id configured twice) are told apart by ``instance``::

    t=0    A1 (node "a") owns the queue at epoch 4 and delivers 100..109.
    t=1    A1 is paused. A2 starts with node id "a": it finds the queue held
           by another instance of its node id and takes it over at once
           (epoch 5, instance A2's) instead of waiting for the timeout.
    t=1    A2 redelivers 100..109 (delivery count 2).
    t=5    A1 resumes: its writes, guarded by epoch 4 and its own instance,
           are refused (OwnershipLostError). A1 does not take the queue back
           while A2's writes keep the record fresh; it waits like any other
           node for a hand-over to "a" or for A2's silence.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from large_queue import errors
from large_queue._guarded import guarded_write
from large_queue._records import NODES
from large_queue.backends import Read, ReadSinceUpdate, Write, WriteMode
from large_queue.backends.conditions import (
    Bound,
    Condition,
    IntBin,
    Param,
    SinceUpdateMs,
    StrBin,
    all_of,
    eq,
    gt,
)
from large_queue.queue import Queue

OWNER = "owner"
INSTANCE = "instance"
EPOCH = "epoch"
LAST_OWNER = "last_owner"
CURSOR = "cursor"
INFLIGHT = "inflight"
SILENT_MS = "silent_ms"  # an expression result, not a stored bin
TIMEOUT_MS = "timeout_ms"  # a node record's: its node's own timeout (ms)
#: the owner record's: [instance, timeout in ms] of the consumer that took it (stale once another instance
#: holds it: one that does not know this bin, say)
OWNER_TIMEOUT = "owner_timeout"
INTERESTED = "interested"
LOST = "lost"  # groups: entries overwritten before the group acked them
DEAD = "dead"  # groups: offset -> dead-letter queue offset reserved for it, while it is moved
DEAD_LETTERED = "dead_lettered"  # groups: entries moved to the dead-letter queue
MAX_NODE_ID_CHARS = 40


#: the owner record names this consumer and this epoch (its instance token is its own, and is only ever
#: written beside its node id: so the token names the owner too, with one comparison less per write)
_MINE = all_of(eq(StrBin(INSTANCE), Param("instance")), eq(IntBin(EPOCH), Param("epoch")))


@dataclass(frozen=True, kw_only=True)
class OwnerState:
    """The owner record as read, with how long it has been silent (store's clock)."""

    owner: str
    epoch: int
    last_owner: str
    instance: str = ""  #: which consumer of the owner's node id holds it ("": handed over, not claimed)
    cursor: int
    inflight: dict[int, int]
    silent_ms: int
    timeout_ms: int  #: the owner's stated timeout, else the reader's own: silent past it, the owner is gone
    lost: int = 0
    dead: dict[int, int] = field(default_factory=dict)
    dead_lettered: int = 0


@dataclass(frozen=True, kw_only=True)
class NodeState:
    """One node as seen now."""

    node_id: str
    interested: bool
    alive: bool
    silent_ms: int | None
    timeout_ms: int | None = None  #: its stated timeout (None: it states none, or has no record)


def acked_position(cursor: int, inflight: dict[int, int]) -> int:
    """Every offset below it is acked: the lowest in-flight offset, or the cursor."""
    return min(inflight, default=cursor)


def successor(after: str, candidates: list[str]) -> str | None:
    """The first candidate after ``after`` in node-id order, circularly."""
    ordered = sorted(set(candidates))
    if not ordered:
        return None
    return next((node for node in ordered if node > after), ordered[0])


class Ownership:
    """The ownership records of one queue, seen by one node."""

    def __init__(self, queue: Queue, node_id: str, *, timeout: float, group: str | None = None) -> None:
        if not isinstance(node_id, str) or not 0 < len(node_id) <= MAX_NODE_ID_CHARS or "\x00" in node_id:
            raise errors.InvalidArgumentError(
                f"node_id must be a string of 1 to {MAX_NODE_ID_CHARS} characters and no NUL, got {node_id!r}"
            )
        try:
            node_id.encode()
        except UnicodeEncodeError:  # a lone surrogate: no store can key a record with it
            raise errors.InvalidArgumentError(
                f"node_id must be valid unicode text, got {node_id!r}"
            ) from None
        self.queue = queue
        self.backend = queue.backend
        self.node_id = node_id
        self.timeout_ms = max(1, round(timeout * 1000))
        self.group = group
        keys = queue.keys.group(group)
        self.owner_key = keys.owner
        self.nodes_key = keys.nodes
        self.node_key = keys.node
        #: this consumer among those given the same node id (see the module's second timeline)
        self.instance = uuid.uuid4().hex[:16]
        self._owner_is_me = Write(OWNER, node_id)  # in every owner write: made once
        self._guard: tuple[int, Condition] | None = None  # the guard of the epoch last written under

    # --- joining and heartbeats ---------------------------------------------------

    def join(self) -> None:
        """Create the owner record if needed (a group makes its own) and join the node list."""
        with contextlib.suppress(errors.RecordExistsError):
            if self.group is None:
                self.backend.put(
                    self.owner_key,
                    {
                        OWNER: "",
                        INSTANCE: "",
                        EPOCH: 0,
                        LAST_OWNER: "",
                        CURSOR: self.queue.info().head_offset,
                        INFLIGHT: {},
                    },
                    mode=WriteMode.CREATE_ONLY,
                )
        self.heartbeat(interested=True, join=True)
        while True:
            record = self.backend.get(self.nodes_key)
            nodes = list(record.bins.get(NODES, [])) if record else []
            if self.node_id in nodes:
                return
            try:
                if record is None:
                    self.backend.put(self.nodes_key, {NODES: [self.node_id]}, mode=WriteMode.CREATE_ONLY)
                else:
                    self.backend.put(
                        self.nodes_key, {NODES: sorted([*nodes, self.node_id])}, generation=record.generation
                    )
                return
            except (errors.RecordExistsError, errors.GenerationMismatchError):
                continue  # another node joined at the same moment: read again

    def heartbeat(self, *, interested: bool, join: bool = False) -> None:
        """Rewrite this node's record: it is alive, and whether it wants the queue.

        Only joining creates the record. A heartbeat that finds it gone
        (the queue was deleted with its records) checks that the queue's
        owner record is still there (``QueueNotFoundError`` or
        ``GroupNotFoundError`` if not), so a consumer left running on a
        deleted queue leaves nothing behind. Where it is there (the group
        was deleted and made again), the node joins again: written back
        without joining, the record would keep a node no one can hand the
        queue to, and outlive the group.
        """
        bins = {"node": self.node_id, INTERESTED: int(interested), TIMEOUT_MS: self.timeout_ms}
        if join:
            self.backend.put(self.node_key(self.node_id), bins)
            return
        try:
            self.backend.put(self.node_key(self.node_id), bins, mode=WriteMode.UPDATE_ONLY)
        except errors.RecordNotFoundError:
            self.read()
            if interested:
                self.join()

    # --- reading ----------------------------------------------------------------------

    def read(self) -> OwnerState:
        """The owner record now."""
        try:
            bins = self.backend.operate(
                self.owner_key,
                [
                    Read(OWNER),
                    Read(INSTANCE),
                    Read(EPOCH),
                    Read(LAST_OWNER),
                    Read(CURSOR),
                    Read(INFLIGHT),
                    Read(LOST),
                    Read(DEAD),
                    Read(DEAD_LETTERED),
                    Read(OWNER_TIMEOUT),
                    ReadSinceUpdate(SILENT_MS),
                ],
            )
        except errors.RecordNotFoundError:
            raise self.missing() from None
        inflight = bins.get(INFLIGHT) or {}
        return OwnerState(
            owner=bins.get(OWNER, ""),
            instance=bins.get(INSTANCE) or "",
            epoch=bins.get(EPOCH, 0),
            last_owner=bins.get(LAST_OWNER, ""),
            cursor=bins.get(CURSOR, 0),
            inflight={int(offset): int(count) for offset, count in inflight.items()},
            silent_ms=bins[SILENT_MS],
            timeout_ms=_stated_by_owner(bins) or self.timeout_ms,
            lost=bins.get(LOST) or 0,
            dead={int(offset): int(at) for offset, at in (bins.get(DEAD) or {}).items()},
            dead_lettered=bins.get(DEAD_LETTERED) or 0,
        )

    def missing(self) -> errors.QueueError:
        """The error for an owner record that is not there: the queue's own if the queue is gone.

        A group's record goes with its queue; ``QueueNotFoundError`` (one read
        of the metadata record, on this path only) then says what happened.
        """
        if self.group is not None:
            try:
                self.queue.current_metadata()
            except errors.QueueNotFoundError as gone:
                return gone
            return errors.GroupNotFoundError(
                f"queue {self.queue.name!r} has no consumer group {self.group!r} (it was deleted,"
                " or never created)",
                queue=self.queue.name,
                group=self.group,
            )
        return errors.QueueNotFoundError(
            f"queue {self.queue.name!r} has no ownership record: no consumer has joined it, or the queue"
            " was deleted",
            queue=self.queue.name,
        )

    def nodes(self) -> list[NodeState]:
        """Every node that joined, with its interest and liveness (one command each)."""
        record = self.backend.get(self.nodes_key)
        states = []
        for node_id in record.bins.get(NODES, []) if record else []:
            try:
                bins = self.backend.operate(
                    self.node_key(node_id), [Read(INTERESTED), Read(TIMEOUT_MS), ReadSinceUpdate(SILENT_MS)]
                )
            except errors.RecordNotFoundError:
                states.append(NodeState(node_id=node_id, interested=False, alive=False, silent_ms=None))
                continue
            stated = _stated(bins)
            states.append(
                NodeState(
                    node_id=node_id,
                    interested=bins.get(INTERESTED) == 1,
                    alive=bins[SILENT_MS] <= (stated or self.timeout_ms),
                    silent_ms=bins[SILENT_MS],
                    timeout_ms=stated,
                )
            )
        return states

    def live_interested(self, *, excluding: str = "") -> list[str]:
        """Ids of nodes alive and interested now."""
        return [n.node_id for n in self.nodes() if n.alive and n.interested and n.node_id != excluding]

    # --- changing the owner -----------------------------------------------------------------

    def take(self, state: OwnerState, *, owner_gone: bool) -> int | None:
        """Become owner if the record is still as read; the new epoch, or None if another won.

        ``owner_gone``: only if the owner is still silent past the timeout it
        stated (read with ``state``: the epoch guard keeps it the same).
        """
        guard: Condition = all_of(eq(StrBin(OWNER), state.owner), eq(IntBin(EPOCH), state.epoch))
        if owner_gone:
            guard = all_of(guard, gt(SinceUpdateMs(), state.timeout_ms))
        epoch = state.epoch + 1
        try:
            self.backend.operate(
                self.owner_key,
                [
                    Write(OWNER, self.node_id),
                    Write(INSTANCE, self.instance),
                    Write(EPOCH, epoch),
                    Write(LAST_OWNER, state.owner or state.last_owner),
                    Write(OWNER_TIMEOUT, [self.instance, self.timeout_ms]),
                ],
                condition=guard,
            )
        except errors.ConditionNotMetError:
            return None
        return epoch

    def hand_over(self, epoch: int, to: str | None) -> bool:
        """Pass ownership to ``to`` (None: nobody), only while this node owns ``epoch``."""
        try:
            self.backend.operate(
                self.owner_key,
                [
                    Write(OWNER, to or ""),
                    Write(INSTANCE, ""),  # claimed by whichever consumer of node ``to`` comes first
                    Write(EPOCH, epoch + 1),
                    Write(LAST_OWNER, self.node_id),
                    Write(OWNER_TIMEOUT, None),  # until ``to`` claims it and states its own
                ],
                condition=self._mine(epoch),
            )
        except errors.ConditionNotMetError:
            return False
        return True

    def commit(self, epoch: int, *, cursor: int, inflight: dict[int, int], **counts: Any) -> None:
        """Record delivery and ack state (and prove liveness), only while owning ``epoch``.

        ``counts`` are a group's other bins to write with it (``lost``,
        ``dead``, ``dead_lettered``).
        """
        operations = [self._owner_is_me, Write(CURSOR, cursor), Write(INFLIGHT, inflight)]
        if counts:
            operations += [Write(name, value) for name, value in counts.items()]
        self._owner_write(epoch, operations)

    def keep_alive(self, epoch: int) -> None:
        """Heartbeat as owner: rewrite the owner record, only while owning ``epoch``."""
        self._owner_write(epoch, [self._owner_is_me])

    def _mine(self, epoch: int) -> Condition:
        guard = self._guard  # one tuple, replaced whole: threads sharing the node read a consistent one
        if guard is None or guard[0] != epoch:
            guard = self._guard = (
                epoch,
                Bound(_MINE, {"instance": self.instance, "epoch": epoch}),
            )
        return guard[1]

    def _owner_write(self, epoch: int, operations: list[Any]) -> None:
        try:
            guarded_write(
                self.backend,
                self.owner_key,
                operations,
                self._mine(epoch),
                lost=lambda: errors.OwnershipLostError(
                    f"node {self.node_id!r} no longer owns queue {self.queue.name!r} (epoch {epoch} is over);"
                    " its unacked entries go to the new owner",
                    queue=self.queue.name,
                    node_id=self.node_id,
                    epoch=epoch,
                ),
                unknown=lambda cause: errors.OutcomeUnknownError(
                    f"an owner write of node {self.node_id!r} on queue {self.queue.name!r} timed out and may"
                    f" or may not have been applied; it was not repeated blindly ({cause})",
                    queue=self.queue.name,
                    stage=f"owner write at epoch {epoch}",
                ),
            )
        except errors.RecordNotFoundError:
            if self.group is not None:
                raise self.missing() from None
            raise errors.QueueNotFoundError(
                f"queue {self.queue.name!r} was deleted while node {self.node_id!r} owned it;"
                " nothing was delivered or acked",
                queue=self.queue.name,
            ) from None


def _stated_by_owner(bins: dict[str, Any]) -> int | None:
    """The timeout (ms) the owner record states for the instance holding it now; None if none."""
    stated = bins.get(OWNER_TIMEOUT)
    if type(stated) is list and len(stated) == 2 and stated[0] == bins.get(INSTANCE) and stated[0]:
        return _stated({TIMEOUT_MS: stated[1]})
    return None


def unseat(queue: Queue, group: str | None, **changes: Any) -> bool:
    """Take the queue (or ``group``) from whichever consumer owns it, as if it had died; False if no
    record is there.

    One write of the owner record, guarded by its generation (read again if
    its owner wrote meanwhile): no owner, a new epoch, so the owner's next
    write (a delivery, an ack, its heartbeat) is refused and it starts over
    as a non-owner; and ``changes`` to other bins. The next interested live
    node after it takes the queue from the record, as after a death, and
    reads the queue's head before its first delivery. Without ``changes`` a
    record that nobody owns is left as it is.
    """
    key = queue.keys.group(group).owner
    while True:
        record = queue.backend.get(key)
        if record is None:
            return False
        bins = record.bins
        if not changes and not bins.get(OWNER):
            return True
        try:
            queue.backend.put(
                key,
                {
                    OWNER: "",
                    INSTANCE: "",
                    EPOCH: bins.get(EPOCH, 0) + 1,
                    LAST_OWNER: bins.get(OWNER) or bins.get(LAST_OWNER, ""),
                    OWNER_TIMEOUT: None,
                    **changes,
                },
                mode=WriteMode.UPDATE_ONLY,
                generation=record.generation,
            )
            return True
        except (errors.GenerationMismatchError, errors.RecordNotFoundError):
            continue  # its owner wrote since it was read (or the record went): read it again


def _stated(bins: dict[str, Any]) -> int | None:
    """The timeout (ms) a record states; None where it states none (or not a positive int)."""
    stated = bins.get(TIMEOUT_MS)
    return stated if type(stated) is int and stated > 0 else None
