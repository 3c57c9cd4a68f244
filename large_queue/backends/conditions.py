"""A small condition language for guarding single-record commands.

The queue algorithm states its guards ("the lock is free or expired", "this
holder still holds the lock", "no newer fencing token wrote this record") as
trees of these nodes. The Aerospike backend compiles a tree to a filter
expression (:mod:`._aerospike_compile`); the embedded backend evaluates
it against the stored record (:func:`evaluate`), compiled once into nested
closures, so that a command does not walk the tree. Semantics follow Aerospike's: a bin that is
missing or of another type makes the comparison *unknown*, and a condition
that is not known to be true fails the command.

A condition used with different values at every command is built once as
a template whose values are :class:`Param` operands, and bound per command
(:class:`Bound`): stores then compile the template once and only put the
values in.

Example::

    lock_is_free = Or(Eq(StrBin("lock_owner"), ""), Gt(SinceUpdateMs(), IntBin("lock_ttl")))
    held = Bound(all_of(eq(StrBin("lock_owner"), Param("owner"))), {"owner": "txn-7"})
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from large_queue import errors


@dataclass(frozen=True)
class IntBin:
    """The integer value of a bin."""

    name: str


@dataclass(frozen=True)
class StrBin:
    """The string value of a bin."""

    name: str


@dataclass(frozen=True)
class SinceUpdateMs:
    """Milliseconds since the record was last written, on the store's own clock."""


@dataclass(frozen=True)
class NowMs:
    """The store's clock now, in milliseconds since the Unix epoch.

    Only ever compared with other readings of the same store's clock (a
    value this store wrote), never with a client's clock.
    """


@dataclass(frozen=True)
class ListRangeMax:
    """The leading integer of the greatest of items ``[index, index + count)`` of a list bin.

    The items are lists led by an integer (lists compare element by element,
    so the greatest is the one with the largest leading integer). Unknown if
    the bin is missing, the range is empty or an item is not such a list.
    """

    name: str
    index: Any
    count: Any


@dataclass(frozen=True)
class MapKeyCount:
    """1 if the map bin holds ``key``, else 0; unknown if the bin is missing or not a map."""

    name: str
    key: Any


@dataclass(frozen=True)
class MapItem:
    """Integer item ``index`` of the list that the map bin holds under ``key``; unknown if there is none."""

    name: str
    key: Any
    index: int


@dataclass(frozen=True)
class Arith:
    """``+``, ``-`` or ``max`` of integer operands, evaluated by the store."""

    op: str
    parts: tuple[Any, ...]

    def __post_init__(self) -> None:
        if self.op not in _ARITHMETIC:
            raise ValueError(f"unknown arithmetic operator {self.op!r}")


@dataclass(frozen=True)
class Param:
    """A value given when a template is bound (:class:`Bound`)."""

    name: str


Operand = (
    IntBin | StrBin | SinceUpdateMs | NowMs | ListRangeMax | MapKeyCount | MapItem | Arith | Param | int | str
)
_OPERANDS = (IntBin, StrBin, SinceUpdateMs, NowMs, ListRangeMax, MapKeyCount, MapItem, Arith, Param, int, str)


@dataclass(frozen=True)
class Compare:
    """``left <op> right`` where op is one of ``== != < <= > >=``."""

    op: str
    left: Operand
    right: Operand

    def __post_init__(self) -> None:
        if self.op not in _COMPARATORS:
            raise errors.BackendUsageError(f"unknown comparison operator {self.op!r}", code=-2)
        for side in (self.left, self.right):
            if not isinstance(side, _OPERANDS) or type(side) is bool:
                raise errors.BackendUsageError(
                    f"a comparison compares ints, strs and operands (bins, Param, ...), not {side!r}", code=-2
                )
        kinds = {_kind(self.left), _kind(self.right)} - {None}
        if len(kinds) > 1:  # Aerospike refuses the expression; the embedded store would call it unknown
            raise errors.BackendUsageError(
                f"a comparison of an int with a str: {self.left!r} {self.op} {self.right!r}", code=-2
            )


def _kind(operand: Any) -> type | None:
    """What an operand is known to be before any record is read (None: a ``Param``, known when bound)."""
    if isinstance(operand, (StrBin, str)):
        return str
    return None if isinstance(operand, Param) else int


@dataclass(frozen=True)
class And:
    """True when every part is true."""

    parts: tuple[Condition, ...]


@dataclass(frozen=True)
class Or:
    """True when any part is true."""

    parts: tuple[Condition, ...]


@dataclass(frozen=True)
class Not:
    """True when the part is false (unknown stays unknown)."""

    part: Condition


@dataclass(frozen=True)
class BinExists:
    """True when the record has the bin."""

    name: str


@dataclass(frozen=True, eq=False)
class Bound:
    """A template (a condition with :class:`Param` operands) and the values of its parameters.

    Templates are meant to be built once (module constants): stores compile
    each template once and keep it.
    """

    template: Compare | And | Or | Not | BinExists
    values: dict[str, int | str]


Condition = Compare | And | Or | Not | BinExists | Bound
_CONDITIONS = (Compare, And, Or, Not, BinExists, Bound)


def eq(left: Operand, right: Operand) -> Compare:
    """``left == right``."""
    return Compare("==", left, right)


def lt(left: Operand, right: Operand) -> Compare:
    """``left < right``."""
    return Compare("<", left, right)


def le(left: Operand, right: Operand) -> Compare:
    """``left <= right``."""
    return Compare("<=", left, right)


def gt(left: Operand, right: Operand) -> Compare:
    """``left > right``."""
    return Compare(">", left, right)


def add(*parts: Operand) -> Arith:
    """The sum of the parts."""
    return Arith("+", parts)


def sub(left: Operand, right: Operand) -> Arith:
    """``left - right``."""
    return Arith("-", (left, right))


def max_of(*parts: Operand) -> Arith:
    """The largest of the parts."""
    return Arith("max", parts)


def all_of(*parts: Condition) -> And:
    """Conjunction of the parts."""
    return And(tuple(parts))


def any_of(*parts: Condition) -> Or:
    """Disjunction of the parts."""
    return Or(tuple(parts))


_COMPARATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


_ARITHMETIC: dict[str, Callable[[list[int]], int]] = {
    "+": sum,
    "-": lambda values: values[0] - values[1],
    "max": max,
}


class _Unknown:
    """Aerospike's third truth value: a missing bin or a type mismatch."""


UNKNOWN: Any = _Unknown()


@dataclass(frozen=True)
class Clock:
    """What a store's clock says for one command: now, and the time since the record was last written."""

    now_ms: int
    since_update_ms: int


def evaluate(
    condition: Condition, bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None = None
) -> Any:
    """Evaluate ``condition`` on a record; returns True, False or ``UNKNOWN``.

    Each condition object (a constant or a template) is compiled once into
    nested closures and kept (see :func:`compiled`), as the Aerospike
    backend compiles it once into a filter expression.
    """
    if type(condition) is Bound:
        return compiled(condition.template, condition=True)(bins, clock, condition.values)
    return compiled(condition, condition=True)(bins, clock, params)


def value_of(
    operand: Operand, bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None = None
) -> Any:
    """The value of an operand on a record (``UNKNOWN`` where Aerospike's would be unknown)."""
    if type(operand) is int or type(operand) is str:
        return operand
    return compiled(operand)(bins, clock, params)


#: a compiled condition or operand: ``(bins, clock, params) -> value`` (True, False or UNKNOWN for conditions)
Compiled = Callable[[dict[str, Any], Clock, "dict[str, Any] | None"], Any]

# id of a node -> (the node, its compiled form); the node is kept so that its id is not reused
_COMPILED: dict[int, tuple[Any, Compiled]] = {}
_MOST_COMPILED = 1024  # nodes built per command are not templates: forget them now and then


def compiled(node: Any, *, condition: bool = False) -> Compiled:
    """``node`` (a condition, or an operand) compiled into a closure, once per node object.

    ``condition``: ``TypeError`` if ``node`` is no condition.
    """
    found = _COMPILED.get(id(node))
    if found is None or found[0] is not node:
        if condition and type(node) not in _CONDITIONS:
            raise TypeError(f"not a condition: {node!r}")
        if len(_COMPILED) >= _MOST_COMPILED:
            _COMPILED.clear()
        found = _COMPILED[id(node)] = (node, _compile(node))
    return found[1]


def _compile(node: Any) -> Compiled:
    kind = type(node)
    if kind is Compare:
        return _compare(node)
    if kind is And or kind is Or:
        return _junction(node)
    if kind is Not:
        inner = _compile(node.part)

        def negation(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
            value = inner(bins, clock, params)
            return value if value is UNKNOWN else not value

        return negation
    if kind is BinExists:
        name = node.name
        return lambda bins, clock, params: name in bins
    if kind is Bound:
        template, values = _compile(node.template), node.values
        return lambda bins, clock, params: template(bins, clock, values)
    return _operand(node)


def _compare(node: Compare) -> Compiled:
    left, right, op = _operand(node.left), _operand(node.right), _COMPARATORS[node.op]

    def compare(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
        a = left(bins, clock, params)
        b = right(bins, clock, params)
        if a is UNKNOWN or b is UNKNOWN or type(a) is not type(b):
            return UNKNOWN
        return op(a, b)

    return compare


def _junction(node: And | Or) -> Compiled:
    """And: False if a part is False, else unknown if one is; Or: True if one is, else unknown if one is."""
    parts = [_compile(part) for part in node.parts]
    decisive = type(node) is Or  # the part value that decides the whole

    def junction(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
        unknown = False
        for part in parts:
            value = part(bins, clock, params)
            if value is decisive:
                return decisive
            if value is UNKNOWN:
                unknown = True
        return UNKNOWN if unknown else not decisive

    return junction


def _operand(node: Any) -> Compiled:
    kind = type(node)
    if kind is IntBin:
        name = node.name

        def int_bin(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
            value = bins.get(name, UNKNOWN)
            return value if type(value) is int else UNKNOWN

        return int_bin
    if kind is StrBin:
        name = node.name

        def str_bin(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
            value = bins.get(name, UNKNOWN)
            return value if isinstance(value, str) else UNKNOWN

        return str_bin
    if kind is SinceUpdateMs:
        return lambda bins, clock, params: clock.since_update_ms
    if kind is NowMs:
        return lambda bins, clock, params: clock.now_ms
    if kind is Param:
        return _param(node.name)
    if kind is Arith:
        return _arithmetic(node)
    if kind is ListRangeMax:
        return _list_range_max(node)
    if kind is MapKeyCount or kind is MapItem:
        return _map_read(node)
    return lambda bins, clock, params: node  # a constant


def _param(name: str) -> Compiled:
    def param(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
        if params is None or name not in params:
            raise TypeError(f"parameter {name!r} has no value: bind the template (Bound)")
        return params[name]

    return param


def _arithmetic(node: Arith) -> Compiled:
    parts, apply = [_operand(part) for part in node.parts], _ARITHMETIC[node.op]

    def arithmetic(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
        values = [part(bins, clock, params) for part in parts]
        for value in values:
            if type(value) is not int:
                return UNKNOWN
        return apply(values)

    return arithmetic


def _list_range_max(node: ListRangeMax) -> Compiled:
    name, index_of, count_of = node.name, _operand(node.index), _operand(node.count)

    def list_range_max(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
        items = bins.get(name)
        index = index_of(bins, clock, params)
        count = count_of(bins, clock, params)
        if type(items) is not list or type(index) is not int or type(count) is not int or index < 0:
            return UNKNOWN
        chosen = items[index : index + count]
        if not chosen or not all(type(item) is list and item and type(item[0]) is int for item in chosen):
            return UNKNOWN
        return max(item[0] for item in chosen)

    return list_range_max


def _map_read(node: MapKeyCount | MapItem) -> Compiled:
    name, key_of = node.name, _operand(node.key)
    position = node.index if type(node) is MapItem else None

    def map_read(bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None) -> Any:
        mapping = bins.get(name)
        key = key_of(bins, clock, params)
        if type(mapping) is not dict:
            return UNKNOWN
        if position is None:
            return int(key in mapping)
        item = mapping.get(key)
        if type(item) is not list or not 0 <= position < len(item) or type(item[position]) is not int:
            return UNKNOWN
        return item[position]

    return map_read
