"""The Aerospike store, through the official ``aerospike`` Python client.

Every interface call is one client command: ``get``, ``put``, ``operate``,
``remove`` or ``batch_read``. Conditions compile to filter expressions
(``aerospike_helpers.expressions``), so "time since last update" is judged on
the server's clock. Writes are sent with ``max_retries=0``: a timed-out write
may have been applied (``in_doubt``), and only the caller can decide whether
repeating it is safe. Client exceptions are mapped to the library's error tree
in one place, :func:`mapped_errors`.

The ``aerospike`` package is imported here only, so the rest of the library
(and the embedded store) works where it is not installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from large_queue import errors
from large_queue.backends import conditions as c
from large_queue.backends._base import (
    Backend,
    Increment,
    ListGetRange,
    ListSet,
    Operation,
    Read,
    ReadSinceUpdate,
    Record,
    RecordKey,
    Write,
    WriteMode,
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
    value = getattr(exc, name, None)
    if value is None and len(exc.args) > position:
        value = exc.args[position]
    return value


def translate(exc: BaseException) -> errors.BackendError:
    """The library error for an ``aerospike.exception`` instance."""
    from aerospike import exception as aerospike_exception

    code = _attribute(exc, "code", 0)
    message = _attribute(exc, "msg", 1) or str(exc)
    in_doubt = bool(_attribute(exc, "in_doubt", 4))
    cls = _ERROR_BY_CODE.get(code) if isinstance(code, int) else None
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


@contextlib.contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raise client exceptions as library errors, ``from`` the original."""
    from aerospike import exception as aerospike_exception

    try:
        yield
    except aerospike_exception.AerospikeError as exc:
        raise translate(exc) from exc


def compile_condition(condition: c.Condition) -> Any:
    """Compile a condition tree to an Aerospike filter expression."""
    return _expression(condition).compile()


def _expression(node: Any) -> Any:
    from aerospike_helpers import expressions as exp

    if isinstance(node, c.Compare):
        builder = {"==": exp.Eq, "!=": exp.NE, "<": exp.LT, "<=": exp.LE, ">": exp.GT, ">=": exp.GE}
        return builder[node.op](_expression(node.left), _expression(node.right))
    if isinstance(node, c.And):
        return exp.And(*(_expression(p) for p in node.parts))
    if isinstance(node, c.Or):
        return exp.Or(*(_expression(p) for p in node.parts))
    if isinstance(node, c.Not):
        return exp.Not(_expression(node.part))
    if isinstance(node, c.BinExists):
        return exp.BinExists(node.name)
    if isinstance(node, c.IntBin):
        return exp.IntBin(node.name)
    if isinstance(node, c.StrBin):
        return exp.StrBin(node.name)
    if isinstance(node, c.SinceUpdateMs):
        return exp.SinceUpdateTime()
    if isinstance(node, (int, str)):
        return node
    raise TypeError(f"not a condition node: {node!r}")


def _operation(op: Operation) -> dict[str, Any]:
    from aerospike_helpers import expressions as exp
    from aerospike_helpers.operations import expression_operations, list_operations, operations

    built: dict[str, Any]
    if isinstance(op, Read):
        built = operations.read(op.bin)
    elif isinstance(op, Write):
        built = operations.write(op.bin, op.value)
    elif isinstance(op, Increment):
        built = operations.increment(op.bin, op.by)
    elif isinstance(op, ListSet):
        built = list_operations.list_set(op.bin, op.index, op.value)
    elif isinstance(op, ListGetRange):
        built = list_operations.list_get_range(op.bin, op.index, op.count)
    elif isinstance(op, ReadSinceUpdate):
        built = expression_operations.expression_read(op.bin, exp.SinceUpdateTime().compile())
    else:
        raise TypeError(f"unknown operation {op!r}")
    return built


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
        import aerospike

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
        import aerospike

        self._aerospike = aerospike
        if not client.is_connected():
            with mapped_errors():
                client.connect()
        self.client = client
        self.default_namespace = namespace
        self._owns_client = owns_client
        key_send = aerospike.POLICY_KEY_SEND
        self._read_policy = {"total_timeout": total_timeout_ms, "max_retries": 2}
        self._write_policy = {"total_timeout": total_timeout_ms, "max_retries": 0, "key": key_send}

    @classmethod
    def connect(cls, settings: AerospikeSettings) -> AerospikeBackend:
        """Open a new client for ``settings``."""
        import aerospike

        with mapped_errors():
            client = aerospike.client(settings.client_config())
            if not client.is_connected():
                client.connect()
        return cls(
            client, namespace=settings.namespace, owns_client=True, total_timeout_ms=settings.total_timeout_ms
        )

    def __repr__(self) -> str:
        return f"AerospikeBackend(namespace={self.default_namespace!r})"

    @staticmethod
    def _key(key: RecordKey) -> tuple[str, str, str]:
        return (key.namespace, key.set_name, key.user_key)

    def get(self, key: RecordKey) -> Record | None:
        """Read a whole record, or None if it does not exist."""
        self._count()
        try:
            with mapped_errors():
                _, meta, bins = self.client.get(self._key(key), policy=self._read_policy)
        except errors.RecordNotFoundError:
            return None
        return Record(dict(bins or {}), int(meta["gen"]))

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
        aerospike = self._aerospike
        exists = {
            WriteMode.UPSERT: aerospike.POLICY_EXISTS_IGNORE,
            WriteMode.CREATE_ONLY: aerospike.POLICY_EXISTS_CREATE,
            WriteMode.UPDATE_ONLY: aerospike.POLICY_EXISTS_UPDATE,
            WriteMode.REPLACE: aerospike.POLICY_EXISTS_REPLACE,
        }[mode]
        policy = dict(self._write_policy, exists=exists)
        meta: dict[str, int] = {"ttl": aerospike.TTL_NEVER_EXPIRE if ttl is None else ttl}
        if generation is not None:
            policy["gen"] = aerospike.POLICY_GEN_EQ
            meta["gen"] = generation
        self._count()
        with mapped_errors():
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
        aerospike = self._aerospike
        policy = dict(self._write_policy, exists=aerospike.POLICY_EXISTS_UPDATE)
        meta: dict[str, int] = {"ttl": aerospike.TTL_DONT_UPDATE}
        if condition is not None:
            policy["expressions"] = compile_condition(condition)
        if generation is not None:
            policy["gen"] = aerospike.POLICY_GEN_EQ
            meta["gen"] = generation
        self._count()
        with mapped_errors():
            _, _, bins = self.client.operate(
                self._key(key), [_operation(op) for op in operations], meta=meta, policy=policy
            )
        return dict(bins or {})

    def remove(self, key: RecordKey) -> bool:
        """Delete a record; False if it did not exist."""
        self._count()
        try:
            with mapped_errors():
                self.client.remove(self._key(key), policy=self._write_policy)
        except errors.RecordNotFoundError:
            return False
        return True

    def batch_get(self, keys: Sequence[RecordKey]) -> list[Record | None]:
        """Read many records in one command; None where a record is missing."""
        self._count()
        with mapped_errors():
            batch = self.client.batch_read([self._key(k) for k in keys])
        records: list[Record | None] = []
        for item in batch.batch_records:
            if item.result == 0 and item.record is not None:
                _, meta, bins = item.record
                records.append(Record(dict(bins or {}), int(meta["gen"])))
            elif item.result == 2:
                records.append(None)
            else:
                cls = _ERROR_BY_CODE.get(item.result, errors.BackendError)
                raise cls(
                    f"batch read of {item.key} failed with code {item.result}",
                    code=item.result,
                    in_doubt=False,
                )
        return records

    def close(self) -> None:
        """Close the client if this backend opened it."""
        if self._owns_client:
            self.client.close()
