"""Consumer groups of a queue: each has its own cursor, and together they hold back the head.

A group is a named consumer of every entry (like a Kafka consumer group or a
Redis Streams group): its nodes share it through the ownership protocol of
:mod:`large_queue.cluster._ownership`, with the group's own owner record
(cursor, in-flight entries, lost and dead-lettered counts). The queue's
metadata record lists the groups (bin ``groups``, written only under the
queue lock); while it lists any, destructive dequeues and the ungrouped
consumer are refused (``GroupsInUseError``), and the head that producers see
is the lowest acked position over the groups: no producer can overwrite an
entry a group has not acked, unless it appends with ``overwrite_if_full``,
and then the group is told what it lost.

Creating and deleting a group take the queue lock, so they are ordered with
every head move. The failure story, as a timeline::

    t=0  G1 acks up to 120; its head sync takes the lock, reads the groups
         [G1, G2] and their owner records (G2 acked up to 80) and commits
         head 80: producers may reuse slots below 80 only.
    t=1  "audit" is created: under the lock it reads head 80, writes its
         owner record with cursor 80, and commits groups [G1, G2, audit].
         A creation that dies between the two writes leaves an owner record
         nobody lists; creating the group again rewrites it.
    t=2  G2 acks up to 130; its sync reads audit's cursor 80: the head
         stays at 80 until audit acks.
    t=3  audit is deleted: the lock commit drops it from the list first,
         then its records go. Its nodes' next owner write finds no record
         and raises GroupNotFoundError.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from large_queue import _lifecycle, errors
from large_queue import _records as rec
from large_queue._seek import as_ms
from large_queue._txn import internal
from large_queue.backends import Read, RecordKey, Write, WriteMode
from large_queue.backends.conditions import IntBin, StrBin, all_of, eq, le
from large_queue.cluster._ownership import (
    CURSOR,
    DEAD,
    DEAD_LETTERED,
    EPOCH,
    INFLIGHT,
    INSTANCE,
    LAST_OWNER,
    LOST,
    OWNER,
    NodeState,
    Ownership,
    acked_position,
    unseat,
)
from large_queue.lock import LockGrant
from large_queue.queue import Queue

MAX_GROUP_NAME_CHARS = 40


@dataclass(frozen=True, kw_only=True)
class GroupInfo:
    """A consumer group as stored now: who owns it, how far it got, and what it is owed.

    ``lag`` is the end of the published prefix minus ``acked_offset`` (or
    the queue's head, where the head has passed it): the entries the group
    has still to ack. ``lost`` counts entries overwritten (or expired) before
    the group acked them, also those its consumers have not yet met;
    ``dead_lettered`` those moved to its dead-letter queue.
    """

    name: str
    owner: str | None
    epoch: int
    delivered_offset: int
    acked_offset: int
    in_flight: int
    lag: int
    lost: int
    dead_lettered: int
    nodes: list[NodeState]


def check_group(name: object) -> str:
    """Return ``name`` if it is a valid group name, else raise ``InvalidArgumentError``."""
    return rec.check_name("group name", name, MAX_GROUP_NAME_CHARS)


def check_new_group(name: object) -> str:
    """:func:`check_group`, and not a name whose records' keys could be another group's.

    A group's records are keyed ``queue-group-<name>`` (its owner record),
    ``...-<name>-nodes`` (its node list) and ``...-<name>-node-<node id>``
    (each node's heartbeat). Group ``g-nodes`` would own group ``g``'s node
    list as its owner record, and group ``g-node-x`` node ``x``'s heartbeat:
    deleting ``g`` would remove the other's records, and a heartbeat would
    keep its dead owner looking alive. A name holding ``-node-`` or ending in
    ``-node`` or ``-nodes`` is the only kind that can meet another's keys.
    """
    check_group(name)
    assert isinstance(name, str)
    if "-node-" in name or name.endswith(("-node", "-nodes")):
        raise errors.InvalidArgumentError(
            f"group name {name!r} cannot be created: a name holding '-node-' or ending in '-node' or"
            " '-nodes' could name another group's records (its node list or a node's heartbeat)"
        )
    return name


def create(queue: Queue, name: str) -> bool:
    """Create group ``name`` starting at the queue's head; False if it already exists.

    The group will see every entry still in the queue and every later one.
    Its owner record is written under the queue lock, guarded so that a
    holder whose lock was broken cannot reset a group another made since::

        t=0  A takes the lock to create group g (not listed), reads g's owner
             record (none, or one left by a deleted g) and renews the lock.
        t=1  A is paused past the lock's TTL.
        t=2  B breaks the lock, creates g and commits; consumers ack 0..2.
        t=9  A resumes: its write of g's owner record is refused (it expected
             no record, or the generation it read at t=0), so the acked
             cursor stays; A gets LockLostError. Had B created g before A's
             renew at t=0, the renew would have failed instead.

    The first group fences the queue's ungrouped consumer, if one owns it
    (its next write is refused, as after a purge), under the same lock: from
    then on it refuses to take the queue again and its ``receive`` raises
    ``GroupsInUseError``, as its ``start`` would have.
    """
    check_new_group(name)
    keys = queue.keys.group(name)
    with queue.lock.holding(internal(f"group:{name}")) as grant:
        if name in grant.groups:
            queue.lock.release(grant)
            return False
        while True:
            existing = queue.backend.get(keys.owner)
            grant = queue.lock.renew(grant)  # LockLostError if it was broken: nothing written
            epoch = (
                (existing.bins.get(EPOCH, 0) + 1) if existing is not None else 0
            )  # a stale owner stays fenced
            try:
                queue.backend.put(
                    keys.owner,
                    {
                        OWNER: "",
                        EPOCH: epoch,
                        LAST_OWNER: "",
                        CURSOR: grant.head,
                        INFLIGHT: {},
                        LOST: 0,
                        DEAD: {},
                        DEAD_LETTERED: 0,
                    },
                    mode=WriteMode.CREATE_ONLY if existing is None else WriteMode.UPDATE_ONLY,
                    generation=None if existing is None else existing.generation,
                )
                break
            except (errors.RecordExistsError, errors.GenerationMismatchError, errors.RecordNotFoundError):
                continue  # written since it was read: by a later lock holder (the renew says) or an old owner
        if not grant.groups:
            unseat(queue, None)
        queue.lock.commit(grant, groups=sorted([*grant.groups, name]))
    return True


def delete(queue: Queue, name: str) -> bool:
    """Delete group ``name`` and its records; False if there is no such group.

    The head then follows the remaining groups: the commit that unlists the
    group moves it up to where they have all acked (one more read), since
    their consumers move it only after further acks, which a queue the
    deleted group kept full would never get. With none left, the queue may
    be dequeued directly again. The records go while the lock is held
    (renewed first), before the commit that unlists the group: removed after
    the lock's release, they could be another process's group of the same
    name, created in between, leaving it listed with no records.
    """
    check_group(name)
    removed = False
    while True:
        try:
            with queue.lock.holding(internal(f"group:{name}")) as grant:
                if name not in grant.groups:
                    queue.lock.release(grant)
                    return removed
                grant = queue.lock.renew(grant)  # LockLostError if it was broken: nothing removed
                _lifecycle.remove_ownership(queue.backend, queue.keys.group(name))
                removed = True
                remaining = [g for g in grant.groups if g != name]
                if not remaining:
                    _restart_ungrouped_cursor(queue, grant.head)
                    queue.lock.commit(grant, groups=remaining)
                    return True
                head = min(acked_floor(queue, tuple(remaining), grant.head), grant.tail)
                if head > grant.head:  # (a seek may have moved a cursor past unpublished offsets)
                    skipped = head if queue.marked else None
                    queue.lock.commit(grant, groups=remaining, head=head, skipped_to=skipped)
                else:
                    queue.lock.commit(grant, groups=remaining)
            return True
        except errors.LockLostError:
            if not removed:
                raise
            # Its records are gone and it is still listed (paused past the lock's TTL between the
            # two): take the lock again and unlist it, rather than leave a group with no records.


def _restart_ungrouped_cursor(queue: Queue, head: int) -> None:
    """With the last group gone, the queue's own cursor (if a consumer ever had one) starts at ``head``.

    The groups consumed what lies below it: left behind, that cursor would
    make the next ungrouped consumer count those entries as lost (and raise
    ``DataLossError`` with ``on_data_loss="fail"``). Its in-flight entries
    below the head went the same way; those at or above it (delivered to an
    ungrouped consumer that died, the groups having taken nothing) stay, to
    be delivered again. Its epoch moves on, so that an owner from before the
    groups is fenced and its unacked entries go to the next. Done under the
    queue lock, before the commit that unlists the last group.
    """
    key = queue.keys.group(None).owner
    while True:
        record = queue.backend.get(key)
        if record is None:
            return
        inflight = record.bins.get(INFLIGHT)
        if not isinstance(inflight, dict):
            inflight = {}
        try:
            queue.backend.put(
                key,
                {
                    OWNER: "",
                    INSTANCE: "",
                    EPOCH: record.bins.get(EPOCH, 0) + 1,
                    CURSOR: max(head, record.bins.get(CURSOR, 0)),
                    INFLIGHT: {o: n for o, n in inflight.items() if int(o) >= head},
                },
                mode=WriteMode.UPDATE_ONLY,
                generation=record.generation,
            )
            return
        except (errors.GenerationMismatchError, errors.RecordNotFoundError):
            continue  # a paused owner from before the groups wrote it: read it again


def names(queue: Queue) -> list[str]:
    """The queue's groups, by name."""
    return list(queue.current_metadata().groups)


def describe(queue: Queue, name: str, *, timeout: float = 10.0) -> GroupInfo:
    """Group ``name`` as stored now (``GroupNotFoundError`` if there is none)."""
    metadata = queue.current_metadata()
    if name not in metadata.groups:
        raise errors.GroupNotFoundError(
            f"queue {queue.name!r} has no consumer group {name!r} (groups: {list(metadata.groups)})",
            queue=queue.name,
            group=name,
        )
    head, tail = queue.published_tail()
    return describe_at(queue, name, tail, head, timeout=timeout)


def describe_all(queue: Queue, *, timeout: float = 10.0) -> list[GroupInfo]:
    """Every group of the queue, as stored now."""
    return list(queue.info().groups)


def describe_listed(
    queue: Queue, names: tuple[str, ...], tail: int, head: int
) -> tuple[list[GroupInfo], str | None]:
    """The groups ``names`` (as the metadata record lists them) described at ``tail`` and ``head``,
    and what is damaged if one is listed without its records.

    A group whose records are gone is passed over: a delete of it is under
    way, which removes its records holding the queue lock before it takes
    it off the list. One still listed when the metadata is read again with
    the lock free was left by a delete cut short: that is damage, since it
    holds the queue's head where it had got to.
    """
    described = []
    missing = []
    for name in names:
        try:
            described.append(describe_at(queue, name, tail, head))
        except errors.GroupNotFoundError:
            missing.append(name)
    if missing:
        again = queue.current_metadata()
        left = [name for name in missing if name in again.groups]
        if left and not again.lock_owner:
            return described, (
                f"consumer group {left[0]!r} is listed without its records (a delete of it cut short):"
                f" it holds the queue's head where it had got to (large-queue groups {queue.name}"
                f" --delete {left[0]})"
            )
    return described, None


def describe_at(queue: Queue, name: str, tail: int, head: int, *, timeout: float = 10.0) -> GroupInfo:
    """Group ``name``, its lag counted up to ``tail`` (the end of the published prefix) from ``head`` on.

    Entries below the queue's head that the group had not acked are lost,
    whether or not its consumers have met the loss yet (they count it, as
    here, when they next deliver).
    """
    ownership = Ownership(queue, "info", timeout=timeout, group=name)
    state = ownership.read()
    acked = acked_position(state.cursor, state.inflight)
    unseen_loss = max(0, head - state.cursor) + sum(1 for offset in state.inflight if offset < head)
    return GroupInfo(
        name=name,
        owner=state.owner or None,
        epoch=state.epoch,
        delivered_offset=state.cursor,
        acked_offset=acked,
        in_flight=len(state.inflight),
        lag=max(0, tail - max(acked, head)),
        lost=state.lost + unseen_loss,
        dead_lettered=state.dead_lettered,
        nodes=ownership.nodes(),
    )


def acked_floor(queue: Queue, groups: tuple[str, ...], head: int) -> int:
    """The lowest acked position over ``groups`` (one batch read): the head may move up to it.

    A listed group whose owner record cannot be read holds the head where
    it is: nothing is freed on a guess.
    """
    keys: list[tuple[RecordKey, list[Any] | None]] = [
        (queue.keys.group(name).owner, [Read(CURSOR), Read(INFLIGHT)]) for name in groups
    ]
    floor: int | None = None
    if not groups:
        return head
    for bins in queue.backend.batch_read(keys):
        if bins is None:
            return head
        inflight = {int(o): c for o, c in (bins.get(INFLIGHT) or {}).items()}
        acked = acked_position(bins.get(CURSOR, head), inflight)
        floor = acked if floor is None else min(floor, acked)
    return head if floor is None else floor


def consumed_floor(queue: Queue, groups: tuple[str, ...], head: int) -> int:
    """Where every group has acked up to, or without groups the cluster shim's consumers; at least
    ``head`` (one read). What a drop from the head passes below it was consumed already, not dropped:
    the head follows the consumers' acks only now and then.
    """
    if groups:
        return max(head, acked_floor(queue, groups, head))
    try:
        bins = queue.backend.operate(queue.keys.group(None).owner, [Read(CURSOR), Read(INFLIGHT)])
    except errors.RecordNotFoundError:  # no shim consumer ever ran on it
        return head
    inflight = {int(o): c for o, c in (bins.get(INFLIGHT) or {}).items()}
    return max(head, acked_position(bins.get(CURSOR, head), inflight))


def acked(queue: Queue, name: str) -> int:
    """Where group ``name`` has acked up to (every offset below it is acked). One command."""
    state = Ownership(queue, "cursor", timeout=1.0, group=name).read()
    return acked_position(state.cursor, state.inflight)


def commit_cursor(queue: Queue, name: str, offset: int) -> None:
    """Set group ``name``'s cursor to ``offset`` (all below it acked), for a reader that is no node.

    A Spark stream reading as a group commits this way when a micro-batch
    commits. Guarded on the store: no node owns the group (its nodes'
    deliveries are theirs to ack), and the cursor never moves back (a
    micro-batch committed again is a no-op). Then the queue's head follows
    the groups. An offset past the queue's tail (a stream's offsets from
    another creation of the queue, say) is refused: nothing is written, since
    acking offsets not yet written would skip the entries that come there.
    """
    tail = queue.current_metadata().tail  # QueueNotFoundError if this handle's queue was made again
    if offset > tail:
        raise errors.InvalidArgumentError(
            f"group {name!r} of queue {queue.name!r} cannot ack up to offset {offset}: the queue's tail is"
            f" {tail} (offsets not written yet cannot be acked)"
        )
    keys = queue.keys.group(name)
    guard = all_of(eq(StrBin(OWNER), ""), le(IntBin(CURSOR), offset))
    try:
        queue.backend.operate(keys.owner, [Write(CURSOR, offset), Write(INFLIGHT, {})], condition=guard)
    except errors.RecordNotFoundError:
        raise Ownership(queue, "cursor", timeout=1.0, group=name).missing() from None
    except errors.ConditionNotMetError:
        state = Ownership(queue, "cursor", timeout=1.0, group=name).read()
        if state.owner:
            raise errors.GroupsInUseError(
                f"group {name!r} of queue {queue.name!r} is consumed by node {state.owner!r}: a reader"
                " that is no node cannot commit its cursor; use a group of its own",
                queue=queue.name,
                group=name,
            ) from None
        return  # already at or past it
    advance_head(queue)


def seek(queue: Queue, name: str, to: object) -> int:
    """Move group ``name``'s cursor to ``to``: replay from an earlier offset, or skip ahead.

    ``to`` is an offset (an int), ``"head"`` (the oldest entry still
    queued), ``"tail"`` (the end of the published prefix: only later
    entries) or a moment (an aware ``datetime``): the first entry enqueued at
    or after it (:meth:`Queue.offset_at`), or the head where every entry
    still queued is younger. An offset outside [head, end of the published prefix] is
    refused (``InvalidArgumentError``) before anything is written: entries
    below the head are gone. Returns the group's new cursor.

    Like Kafka's offset reset or Redis's ``XGROUP SETID``, but it needs no
    stopped consumers: the group's owner is fenced, as if it had died, and
    the next owner delivers from the new cursor. Messages delivered and not
    acked are forgotten (their acks raise ``OwnershipLostError``). Under the
    queue lock, so the head cannot pass a cursor moved back; the timeline::

        t=0  S takes the queue lock, reads head 100 and the end of the
             published prefix 250, and g's owner record (owner A, epoch 5,
             cursor 240); S seeks g to 120, renews the lock.
        t=1  S writes g's record (:func:`large_queue.cluster._ownership.unseat`):
             no owner, epoch 6, cursor 120, nothing in flight and no
             dead-letter move under way, guarded by the record's generation
             (had A acked since it was read, S reads it again).
        t=2  A's next write (a delivery, an ack, its heartbeat) is refused:
             epoch 5 is over. A rejoins as a non-owner.
        t=3  The next interested live node after A takes g at epoch 7 and
             delivers 120, 121, ... again.
        t=4  S moves the queue's head up to the groups' lowest acked
             position (it moves only if g was the lowest and moved ahead)
             and releases the lock.

    A Spark stream reading as the group keeps its own offsets (in its
    checkpoint): it goes on from them, not from a seek. A dead-letter move
    under way when the seek comes is forgotten with the rest: its entry is
    delivered again if the seek went back over it (and may be moved again),
    and a letter it had already written stays in the dead-letter queue,
    uncounted. A seek is a replay: entries may be handled twice.
    """
    check_seek(queue, name, to)
    if name not in queue.current_metadata().groups:  # refused before the lock is taken (and again under it)
        raise Ownership(queue, "seek", timeout=1.0, group=name).missing()
    # a moment is looked up before the lock (a bisection): an offset the head passes meanwhile is clamped
    guessed = queue.offset_at(to) if isinstance(to, datetime.datetime) else None
    with queue.lock.holding(internal(f"group:{name}:seek")) as grant:
        if name not in grant.groups:  # (the lock is released on the way out of ``holding``)
            raise Ownership(queue, "seek", timeout=1.0, group=name).missing()
        _, end = queue.published_tail()
        if guessed is not None:
            target = min(max(guessed, grant.head), end)
        elif type(to) is int:
            target = to
            if not grant.head <= target <= end:  # the head passed it since it was checked
                raise _out_of_range(queue, name, target, grant.head, end)
        else:
            target = grant.head if to == "head" else end
        grant = queue.lock.renew(grant)  # LockLostError if it was broken: nothing written
        if not unseat(queue, name, **{CURSOR: target, INFLIGHT: {}, DEAD: {}}):
            raise Ownership(queue, "seek", timeout=1.0, group=name).missing()
        head = min(acked_floor(queue, grant.groups, grant.head), grant.tail)
        moved = head > grant.head  # g was the lowest, and skipped ahead
        queue.lock.commit(
            grant, head=head if moved else None, skipped_to=head if moved and queue.marked else None
        )
    return target


def check_seek(queue: Queue, name: str, to: object) -> None:
    """Refuse a seek of group ``name`` to ``to`` that cannot be made (``InvalidArgumentError``).

    The group's name, the kind of ``to``, a moment's time zone, and an
    offset's place in the queue as it is now (one read); whether the group
    exists is not looked at.
    """
    check_group(name)
    if not (type(to) is int or to in ("head", "tail") or isinstance(to, datetime.datetime)):
        raise errors.InvalidArgumentError(
            f"a group seeks to an offset (an int), 'head', 'tail' or an aware datetime, got {to!r}"
        )
    if isinstance(to, datetime.datetime):
        as_ms(to)  # a time without a zone is refused
    elif type(to) is int:
        head, end = queue.published_tail()
        if not head <= to <= end:
            raise _out_of_range(queue, name, to, head, end)


def _out_of_range(queue: Queue, name: str, offset: int, head: int, end: int) -> errors.InvalidArgumentError:
    why = "below the head, entries are gone" if offset < head else "past the tail, nothing is there yet"
    return errors.InvalidArgumentError(
        f"group {name!r} of queue {queue.name!r} cannot seek to offset {offset}: the queue holds"
        f" offsets {head} to {end} ({why})"
    )


def advance_head(queue: Queue) -> None:
    """Move the queue's head up to the lowest acked position over its groups (under the lock)."""
    move_head(queue, internal("groups:head"), lambda grant: acked_floor(queue, grant.groups, grant.head))


def move_head(queue: Queue, txn_id: str, target: Callable[[LockGrant], int]) -> int | None:
    """Under the queue lock, move the head up to ``target(grant)``; the head after (None: lock lost).

    The head never moves back; a lost lock leaves it to the next move.
    """
    grant = queue.lock.acquire(txn_id)
    try:
        try:
            head = target(grant)
        except BaseException:  # not left held until it expires
            with contextlib.suppress(errors.LargeQueueError):
                queue.lock.release(grant)
            raise
        head = min(head, grant.tail)  # never past the tail: the queue would read as damaged
        if head > grant.head:
            # a group's cursor may have been moved past offsets never published (a seek, say)
            queue.lock.commit(grant, head=head, skipped_to=head if queue.marked else None)
        else:
            queue.lock.release(grant)
    except errors.LockLostError:
        return None
    return max(head, grant.head)


def ensure(queue: Queue, name: str) -> None:
    """Create group ``name`` unless it exists (first use); reads the metadata record only if it does."""
    if name not in queue.current_metadata().groups:
        create(queue, name)


__all__ = [
    "GroupInfo",
    "acked",
    "acked_floor",
    "advance_head",
    "check_group",
    "commit_cursor",
    "consumed_floor",
    "create",
    "delete",
    "describe",
    "describe_all",
    "describe_at",
    "ensure",
    "move_head",
    "names",
    "seek",
]
