"""A small condition language for guarding single-record commands.

The queue algorithm states its guards ("the lock is free or expired", "this
holder still holds the lock", "no newer fencing token wrote this record") as
trees of these nodes. The Aerospike backend compiles a tree to a filter
expression (``aerospike_helpers.expressions``); the embedded backend evaluates
it against the stored record. Semantics follow Aerospike's: a bin that is
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class Compare:
    """``left <op> right`` where op is one of ``== != < <= > >=``."""

    op: str
    left: Operand
    right: Operand

    def __post_init__(self) -> None:
        if self.op not in _COMPARATORS:
            raise ValueError(f"unknown comparison operator {self.op!r}")


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


_COMPARATORS = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
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
    """Evaluate ``condition`` on a record; returns True, False or ``UNKNOWN``."""
    if isinstance(condition, Compare):
        left = value_of(condition.left, bins, clock, params)
        right = value_of(condition.right, bins, clock, params)
        if left is UNKNOWN or right is UNKNOWN or type(left) is not type(right):
            return UNKNOWN
        return _COMPARATORS[condition.op](left, right)
    if isinstance(condition, Bound):
        return evaluate(condition.template, bins, clock, condition.values)
    if isinstance(condition, BinExists):
        return condition.name in bins
    if isinstance(condition, Not):
        inner = evaluate(condition.part, bins, clock, params)
        return inner if inner is UNKNOWN else not inner
    if isinstance(condition, And):
        results = [evaluate(p, bins, clock, params) for p in condition.parts]
        if any(r is False for r in results):
            return False
        return UNKNOWN if any(r is UNKNOWN for r in results) else True
    if isinstance(condition, Or):
        results = [evaluate(p, bins, clock, params) for p in condition.parts]
        if any(r is True for r in results):
            return True
        return UNKNOWN if any(r is UNKNOWN for r in results) else False
    raise TypeError(f"not a condition: {condition!r}")


def value_of(
    operand: Operand, bins: dict[str, Any], clock: Clock, params: dict[str, Any] | None = None
) -> Any:
    """The value of an operand on a record (``UNKNOWN`` where Aerospike's would be unknown)."""
    if isinstance(operand, SinceUpdateMs):
        return clock.since_update_ms
    if isinstance(operand, NowMs):
        return clock.now_ms
    if isinstance(operand, ListRangeMax):
        items = bins.get(operand.name)
        index = value_of(operand.index, bins, clock, params)
        count = value_of(operand.count, bins, clock, params)
        if type(items) is not list or type(index) is not int or type(count) is not int or index < 0:
            return UNKNOWN
        chosen = items[index : index + count]
        if not chosen or not all(type(item) is list and item and type(item[0]) is int for item in chosen):
            return UNKNOWN
        return max(item[0] for item in chosen)
    if isinstance(operand, (MapKeyCount, MapItem)):
        mapping = bins.get(operand.name)
        key = value_of(operand.key, bins, clock, params)
        if type(mapping) is not dict:
            return UNKNOWN
        if isinstance(operand, MapKeyCount):
            return int(key in mapping)
        item = mapping.get(key)
        if (
            type(item) is not list
            or not 0 <= operand.index < len(item)
            or type(item[operand.index]) is not int
        ):
            return UNKNOWN
        return item[operand.index]
    if isinstance(operand, Arith):
        values = [value_of(part, bins, clock, params) for part in operand.parts]
        if any(type(value) is not int for value in values):
            return UNKNOWN
        return _ARITHMETIC[operand.op](values)
    if isinstance(operand, IntBin):
        value = bins.get(operand.name, UNKNOWN)
        return value if type(value) is int else UNKNOWN
    if isinstance(operand, StrBin):
        value = bins.get(operand.name, UNKNOWN)
        return value if isinstance(value, str) else UNKNOWN
    if isinstance(operand, Param):
        if params is None or operand.name not in params:
            raise TypeError(f"parameter {operand.name!r} has no value: bind the template (Bound)")
        return params[operand.name]
    return operand
