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
class Param:
    """A value given when a template is bound (:class:`Bound`)."""

    name: str


Operand = IntBin | StrBin | SinceUpdateMs | Param | int | str


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


class _Unknown:
    """Aerospike's third truth value: a missing bin or a type mismatch."""


UNKNOWN: Any = _Unknown()


def evaluate(
    condition: Condition, bins: dict[str, Any], since_update_ms: int, params: dict[str, Any] | None = None
) -> Any:
    """Evaluate ``condition`` on a record; returns True, False or ``UNKNOWN``."""
    if isinstance(condition, Compare):
        left = _operand(condition.left, bins, since_update_ms, params)
        right = _operand(condition.right, bins, since_update_ms, params)
        if left is UNKNOWN or right is UNKNOWN or type(left) is not type(right):
            return UNKNOWN
        return _COMPARATORS[condition.op](left, right)
    if isinstance(condition, Bound):
        return evaluate(condition.template, bins, since_update_ms, condition.values)
    if isinstance(condition, BinExists):
        return condition.name in bins
    if isinstance(condition, Not):
        inner = evaluate(condition.part, bins, since_update_ms, params)
        return inner if inner is UNKNOWN else not inner
    if isinstance(condition, And):
        results = [evaluate(p, bins, since_update_ms, params) for p in condition.parts]
        if any(r is False for r in results):
            return False
        return UNKNOWN if any(r is UNKNOWN for r in results) else True
    if isinstance(condition, Or):
        results = [evaluate(p, bins, since_update_ms, params) for p in condition.parts]
        if any(r is True for r in results):
            return True
        return UNKNOWN if any(r is UNKNOWN for r in results) else False
    raise TypeError(f"not a condition: {condition!r}")


def _operand(
    operand: Operand, bins: dict[str, Any], since_update_ms: int, params: dict[str, Any] | None
) -> Any:
    if isinstance(operand, SinceUpdateMs):
        return since_update_ms
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
