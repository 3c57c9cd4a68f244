"""The Aerospike store, through the official ``aerospike`` Python client.

Every interface call is one client command: ``get``, ``put``, ``operate``,
``remove`` or ``batch_read``. Conditions compile to filter expressions
(``aerospike_helpers.expressions``, built in :mod:`._aerospike_compile`), so
"time since last update" is judged on the server's clock. Writes are sent
with ``max_retries=0``: a timed-out write may have been applied
(``in_doubt``), and only the caller can decide whether repeating it is safe.
Client exceptions are mapped to the library's error tree in one place,
:func:`mapped_errors`.

The ``aerospike`` package is imported here and in :mod:`._aerospike_compile`
only, so the rest of the library (and the embedded store) works where it is
not installed.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aerospike
from aerospike import exception as aerospike_exception
from aerospike_helpers import expressions as exp
from aerospike_helpers.batch import records as batch_records

from large_queue import errors
from large_queue.backends import conditions as c
from large_queue.backends._aerospike_compile import client_operations, compile_condition
from large_queue.backends._base import (
    MISUSE,
    READ_OPERATIONS,
    Backend,
    Operation,
    ReadBeside,
    Record,
    RecordCommand,
    RecordKey,
    WriteMode,
    check_bin_names,
    check_bin_values,
    check_commands,
    check_reads,
    check_ttl,
    misuse,
)

# Aerospike result code -> error class. Codes not listed fall back by category.
_ERROR_BY_CODE: dict[int, type[errors.BackendError]] = {
    2: errors.RecordNotFoundError,
    3: errors.GenerationMismatchError,
    4: errors.BackendUsageError,
    5: errors.RecordExistsError,
    7: errors.BackendUnavailableError,
    8: errors.BackendBusyError,
    9: errors.BackendTimeoutError,
    11: errors.BackendUnavailableError,
    12: errors.BinTypeError,
    13: errors.RecordTooLargeError,
    14: errors.BackendBusyError,
    18: errors.BackendBusyError,
    20: errors.NamespaceNotFoundError,
    21: errors.BinNameError,
    26: errors.BinTypeError,
    27: errors.ConditionNotMetError,
    -2: errors.BackendUsageError,
    -8: errors.BackendUnavailableError,
    -10: errors.BackendUnavailableError,
    -14: errors.BackendBusyError,
}


def _attribute(exc: BaseException, name: str, position: int) -> Any:
    """A detail of a client exception: from its own ``args`` (code, msg, file, line, in_doubt).

    Not from its attributes first: the client sets ``code``, ``msg`` and
    ``in_doubt`` on the exception *class* when it raises, so another error
    raised meanwhile (in another thread, say) shows through them.
    """
    if len(exc.args) > position:
        return exc.args[position]
    return getattr(exc, name, None)


def translate(exc: BaseException) -> errors.BackendError:
    """The library error for an ``aerospike.exception`` instance."""
    code = _attribute(exc, "code", 0)
    message = _attribute(exc, "msg", 1) or str(exc)
    in_doubt = bool(_attribute(exc, "in_doubt", 4))
    cls = _ERROR_BY_CODE.get(code) if isinstance(code, int) else None
    lowered = str(message).lower()
    if "deserialize" in lowered:  # the client could not decode what a record holds
        cls = errors.CorruptRecordError
    elif "serialize" in lowered:  # a value no bin holds (a client error, -1, not the server's absence)
        cls = errors.BackendUsageError
    if cls is None:
        if isinstance(exc, aerospike_exception.TimeoutError):
            cls = errors.BackendTimeoutError
        elif isinstance(exc, aerospike_exception.ParamError):
            cls = errors.BackendUsageError
        elif isinstance(exc, aerospike_exception.ClientError):
            cls = errors.BackendUnavailableError
        else:
            cls = errors.BackendError
    return cls(f"aerospike error {code}: {message}", code=code, in_doubt=in_doubt)


class _MappedErrors:
    """Re-raise client exceptions as library errors, ``from`` the original."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, aerospike_exception.AerospikeError):
            raise translate(exc) from exc


log = logging.getLogger("large_queue")

#: ``with mapped_errors: ...`` turns client exceptions into library errors
mapped_errors = _MappedErrors()

#: how long closing a client waits for the calls under way (each is bounded by its own timeout)
_CLOSE_WAIT = 60.0


class _ClientCalls(_MappedErrors):
    """A backend's calls into its client: mapped as :data:`mapped_errors`, and counted while under way.

    The client ends the process (a segmentation fault) when it is closed
    while another thread is inside one of its calls::

        t=0    threads A and B send commands through one backend.
        t=0.1  the application's shutdown calls backend.close().
        t=0.1  close() marks the backend closed: from now on a call raises
               BackendUnavailableError at once, without touching the client.
        t=0.1+ close() waits for A's and B's commands to return (each is
               bounded by its timeout), then closes the client.

    An interrupt (Ctrl-C) that lands inside a call may leave it counted
    for good. Calls are counted for their thread, and ``close`` waits only
    for those of other threads still alive: one left counted in the thread
    that closes, or in a thread that has ended, is not waited for.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._under_way: dict[int, int] = {}  # thread ident -> calls under way in it
        self._closed = False

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._lock:
            if self._closed:
                raise errors.BackendUnavailableError(
                    "this Aerospike store was closed: connect again for a new one", code=-1
                )
            self._under_way[me] = self._under_way.get(me, 0) + 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        me = threading.get_ident()
        with self._lock:
            left = self._under_way.get(me, 0) - 1
            if left > 0:
                self._under_way[me] = left
            else:
                self._under_way.pop(me, None)
        if isinstance(exc, aerospike_exception.AerospikeError):  # as _MappedErrors, without its call
            raise translate(exc) from exc

    def close(self, client: Any) -> None:
        """Refuse new calls, wait for those under way (up to a minute: logged past it), close ``client``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + _CLOSE_WAIT
        while (others := self._others_under_way()) and time.monotonic() < deadline:
            time.sleep(0.001)
        if others:
            log.warning("closing the Aerospike client with %d calls still under way", others)
        client.close()

    def _others_under_way(self) -> int:
        """The calls under way in other threads that are still alive (this one is here, not in one)."""
        me = threading.get_ident()
        alive = {thread.ident for thread in threading.enumerate()}
        with self._lock:
            return sum(n for thread, n in self._under_way.items() if thread != me and thread in alive)


#: what a namespace holds when its ``max-record-size`` is 0 (the server's default)
DEFAULT_MAX_RECORD_SIZE = 1024 * 1024


def _record_limit(info: str) -> int | None:
    """``max-record-size`` from a ``namespace/<ns>`` info answer; None if the namespace is unknown."""
    settings = dict(item.partition("=")[::2] for item in info.strip().split(";") if "=" in item)
    if "max-record-size" in settings:
        return int(settings["max-record-size"]) or DEFAULT_MAX_RECORD_SIZE
    if "write-block-size" in settings:  # servers before 7.0
        return int(settings["write-block-size"])
    return None


#: a command's result when the client's timeout passed
_TIMEOUT = 9
#: a batch record's result when no answer came for it: its part of the batch timed out, or its
#: connection broke. ``batch_write`` then returns (the batch's own result says why) instead of raising.
NO_ANSWER = -15


def batch_write_failure(result: int, in_doubt: bool, key: RecordKey) -> errors.BackendError:
    """The error for a write sent in a batch command whose record answered ``result`` (not 0).

    The timeline of a write with no answer, as measured on a server paused
    for longer than the client's timeout:

    - t=0     the batch is sent; the server holds it unread.
    - t=200ms the client's timeout passes; ``batch_write`` returns, the
      write's result -15 (no answer) and ``in_doubt`` set.
    - t=300ms the server runs again and applies the write.

    So no answer is a timeout in doubt, which callers resolve (a lock's
    acquire reads whether it took the lock); it must not be a plain error.
    """
    if result == NO_ANSWER:
        return errors.BackendTimeoutError(
            f"aerospike error {result} on {key}: no answer came for the write; it may have been applied",
            code=result,
            in_doubt=True,
        )
    cls = _ERROR_BY_CODE.get(result, errors.BackendError)
    in_doubt = in_doubt or cls is errors.BackendTimeoutError
    return cls(f"aerospike error {result} on {key}", code=result, in_doubt=in_doubt)


#: a batch command's own result when some of its records failed (each says why): not the batch's failure
_SOME_RECORDS_FAILED = -16


#: a batch command's result when the client failed on its answer (a record it could not decode,
#: read beside a write): its records answered, each for itself
_CLIENT_ERROR = -1


def _refused(batch: Any, what: str) -> errors.BackendError | None:
    """The error for a batch command that failed as a whole (None if it did not).

    The client refuses a batch it cannot send (a write command holding only
    reads, say) with a result of its own, and says -15 (no answer) for each
    record: nothing was sent, and nothing is in doubt. A batch that failed
    as a whole with results for its records that nothing backs (a node the
    client dropped while the server was unresponsive answers 1, and 0 for
    each record, with no generation: nothing was written) cannot be told
    apart from one the server applied: each write is in doubt, as if no
    answer had come.
    """
    if batch.result in (0, _SOME_RECORDS_FAILED, _TIMEOUT, NO_ANSWER):
        return None
    answered = any(record.result != NO_ANSWER for record in batch.batch_records)
    if batch.result == _CLIENT_ERROR and answered:
        return None  # sent: a record it could not decode (a damaged one read beside) says so itself
    if not answered:
        cls = _ERROR_BY_CODE.get(batch.result, errors.BackendError)
        return cls(f"aerospike refused the {what} before sending it (code {batch.result})", code=batch.result)
    return errors.BackendTimeoutError(
        f"aerospike failed the {what} as a whole (code {batch.result}): no answer of its records can be"
        " trusted; its writes may have been applied",
        code=batch.result,
        in_doubt=True,
    )


def _batch_results(
    batch: Any, expected: int, some_bins: Sequence[bool] | None = None
) -> list[tuple[dict[str, Any], dict[str, Any]] | None]:
    """(meta, bins) of each of the ``expected`` records of a batch answer, None where one is missing.

    ``some_bins[i]``: record ``i`` was read with operations, so it may
    rightly answer with no bins (none of those it asked for exists).

    A record the client cannot decode comes back "found" with no bins (every
    stored record has one), and the records after it with code -15: either
    raises ``CorruptRecordError``, so that the caller can read one by one to
    name the damaged record. A batch that timed out (a server paused past the
    client's timeout, say) also answers -15 for its records, and is a
    ``BackendTimeoutError``: nothing in it is damaged.
    """
    if batch.result in (_TIMEOUT, NO_ANSWER):  # no answer in time: its records say -15, nothing is damaged
        raise errors.BackendTimeoutError(
            f"batch read of {len(batch.batch_records)} records timed out", code=batch.result, in_doubt=False
        )
    if batch.result not in (0, _SOME_RECORDS_FAILED, _CLIENT_ERROR) or len(batch.batch_records) != expected:
        # failed as a whole (a node the client dropped answers 1 and no records): none can be trusted
        cls = _ERROR_BY_CODE.get(batch.result, errors.BackendUnavailableError)
        raise cls(
            f"batch read of {expected} records failed as a whole (code {batch.result},"
            f" {len(batch.batch_records)} records answered)",
            code=batch.result,
        )
    results: list[tuple[dict[str, Any], dict[str, Any]] | None] = []
    for index, item in enumerate(batch.batch_records):
        if item.result == 0 and item.record is not None and item.record[2]:
            results.append((item.record[1], item.record[2]))
        elif item.result == 0 and item.record is not None and some_bins is not None and some_bins[index]:
            results.append((item.record[1], {}))
        elif item.result == 2:
            results.append(None)
        elif item.result in (0, -15):
            raise errors.CorruptRecordError(
                f"a record of a batch read could not be decoded (at {item.key[:3]}, code {item.result})",
                code=item.result,
                in_doubt=False,
            )
        else:
            cls = _ERROR_BY_CODE.get(item.result, errors.BackendError)
            raise cls(f"batch read of {item.key[:3]} failed with code {item.result}", code=item.result)
    return results


@dataclass(frozen=True, kw_only=True)
class AerospikeSettings:
    """How to reach an Aerospike cluster.

    ``hosts`` are (address, port) pairs; ``tls`` is passed as the client's
    ``tls`` configuration (e.g. ``{"enable": True, "cafile": ...}``) and
    ``tls_name`` is added to each host; ``user``/``password`` enable
    authentication. Timeouts are in milliseconds.
    """

    hosts: tuple[tuple[str, int], ...]
    namespace: str = "test"
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: dict[str, Any] | None = None
    tls_name: str | None = None
    total_timeout_ms: int = 1000
    connect_timeout_ms: int = 2000

    def client_config(self) -> dict[str, Any]:
        """The configuration dictionary for ``aerospike.client``."""
        hosts: list[tuple[Any, ...]] = [
            (host, port, self.tls_name) if self.tls_name else (host, port) for host, port in self.hosts
        ]
        config: dict[str, Any] = {
            "hosts": hosts,
            "send_bool_as": aerospike.AS_BOOL,
            "timeout": self.connect_timeout_ms,
            "policies": {"total_timeout": self.total_timeout_ms},
        }
        if self.tls:
            config["tls"] = dict(self.tls)
        if self.user is not None:
            config["user"] = self.user
            config["password"] = self.password or ""
        return config


class AerospikeBackend(Backend):
    """The interface on an Aerospike cluster.

    Build it from :class:`AerospikeSettings` (``AerospikeBackend.connect``)
    or wrap a client you already have (``AerospikeBackend(client)``); a
    wrapped client is not closed by :meth:`close`.
    """

    def __init__(
        self, client: Any, *, namespace: str = "test", owns_client: bool = False, total_timeout_ms: int = 1000
    ) -> None:
        super().__init__()
        if not client.is_connected():
            with mapped_errors:
                client.connect()
        self.client = client
        self.default_namespace = namespace
        self._owns_client = owns_client
        self._calls = _ClientCalls()
        # Reads may be retried by the client; writes never are (a timed-out
        # write may have been applied: only the caller can tell if repeating it is safe).
        self._read_policy: dict[str, Any] = {"total_timeout": total_timeout_ms, "max_retries": 2}
        self._write_policy: dict[str, Any] = {
            "total_timeout": total_timeout_ms,
            "max_retries": 0,
            "key": aerospike.POLICY_KEY_SEND,
        }
        self._put_policies = {
            mode: dict(self._write_policy, exists=exists)
            for mode, exists in {
                WriteMode.UPSERT: aerospike.POLICY_EXISTS_IGNORE,
                WriteMode.CREATE_ONLY: aerospike.POLICY_EXISTS_CREATE,
                WriteMode.UPDATE_ONLY: aerospike.POLICY_EXISTS_UPDATE,
                WriteMode.REPLACE: aerospike.POLICY_EXISTS_REPLACE,
            }.items()
        }
        keep_ttl = aerospike.TTL_DONT_UPDATE
        self._operate_policy = dict(self._write_policy, exists=aerospike.POLICY_EXISTS_UPDATE, ttl=keep_ttl)
        self._operate_read_policy = dict(self._read_policy, exists=aerospike.POLICY_EXISTS_UPDATE)
        # a write and a read in one batch command (operate_and_read): the command as a write is
        # never retried; the write's own policy as operate's, in a batch write policy's terms
        self._beside_policy: dict[str, Any] = {"total_timeout": total_timeout_ms, "max_retries": 0}
        self._beside_write_policy: dict[str, Any] = {
            "key": aerospike.POLICY_KEY_SEND,
            "exists": aerospike.POLICY_EXISTS_UPDATE,
            "ttl": keep_ttl,
        }
        self._record_limits: dict[str, int] = {}

    @classmethod
    def connect(cls, settings: AerospikeSettings) -> AerospikeBackend:
        """Open a new client for ``settings``."""
        try:
            with mapped_errors:
                client = aerospike.client(settings.client_config())
                if not client.is_connected():
                    client.connect()
        except errors.BackendUnavailableError as exc:  # say where it tried: the client does not
            hosts = ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in settings.hosts)
            exc.args = (f"{exc} (hosts {hosts})", *exc.args[1:])
            raise
        return cls(
            client, namespace=settings.namespace, owns_client=True, total_timeout_ms=settings.total_timeout_ms
        )

    def __repr__(self) -> str:
        return f"AerospikeBackend(namespace={self.default_namespace!r})"

    @staticmethod
    def _key(key: RecordKey) -> tuple[str, str, str]:
        return (key.namespace, key.set_name, key.user_key)

    def get(self, key: RecordKey, bins: Sequence[str] | None = None) -> Record | None:
        """Read a record (only ``bins`` where given: no others are sent), or None if it does not exist."""
        self._count()
        try:
            with self._calls:
                if bins is None:
                    _, meta, found = self.client.get(self._key(key), policy=self._read_policy)
                else:
                    _, meta, found = self.client.select(self._key(key), list(bins), policy=self._read_policy)
        except errors.RecordNotFoundError:
            return None
        return Record(dict(found or {}), int(meta["gen"]))

    def put(
        self,
        key: RecordKey,
        bins: dict[str, Any],
        *,
        mode: WriteMode = WriteMode.UPSERT,
        generation: int | None = None,
        ttl: int | None = None,
    ) -> None:
        """Write bins; ``mode`` and ``generation`` guard the write."""
        ttl = check_ttl(ttl)
        policy = dict(self._put_policies[mode], ttl=aerospike.TTL_NEVER_EXPIRE if ttl is None else ttl)
        meta: dict[str, int] | None = None
        if generation is not None:
            policy["gen"] = aerospike.POLICY_GEN_EQ
            meta = {"gen": generation}
        check_bin_names(bins)  # the client's own refusal of a name that is not a str reads "unavailable"
        check_bin_values(key, bins)  # as the embedded store refuses them (the client keeps some changed)
        self._count()
        with self._calls:
            self.client.put(self._key(key), bins, meta=meta, policy=policy)

    def operate(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        *,
        condition: c.Condition | None = None,
        generation: int | None = None,
    ) -> dict[str, Any]:
        """Apply operations atomically to an existing record; return the reads."""
        try:
            arguments = self._operate_arguments(key, operations, condition, generation)
        except MISUSE as exc:
            raise misuse(key, exc) from None
        self._count()
        try:
            with self._calls:
                _, _, bins = self.client.operate(*arguments)
        except (errors.BackendUsageError, errors.BackendUnavailableError):
            check_bin_names(op.bin for op in operations)  # named as the embedded store names it
            raise
        return bins or {}

    def operation(
        self, key: RecordKey, operations: Sequence[Operation], *, condition: c.Condition | None = None
    ) -> Callable[[], dict[str, Any]]:
        """``operate`` with its client arguments built once (see :meth:`Backend.operation`)."""
        arguments = self._operate_arguments(key, operations, condition, None)
        client_operate = self.client.operate

        def send() -> dict[str, Any]:
            self._count()
            with self._calls:
                _, _, bins = client_operate(*arguments)
            return bins or {}

        return send

    def _operate_command(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        condition: c.Condition | None,
        generation: int | None,
    ) -> Callable[[], tuple[Any, Any, dict[str, Any] | None]]:
        return functools.partial(
            self.client.operate, *self._operate_arguments(key, operations, condition, generation)
        )

    def _operate_arguments(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        condition: c.Condition | None,
        generation: int | None,
    ) -> tuple[tuple[str, str, str], list[dict[str, Any]], dict[str, int] | None, dict[str, Any]]:
        """The client's ``operate`` arguments: key, operations, meta and policy."""
        reads_only = True
        for op in operations:
            if type(op) not in READ_OPERATIONS:
                reads_only = False
                break
        policy = self._operate_read_policy if reads_only else self._operate_policy
        meta: dict[str, int] | None = None
        if condition is not None or generation is not None:
            policy = dict(policy)
            if condition is not None:
                policy["expressions"] = compile_condition(condition)
            if generation is not None:
                policy["gen"] = aerospike.POLICY_GEN_EQ
                meta = {"gen": generation}
        return (key.namespace, key.set_name, key.user_key), client_operations(operations), meta, policy

    def prepare(self, method: str, *args: Any, **kwargs: Any) -> Callable[[], object]:
        """The client call for ``operate`` or ``batch_get`` with its arguments built ahead."""
        if method == "operate":
            (key, operations) = args
            return self._operate_command(key, operations, kwargs.get("condition"), kwargs.get("generation"))
        if method == "batch_get":
            (keys,) = args
            return functools.partial(self.client.batch_read, [self._key(k) for k in keys])
        if method == "batch_read":
            (reads,) = args
            return self._batch_read_command(reads)
        if method == "operate_each":
            (commands,) = args
            return self._operate_each_command(commands)
        if method == "operate_and_read":
            (key, operations, read) = args
            return self._operate_and_read_command(key, operations, read, kwargs.get("condition"))
        return super().prepare(method, *args, **kwargs)

    #: operate_and_read is one batch command: one round trip
    reads_beside = True

    def operate_and_read(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        read: ReadBeside,
        *,
        condition: c.Condition | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``operate`` and a read of another record in one batch command (:meth:`Backend.operate_and_read`).

        A command that times out is in doubt as a whole: its write may have been applied.
        """
        command = self._operate_and_read_command(key, operations, read, condition)
        self._count()
        try:
            with self._calls:
                batch = command()
        except errors.BackendTimeoutError as exc:
            raise errors.BackendTimeoutError(str(exc), code=exc.code, in_doubt=True) from exc
        refused = _refused(batch, f"command on {key}")
        if refused is not None:
            raise refused
        written, beside = batch.batch_records
        if written.result != 0:
            raise batch_write_failure(written.result, bool(written.in_doubt), key)
        bins = written.record[2] if written.record is not None else None
        seen = beside.record[2] if beside.result == 0 and beside.record is not None else None
        return bins or {}, seen or None

    def _operate_and_read_command(
        self,
        key: RecordKey,
        operations: Sequence[Operation],
        read: ReadBeside,
        condition: c.Condition | None,
    ) -> Callable[[], Any]:
        read_key, read_operations, read_condition = read
        check_commands([(key, operations), (read_key, read_operations)])
        check_reads([(read_key, read_operations)])
        written = self._batch_write(key, operations, condition)
        try:
            read_policy = (
                None if read_condition is None else {"expressions": compile_condition(read_condition)}
            )
            beside = batch_records.Read(
                self._key(read_key), client_operations(read_operations), policy=read_policy
            )
        except MISUSE as exc:
            raise misuse(read_key, exc) from None
        requests = batch_records.BatchRecords([written, beside])
        return functools.partial(self.client.batch_write, requests, self._beside_policy)

    #: operate_each is one batch command: one round trip for all its records
    operates_together = True

    def operate_each(self, commands: Sequence[RecordCommand]) -> list[dict[str, Any] | errors.BackendError]:
        """``operate`` on several records in one batch command (:meth:`Backend.operate_each`).

        A batch that gets no answer in time leaves every record's write in doubt.
        """
        command = self._operate_each_command(commands)
        self._count()
        try:
            with self._calls:
                batch = command()
        except errors.BackendTimeoutError as exc:
            failure = errors.BackendTimeoutError(str(exc), code=exc.code, in_doubt=True)
            return [failure for _ in commands]
        refused = _refused(batch, f"batch command on {len(commands)} records")
        if refused is not None:
            if refused.in_doubt:  # each write as if it got no answer: the caller settles each
                return [refused for _ in commands]
            raise refused
        outcomes: list[dict[str, Any] | errors.BackendError] = []
        for (key, _, _), written in zip(commands, batch.batch_records, strict=True):
            if written.result != 0:
                outcomes.append(batch_write_failure(written.result, bool(written.in_doubt), key))
            else:
                outcomes.append((written.record[2] if written.record is not None else None) or {})
        return outcomes

    def _operate_each_command(self, commands: Sequence[RecordCommand]) -> Callable[[], Any]:
        check_commands((key, operations) for key, operations, _ in commands)
        requests = batch_records.BatchRecords(
            [self._batch_write(key, operations, condition) for key, operations, condition in commands]
        )
        return functools.partial(self.client.batch_write, requests, self._beside_policy)

    def _batch_write(
        self, key: RecordKey, operations: Sequence[Operation], condition: c.Condition | None
    ) -> Any:
        """One record's command in a batch command, with ``operate``'s policy in a batch write's terms.

        A command that only reads goes as a batch read: the client refuses a
        batch write that writes nothing. ``BackendUsageError`` for a
        malformed command, before anything is sent.
        """
        try:
            if all(isinstance(operation, READ_OPERATIONS) for operation in operations):
                read_policy = None if condition is None else {"expressions": compile_condition(condition)}
                return batch_records.Read(self._key(key), client_operations(operations), policy=read_policy)
            policy = self._beside_write_policy
            if condition is not None:
                policy = dict(policy, expressions=compile_condition(condition))
            return batch_records.Write(self._key(key), client_operations(operations), policy=policy)
        except MISUSE as exc:
            raise misuse(key, exc) from None

    def remove(self, key: RecordKey) -> bool:
        """Delete a record; False if it did not exist."""
        self._count()
        try:
            with self._calls:
                self.client.remove(self._key(key), policy=self._write_policy)
        except errors.RecordNotFoundError:
            return False
        return True

    def batch_get(self, keys: Sequence[RecordKey]) -> list[Record | None]:
        """Read many records in one command; None where a record is missing."""
        self._count()
        with self._calls:
            batch = self.client.batch_read([self._key(k) for k in keys])
        records: list[Record | None] = []
        for found in _batch_results(batch, len(keys)):
            records.append(None if found is None else Record(dict(found[1]), int(found[0]["gen"])))
        return records

    def batch_read(
        self, reads: Sequence[tuple[RecordKey, Sequence[Operation] | None]]
    ) -> list[dict[str, Any] | None]:
        """Read from many records in one command: each record's read operations, or all its bins."""
        command = self._batch_read_command(reads)
        self._count()
        with self._calls:
            batch = command()
        results: list[dict[str, Any] | None] = []
        for found in _batch_results(batch, len(reads), [operations is not None for _, operations in reads]):
            results.append(None if found is None else found[1])
        return results

    def _batch_read_command(
        self, reads: Sequence[tuple[RecordKey, Sequence[Operation] | None]]
    ) -> Callable[[], Any]:
        check_reads(reads)
        requests: list[Any] = []
        for key, operations in reads:
            if operations is None:
                requests.append(batch_records.Read(self._key(key), ops=None, read_all_bins=True))
                continue
            try:
                requests.append(batch_records.Read(self._key(key), ops=client_operations(operations)))
            except MISUSE as exc:
                raise misuse(key, exc) from None
        return functools.partial(self.client.batch_write, batch_records.BatchRecords(requests))

    def sets_holding(self, namespace: str, user_key: str) -> list[str]:
        """The sets of ``namespace`` that hold a record with key ``user_key`` (stored keys), sorted."""
        self._count()
        found: set[str] = set()
        policy = {"expressions": exp.Eq(exp.KeyStr(), user_key).compile()}
        with self._calls:
            query = self.client.query(namespace, None)
            query.select()  # keys only: no bins
            query.foreach(lambda record: found.add(record[0][1]), policy)
        return sorted(found)

    def max_record_bytes(self, namespace: str) -> int:
        """The namespace's ``max-record-size`` (the smallest any node has), read once and kept."""
        if namespace not in self._record_limits:
            with self._calls:
                answers = self.client.info_all(f"namespace/{namespace}", policy=self._read_policy)
            limits = [_record_limit(answer[1]) for answer in answers.values() if answer and answer[0] is None]
            if not limits or any(limit is None for limit in limits):
                raise errors.NamespaceNotFoundError(
                    f"namespace {namespace!r} is not configured on the Aerospike cluster", code=20
                )
            self._record_limits[namespace] = min(limit for limit in limits if limit is not None)
        return self._record_limits[namespace]

    def close(self) -> None:
        """Close the client if this backend opened it, once the calls under way have returned.

        Calls made later raise ``BackendUnavailableError``. A client given to
        the backend (``connect(client)``) is the caller's to close: the backend
        leaves it open, and its calls go on.
        """
        if self._owns_client:
            self._calls.close(self.client)
