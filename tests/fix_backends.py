"""Pytest plugin: the ``store`` and ``place`` fixtures, one test run per backend.

``store`` gives a backend in this process; on the embedded store its clock is
moved by the tests by hand. ``place`` gives a store URL that other processes
(nodes, producers, Spark workers, the command line) open themselves, with
real clocks on both stores. The embedded store always runs. The Aerospike
store runs when ``LARGE_QUEUE_TEST_AEROSPIKE=host:port`` is set (a server
with namespaces ``test`` and ``bar``), or through testcontainers when a
Docker engine answers; otherwise its tests are skipped with the reason.
The one difference the tests see: the embedded store's clock is moved by
hand (``Store.clock``), while on Aerospike ``Store.advance`` waits for real.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from large_queue.backends import Backend, RecordKey, connect
from large_queue.backends._delegating import Delegating
from large_queue.backends.embedded import EmbeddedBackend
from large_queue.queue import Queue

AEROSPIKE_ENVIRONMENT_VARIABLE = "LARGE_QUEUE_TEST_AEROSPIKE"
AEROSPIKE_IMAGE = "aerospike/aerospike-server:8.1.0.0"

#: the second namespace every test store has (docker/aerospike.conf configures it too)
SECOND_NAMESPACE = "bar"
#: how producers append: every test parametrized with it runs under the lock and without it
APPENDS = ["lock", "reserve"]
#: the record size limit of the test stores (Aerospike's max-record-size in docker/aerospike.conf)
TEST_RECORD_SIZE_LIMIT = 8 * 1024 * 1024


class ManualClock:
    """The embedded store's clock, moved forward by tests instead of sleeping."""

    def __init__(self) -> None:
        self.now_ns = time.time_ns()

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1_000_000_000)


#: how many queue names each test has taken so far in this run
_NAMES_TAKEN: dict[str, int] = {}


def unique_name(base: str) -> str:
    """A queue name no other test uses, and the same one in every run.

    Aerospike keeps every set name a namespace has seen (at most 4,095)
    until the server restarts, and each queue is a set of its own: names
    drawn at random used up a test server in three or four runs of the
    suite. A name is made of the running test's id, hashed, and how many
    names that test took before it in this run. The fixtures delete what a
    name holds before handing it out (an earlier run may have died with it)
    and after the test.
    """
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]  # "...::test_x[aerospike] (call)"
    taken = _NAMES_TAKEN.get(test, 0)
    _NAMES_TAKEN[test] = taken + 1
    return f"{base}-{hashlib.blake2b(test.encode(), digest_size=5).hexdigest()}-{taken}"


@dataclass
class Store:
    """A backend under test and what the tests may do with its clock."""

    kind: str
    backend: Backend
    advance: Callable[[float], None]
    clock: ManualClock | None = None  # None: a real clock, which tests wait on
    remote: bool = False  # commands cross a network: state machines run fewer, shorter examples
    created: list[str] = field(default_factory=list)

    def damage(self, key: RecordKey) -> None:
        """Leave ``key``'s record holding data the store cannot read back."""
        if isinstance(self.backend, EmbeddedBackend):
            with sqlite3.connect(self.backend.path) as conn:  # bytes that are no msgpack map
                conn.execute(
                    "UPDATE records SET bins = ? WHERE namespace = ? AND set_name = ? AND user_key = ?",
                    (b"\xc1" * 40, key.namespace, key.set_name, key.user_key),
                )
        else:  # a value nested deeper than the client reads back, written past the library
            nested: object = 0
            for _ in range(70):
                nested = [nested]
            damaged = {"slots": nested, "head": nested}  # a buffer's slots, a metadata record's head
            self.backend.client.put((key.namespace, key.set_name, key.user_key), damaged)  # type: ignore[attr-defined]

    def new_queue(self, **options: object) -> Queue:
        """A new queue with a unique name, deleted after the test."""
        name = unique_name("t")
        self.created.append(name)
        if self.remote:
            Queue.delete(self.backend, name)  # left by an earlier run that died
        options.setdefault("capacity", 12)
        options.setdefault("slots_per_record", 3)
        return Queue.create(self.backend, name, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def aerospike_address() -> Iterator[str]:
    """host:port of an Aerospike server, or skip."""
    configured = os.environ.get(AEROSPIKE_ENVIRONMENT_VARIABLE)
    if configured:
        yield configured
        return
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:
        pytest.skip(
            f"no Aerospike server: set {AEROSPIKE_ENVIRONMENT_VARIABLE}=host:port or make a Docker"
            f" engine reachable ({type(exc).__name__})"
        )
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    config = Path(__file__).resolve().parent.parent / "docker" / "aerospike.conf"  # namespaces test and bar
    container = (
        DockerContainer(AEROSPIKE_IMAGE)
        .with_exposed_ports(3000)
        .with_volume_mapping(str(config), "/etc/aerospike/aerospike.conf", "ro")
        .with_command("--config-file /etc/aerospike/aerospike.conf")
    )
    container.start()
    try:
        wait_for_logs(container, "service ready", timeout=120)
        yield f"{container.get_container_host_ip()}:{container.get_exposed_port(3000)}"
    finally:
        container.stop()


@pytest.fixture(params=["embedded", "aerospike"])
def store(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Store]:
    """Each test that uses it runs once per backend."""
    if request.param == "embedded":
        clock = ManualClock()
        backend: Backend = EmbeddedBackend(
            os.path.join(str(tmp_path), "store.db"),
            namespaces=("test", SECOND_NAMESPACE),
            clock=clock,
            record_size_limit=TEST_RECORD_SIZE_LIMIT,
        )
        result = Store("embedded", backend, clock.advance, clock=clock)
    else:
        address = request.getfixturevalue("aerospike_address")
        backend = connect(f"aerospike://{address}/test")
        result = Store("aerospike", backend, time.sleep, remote=True)
    yield result
    for name in result.created:
        Queue.delete(backend, name)
    backend.close()


@contextlib.contextmanager
def meanwhile(delay: float, action: Callable[..., object], *args: object) -> Iterator[None]:
    """Runs ``action(*args)`` on a timer thread ``delay`` seconds in; waits for it on the way out."""
    timer = threading.Timer(delay, action, args)
    timer.start()
    try:
        yield
    finally:
        timer.join()


class AfterFirstRead(Delegating):
    """A store that runs ``meanwhile`` right after its first ``get`` returns (the caller is paused there)."""

    def __init__(self, inner: Backend, meanwhile: Any) -> None:
        super().__init__(inner)
        self.meanwhile = meanwhile

    def relay(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = super().relay(method, *args, **kwargs)
        if method == "get" and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        return result


@dataclass
class Place:
    """A store every process can open by URL, and the queues a test made there."""

    kind: str
    url: str
    names: list[str] = field(default_factory=list)

    def name(self, base: str) -> str:
        """A unique queue name, free now and deleted (with its queue) after the test."""
        name = unique_name(base)
        self.names.append(name)
        if self.kind != "embedded":  # a new file each test: nothing is left there
            backend = self.connect()
            try:
                Queue.delete(backend, name)  # left by an earlier run that died
            finally:
                backend.close()
        return name

    def connect(self) -> Backend:
        """A new connection to the store."""
        return connect(self.url)


@pytest.fixture(params=["embedded", "aerospike"])
def place(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Place]:
    """A store URL for tests that run other processes, once per backend."""
    if request.param == "embedded":
        url = f"embedded://{tmp_path}/store.db?namespaces=test,{SECOND_NAMESPACE}&record_size_limit={TEST_RECORD_SIZE_LIMIT}"
    else:
        url = f"aerospike://{request.getfixturevalue('aerospike_address')}/test"
    result = Place(request.param, url)
    yield result
    backend = result.connect()
    for name in result.names:
        Queue.delete(backend, name)
    backend.close()
