"""Model-based test of consumer groups: several groups, out-of-order acks, nacks, timeouts, dead letters.

Random steps on a tiny queue (so that it is full all the time): producers
append, each group's consumer receives, acks any held messages in any order,
nacks some, lets the visibility timeout pass (on a clock the test moves),
and entries delivered ``MAX_DELIVERIES`` times go to the dead-letter queue.
Invariants, checked at every step:

- a group is delivered an entry again only if it has not acked it, and
  never while a delivery of it is still held; the delivery count grows by 1;
- no entry is acked twice in a group, or both acked and dead-lettered;
- the head never passes an entry some group has not acked or dead-lettered;
- at the end, after draining, every entry was acked exactly once per group
  or dead-lettered exactly once.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from large_queue import DeliveryExpiredError, Queue, QueueFullError
from large_queue.cluster import Consumer, Message
from tests.fix_backends import Store

GROUPS = ("g1", "g2", "g3")
MAX_DELIVERIES = 3
VISIBILITY = 5.0


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class GroupsMachine(RuleBasedStateMachine):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.clock = _Clock()
        self.produced: list[int] = []
        self.held: dict[str, dict[int, Message]] = {g: {} for g in GROUPS}
        self.counts: dict[str, Counter[int]] = {g: Counter() for g in GROUPS}
        self.acked: dict[str, set[int]] = {g: set() for g in GROUPS}
        self.consumers: dict[str, Consumer] = {}
        self.stale: dict[str, list[Message]] = {g: [] for g in GROUPS}

    @initialize(slots=st.integers(2, 4))
    def create(self, slots: int) -> None:
        self.queue: Queue = self.store.new_queue(capacity=2 * slots, slots_per_record=slots)
        self.dead = self.store.new_queue(capacity=64, slots_per_record=16)
        for group in GROUPS:
            consumer = self.queue.consumer(
                "n",
                group=group,
                time_slice=3600,
                timeout=3600,
                poll_interval=1800,
                visibility_timeout=VISIBILITY,
                max_deliveries=MAX_DELIVERIES,
                dead_letter=self.dead,
            ).start()
            consumer.deliveries.clock = self.clock
            self.consumers[group] = consumer

    def teardown(self) -> None:
        if not hasattr(self, "queue"):
            return
        try:
            self._drain_and_check()
        finally:
            for consumer in self.consumers.values():
                consumer.close()

    # --- steps ---------------------------------------------------------------------

    @rule(count=st.integers(1, 3))
    def produce(self, count: int) -> None:
        values = list(range(len(self.produced), len(self.produced) + count))
        try:
            offsets = self.queue.enqueue_batch(values)
        except QueueFullError:
            info = self.queue.info()
            assert info.reserved_tail - info.head_offset + count > self.queue.capacity
            return
        assert list(offsets) == values  # offsets are the values: entry n is at offset n
        self.produced += values

    @rule(group=st.sampled_from(GROUPS), count=st.integers(1, 4))
    def receive(self, group: str, count: int) -> None:
        for message in self.consumers[group].receive(count):
            self._delivered(group, message)

    def _delivered(self, group: str, message: Message) -> None:
        offset = message.offset
        assert message.value == offset
        assert offset not in self.acked[group], f"{group}: acked offset {offset} delivered again"
        assert offset not in self.held[group], f"{group}: offset {offset} delivered while held"
        self.counts[group][offset] += 1
        assert message.delivery_count == self.counts[group][offset]
        assert message.delivery_count <= MAX_DELIVERIES
        self.held[group][offset] = message

    @rule(group=st.sampled_from(GROUPS), data=st.data())
    def ack_some(self, group: str, data: st.DataObject) -> None:
        held = sorted(self.held[group])
        if not held:
            return
        chosen = data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True))  # any order
        self.consumers[group].ack([self.held[group][o] for o in chosen])
        for offset in chosen:
            del self.held[group][offset]
            self.acked[group].add(offset)

    @rule(group=st.sampled_from(GROUPS), data=st.data())
    def nack_one(self, group: str, data: st.DataObject) -> None:
        if self.held[group]:
            offset = data.draw(st.sampled_from(sorted(self.held[group])))
            self.held[group].pop(offset).nack(error=f"failed {offset}")

    @rule()
    def visibility_timeout_passes(self) -> None:
        self.clock.now += VISIBILITY + 1  # every held delivery expires: it will be delivered again
        for group, held in self.held.items():
            self.stale[group] += held.values()
            held.clear()

    @rule(group=st.sampled_from(GROUPS), data=st.data())
    def ack_a_timed_out_delivery(self, group: str, data: st.DataObject) -> None:
        if not self.stale[group]:
            return
        message = self.stale[group].pop(data.draw(st.integers(0, len(self.stale[group]) - 1)))
        offset = message.offset
        dead = self._dead_offsets().get(group, set())
        if self.counts[group][offset] > message.delivery_count and offset not in self.acked[group] | dead:
            with pytest.raises(DeliveryExpiredError):  # delivered again since: only the latest counts
                message.ack()
            return
        message.ack()  # not delivered again yet (SQS-like: still acked), or acked or dead-lettered (no-op)
        if offset not in self.acked[group] | dead:
            self.acked[group].add(offset)
            self.held[group].pop(offset, None)

    @precondition(lambda self: hasattr(self, "queue"))
    @invariant()
    def head_never_passes_an_unsettled_entry(self) -> None:
        head = self.queue.info().head_offset
        dead = self._dead_offsets()
        for group in GROUPS:
            settled = self.acked[group] | dead.get(group, set())
            assert all(o in settled for o in range(head)), f"head {head} passed an unsettled entry of {group}"

    # --- checks --------------------------------------------------------------------

    def _dead_offsets(self) -> dict[str, set[int]]:
        info = self.dead.info()
        letters = [self.dead.get(o) for o in range(info.head_offset, info.tail_offset)]
        by_group: dict[str, list[int]] = {}
        for letter in letters:
            assert letter is not None
            by_group.setdefault(letter.value["group"], []).append(letter.value["offset"])
        for group, offsets in by_group.items():
            assert len(offsets) == len(set(offsets)), f"{group}: dead-lettered twice: {offsets}"
            assert not set(offsets) & self.acked[group], f"{group}: acked and dead-lettered"
        return {group: set(offsets) for group, offsets in by_group.items()}

    def _drain_and_check(self) -> None:
        for group in GROUPS:
            consumer = self.consumers[group]
            for _ in range(4 * MAX_DELIVERIES * (len(self.produced) + 1)):
                self.clock.now += VISIBILITY + 1
                self.held[group].clear()
                messages = consumer.receive(8)
                for message in messages:
                    self._delivered(group, message)
                consumer.ack(messages)
                self.acked[group] |= {m.offset for m in messages}
                self.held[group].clear()
                described = self.queue.group(group)
                if not messages and described.lag == 0 and described.in_flight == 0:
                    break
        dead = self._dead_offsets()
        for group in GROUPS:
            settled = Counter(self.acked[group]) + Counter(dead.get(group, set()))
            assert settled == Counter(self.produced), f"{group}: {settled} != every produced entry once"
            letters = [m for m in dead.get(group, set())]
            assert all(self.counts[group][o] == MAX_DELIVERIES for o in letters)


def test_groups_match_the_model(store: Store) -> None:
    scale = {"max_examples": 50, "stateful_step_count": 40} if store.remote else {"max_examples": 100}
    run_state_machine_as_test(lambda: GroupsMachine(store), settings=settings(deadline=None, **scale))
