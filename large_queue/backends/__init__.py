"""Stores for queues: the record-level interface and how to connect to one.

``connect()`` picks a store from a URL:

- ``aerospike://host:port[,host:port]/namespace`` (port 3000 where none is given) with optional query
  parameters ``user``, ``password``, ``tls_name``, ``cafile``, ``timeout_ms``;
- ``embedded:///path/to/store.db`` with optional ``namespaces`` (comma
  separated), ``record_size_limit`` (bytes), ``synchronous``
  (``normal`` | ``full``) and ``busy_timeout_ms`` (how long a write waits
  for the file while another process writes, 30,000 unless told).

With no URL it reads ``LARGE_QUEUE_URL``, and with nothing set it opens an
embedded store in the per-user data directory. An ``aerospike.Client`` (or an
existing backend) is accepted in place of a URL.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from large_queue import errors
from large_queue.backends._base import (
    Backend,
    Compute,
    Evaluate,
    Increment,
    ListGetRange,
    ListSet,
    ListSetRange,
    LogPut,
    MapGet,
    Operation,
    Read,
    ReadBeside,
    ReadSinceUpdate,
    Record,
    RecordCommand,
    RecordKey,
    Write,
    WriteMode,
)

URL_ENVIRONMENT_VARIABLE = "LARGE_QUEUE_URL"
#: the port of a host given without one in an ``aerospike://`` URL (the server's own default)
DEFAULT_AEROSPIKE_PORT = 3000

__all__ = [
    "URL_ENVIRONMENT_VARIABLE",
    "Backend",
    "Compute",
    "Evaluate",
    "Increment",
    "ListGetRange",
    "ListSet",
    "ListSetRange",
    "LogPut",
    "MapGet",
    "Operation",
    "Read",
    "ReadBeside",
    "ReadSinceUpdate",
    "Record",
    "RecordCommand",
    "RecordKey",
    "Write",
    "WriteMode",
    "connect",
    "default_store_path",
]


def default_store_path() -> str:
    """The embedded store used when nothing else is configured."""
    import platformdirs

    return os.path.join(platformdirs.user_data_dir("large_queue"), "store.db")


def connect(target: Any = None, *, create: bool = True) -> Backend:
    """Open a store from a URL, an ``aerospike.Client`` or ``LARGE_QUEUE_URL``.

    With ``create=False`` an embedded store's file must exist already
    (``StoreFileError`` otherwise): for commands that only read.

    Example::

        store = connect("embedded:///tmp/queues.db")
        store = connect("aerospike://127.0.0.1:3000/test")
    """
    if isinstance(target, Backend):
        return target
    if target is None:
        target = os.environ.get(URL_ENVIRONMENT_VARIABLE) or f"embedded://{default_store_path()}"
    if not isinstance(target, str):
        if type(target).__module__.split(".")[0] == "aerospike":
            from large_queue.backends.aerospike import AerospikeBackend

            return AerospikeBackend(target)
        raise errors.InvalidArgumentError(
            f"connect() takes a URL, an aerospike.Client or a backend, not {type(target).__name__}"
        )
    return _from_url(target, create=create)


def _single(query: dict[str, list[str]], name: str, url: str) -> str | None:
    """The value of parameter ``name``, if given: once, and not blank (else ``InvalidArgumentError``)."""
    values = query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise errors.InvalidArgumentError(f"{name}= is given {len(values)} times in {url!r}: give it once")
    if not values[0].strip():
        raise errors.InvalidArgumentError(f"{name}= in {url!r} is blank: give a value, or leave it out")
    return values[0]


def _integer(query: dict[str, list[str]], name: str, url: str) -> int | None:
    """The positive integer given as ``name``, if it is given (0 or less is refused, not taken as unset)."""
    value = _single(query, name, url)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 18 or int(value) < 1:
        raise errors.InvalidArgumentError(f"{name}={value!r} in {url!r} is not a positive integer")
    return int(value)


def _busy_timeout(query: dict[str, list[str]], url: str) -> float:
    """``busy_timeout_ms`` of an embedded URL in seconds: 0 (fail at once) to a day, 30 s unless told."""
    from large_queue.backends.embedded import DEFAULT_BUSY_TIMEOUT_MS, MAX_BUSY_TIMEOUT

    value = _single(query, "busy_timeout_ms", url)
    if value is None:
        return DEFAULT_BUSY_TIMEOUT_MS / 1000
    if not (value.isascii() and value.isdigit()) or len(value) > 18 or int(value) > MAX_BUSY_TIMEOUT * 1000:
        raise errors.InvalidArgumentError(
            f"busy_timeout_ms={value!r} in {url!r} is not a number of milliseconds from 0 to"
            f" {MAX_BUSY_TIMEOUT * 1000:.0f}"
        )
    return int(value) / 1000


_PARAMETERS = {
    "embedded": ("namespaces", "record_size_limit", "synchronous", "busy_timeout_ms"),
    "aerospike": ("user", "password", "tls_name", "cafile", "timeout_ms"),
}


def _from_url(url: str, *, create: bool) -> Backend:
    parts = urlsplit(url)
    if parts.fragment or url.endswith("#"):
        raise errors.InvalidArgumentError(
            f"{url!r} holds a '#', which would cut the URL there: write it as %23"
        )
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - set(_PARAMETERS.get(parts.scheme, query)))
    if unknown:
        raise errors.InvalidArgumentError(
            f"unknown parameter(s) {', '.join(unknown)} in {url!r}; {parts.scheme} URLs take"
            f" {', '.join(_PARAMETERS[parts.scheme])}"
        )
    if parts.scheme == "embedded":
        from large_queue.backends.embedded import DEFAULT_RECORD_SIZE_LIMIT, EmbeddedBackend

        if parts.netloc:
            raise errors.InvalidArgumentError(
                f"{url!r} names a host ({parts.netloc!r}), which an embedded store has none of:"
                f" use embedded:///{parts.netloc}{parts.path} (three slashes) for an absolute path,"
                f" or embedded:{parts.netloc}{parts.path} for a relative one"
            )
        path = os.path.expanduser(unquote(parts.path))  # embedded:~/queues.db is in the home directory
        if not path:
            raise errors.InvalidArgumentError(f"{url!r} names no file: use embedded:///path/to/store.db")
        if "\x00" in path:
            raise errors.InvalidArgumentError(f"{url!r} names a file with a NUL character (%00) in its path")
        namespaces = [n.strip() for n in (_single(query, "namespaces", url) or "test").split(",")]
        if not all(namespaces):
            raise errors.InvalidArgumentError(f"namespaces= in {url!r} names an empty namespace")
        return EmbeddedBackend(
            path,
            namespaces=namespaces,
            record_size_limit=_integer(query, "record_size_limit", url) or DEFAULT_RECORD_SIZE_LIMIT,
            synchronous=_single(query, "synchronous", url) or "normal",
            busy_timeout=_busy_timeout(query, url),
            create=create,
        )
    if parts.scheme == "aerospike":
        try:
            from large_queue.backends.aerospike import AerospikeBackend, AerospikeSettings
        except ImportError as exc:  # the client package, a dependency, removed or broken
            raise errors.BackendUnavailableError(
                f"{url}: the aerospike client package cannot be imported ({exc}): pip install aerospike",
                code=-1,
            ) from None

        hosts = []
        for item in parts.netloc.split("@")[-1].split(","):
            host, _, port = item.rpartition(":")
            if ":" not in item or item.endswith("]"):  # no port given: the server's default
                host, port = item, str(DEFAULT_AEROSPIKE_PORT)
            if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
                raise errors.InvalidArgumentError(
                    f"host {item!r} in {url!r} is not host:port or host (a port from 1 to 65535)"
                )
            hosts.append((host.strip("[]"), int(port)))
        namespace = parts.path.strip("/") or "test"
        cafile = _single(query, "cafile", url)
        if _single(query, "tls_name", url) is not None and cafile is None:
            raise errors.InvalidArgumentError(
                f"tls_name= in {url!r} without cafile=: TLS needs the CA file that signed the server's"
                " certificate (cafile=/path/to/ca.pem); without it the connection would not be TLS at all"
            )
        return AerospikeBackend.connect(
            AerospikeSettings(
                hosts=tuple(hosts),
                namespace=namespace,
                user=unquote(parts.username) if parts.username else _single(query, "user", url),
                password=unquote(parts.password) if parts.password else _single(query, "password", url),
                tls={"enable": True, "cafile": cafile} if cafile else None,
                tls_name=_single(query, "tls_name", url),
                total_timeout_ms=_integer(query, "timeout_ms", url) or 1000,
            )
        )
    raise errors.InvalidArgumentError(
        f"unknown store URL {url!r}: use aerospike://host:port/namespace or embedded:///path/to/store.db"
    )
