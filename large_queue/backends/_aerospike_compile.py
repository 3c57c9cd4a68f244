"""Library conditions and operations in the Aerospike client's form: filter expressions and operation dicts.

A condition (:mod:`large_queue.backends.conditions`) compiles to the
expression list the client sends as a policy's ``expressions``; an
operation (:mod:`large_queue.backends._base`) becomes the client's operation
dictionary. Both are built once per template or constant and only have
their values put in at each command: building ``aerospike_helpers``
objects at every command cost about 20 us a condition.

The ``aerospike`` package is imported here and in :mod:`.aerospike` only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import aerospike
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import expression_operations, map_operations

from large_queue.backends import conditions as c
from large_queue.backends._base import (
    OVERWRITING_READS,
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
    ReadSinceUpdate,
    Write,
    check_not_read_before,
)

# Compiled expressions are lists of (op, result type, fixed, children) tuples.
# The headers below are taken from ``aerospike_helpers``' own compiled output
# once, at import, so conditions compile by appending tuples: building and
# compiling helper objects at every command cost about 20 us a condition.
_COMPARE_HEADS = {
    symbol: builder(0, 0).compile()[0]
    for symbol, builder in {
        "==": exp.Eq,
        "!=": exp.NE,
        "<": exp.LT,
        "<=": exp.LE,
        ">": exp.GT,
        ">=": exp.GE,
    }.items()
}
_AND_OF_TWO = exp.And(0, 0).compile()
_OR_OF_TWO = exp.Or(0, 0).compile()
_NOT_HEAD = exp.Not(0).compile()[0]
_SINCE_UPDATE = exp.SinceUpdateTime().compile()[0]
_VALUE = _AND_OF_TWO[1]  # (op, type, {"val": 0}, 0)
# the server's clock in ms: its last-update time of the record (ns) plus the time since it (ms)
_NOW_MS = exp.Add(exp.Div(exp.LastUpdateTime(), 1_000_000), exp.SinceUpdateTime()).compile()
_ARITHMETIC_OF_TWO = {
    "+": exp.Add(0, 0).compile(),
    "-": exp.Sub(0, 0).compile(),
    "max": exp.Max(0, 0).compile(),
}
_LIST_INT_HEAD = exp.ListGetByIndex(
    None, aerospike.LIST_RETURN_VALUE, exp.ResultType.INTEGER, 0, exp.ListBin("x")
).compile()[0]
_RANK_LIST_HEAD = exp.ListGetByRank(
    None, aerospike.LIST_RETURN_VALUE, exp.ResultType.LIST, -1, exp.ListBin("x")
).compile()[0]
_INDEX_RANGE_HEAD = exp.ListGetByIndexRange(
    None, aerospike.LIST_RETURN_VALUE, 0, 1, exp.ListBin("x")
).compile()[0]


_BIN_LEAVES = {"IntBin": exp.IntBin, "StrBin": exp.StrBin, "BinExists": exp.BinExists, "ListBin": exp.ListBin}


@functools.cache
def _bin_leaf(kind: str, name: str) -> tuple[Any, ...]:
    compiled: tuple[Any, ...] = _BIN_LEAVES[kind](name).compile()[0]
    return compiled


def compile_condition(condition: c.Condition) -> list[tuple[Any, ...]]:
    """Compile a condition tree to an Aerospike filter expression.

    Each condition object is compiled once (conditions are constants or
    templates); a bound template then only has its values put in.
    """
    if isinstance(condition, c.Bound):
        return compile_expression(condition.template, condition.values)
    if isinstance(condition, (int, str)):  # a constant is no condition (the server would take True)
        raise TypeError(f"not a condition: {condition!r}")
    return compile_expression(condition, None)


def compile_expression(node: Any, values: dict[str, int | str] | None) -> list[tuple[Any, ...]]:
    """Compile a condition or operand (a template, built once) with its parameters' ``values``."""
    compiled, positions = _compiled(node)
    if not positions:
        return compiled
    if values is None:
        raise TypeError(f"{node!r} has parameters: bind it (conditions.Bound)")
    bound = list(compiled)
    for index, name in positions:
        bound[index] = _value(values[name])
    return bound


# id of a condition -> (the condition, its compiled form with Param placeholders, their positions)
_COMPILED: dict[int, tuple[c.Condition, list[Any], list[tuple[int, str]]]] = {}
_MOST_COMPILED = 1024  # conditions built per command are not templates: forget them now and then


def _compiled(condition: c.Condition) -> tuple[list[Any], list[tuple[int, str]]]:
    found = _COMPILED.get(id(condition))
    if found is None or found[0] is not condition:
        compiled: list[Any] = []
        _emit(condition, compiled)
        positions = [(index, part.name) for index, part in enumerate(compiled) if isinstance(part, c.Param)]
        if len(_COMPILED) >= _MOST_COMPILED:
            _COMPILED.clear()
        found = _COMPILED[id(condition)] = (condition, compiled, positions)  # keeps the id taken
    return found[1], found[2]


def _value(value: int | str) -> tuple[Any, ...]:
    return (_VALUE[0], _VALUE[1], {"val": value}, _VALUE[3])


def _emit(node: Any, out: list[Any]) -> None:
    if isinstance(node, c.Compare):
        out.append(_COMPARE_HEADS[node.op])
        _emit(node.left, out)
        _emit(node.right, out)
    elif isinstance(node, (c.And, c.Or)) and len(node.parts) < 2:  # the server takes two parts or more
        if node.parts:
            _emit(node.parts[0], out)
        else:  # none: true for And, false for Or, as the embedded store reads them
            _emit(c.Compare("==" if isinstance(node, c.And) else "!=", 0, 0), out)
    elif isinstance(node, (c.And, c.Or, c.Arith)):
        if isinstance(node, c.Arith):
            head, *_, end = _ARITHMETIC_OF_TWO[node.op]
        else:
            head, *_, end = _AND_OF_TWO if isinstance(node, c.And) else _OR_OF_TWO
        out.append((head[0], head[1], head[2], head[3] - 2 + len(node.parts)))
        for part in node.parts:
            _emit(part, out)
        out.append(end)
    elif isinstance(node, c.ListRangeMax):  # [0] of the top-ranked item of the range
        out.extend([_LIST_INT_HEAD, _value(0), _RANK_LIST_HEAD, _value(-1), _INDEX_RANGE_HEAD])
        _emit(node.index, out)
        _emit(node.count, out)
        out.append(_bin_leaf("ListBin", node.name))
    elif isinstance(node, c.NowMs):
        out.extend(_NOW_MS)
    elif isinstance(node, (c.MapKeyCount, c.MapItem)):
        _splice(_map_read_shape(type(node).__name__, node.name, getattr(node, "index", 0)), [node.key], out)
    elif isinstance(node, c.Not):
        out.append(_NOT_HEAD)
        _emit(node.part, out)
    elif isinstance(node, c.Bound):  # a bound template inside another condition: its values put in now
        inner: list[Any] = []
        _emit(node.template, inner)
        out.extend(_value(node.values[part.name]) if isinstance(part, c.Param) else part for part in inner)
    elif isinstance(node, (c.IntBin, c.StrBin, c.BinExists)):
        out.append(_bin_leaf(type(node).__name__, node.name))
    elif isinstance(node, c.SinceUpdateMs):
        out.append(_SINCE_UPDATE)
    elif isinstance(node, c.Param):
        out.append(node)  # a placeholder, replaced when the template is bound
    elif isinstance(node, (int, str)):
        out.append(_value(node))
    else:
        raise TypeError(f"not a condition node: {node!r}")


_READ_SINCE_UPDATE = [_SINCE_UPDATE]


# Expressions built from the client's helpers with sentinel values in the places
# of their variable parts, compiled once; the parts are spliced in at the sentinels.
def _sentinel(index: int) -> str:
    return f"\x00lq-part-{index}"


def _splice(shape: list[Any], parts: Sequence[Any], out: list[Any]) -> None:
    """Append ``shape`` to ``out`` with sentinel ``i`` replaced by the compiled ``parts[i]``."""
    for item in shape:
        fixed = item[2]
        value = fixed.get("val") if type(fixed) is dict else None
        if type(value) is str and value.startswith("\x00lq-part-"):
            _emit(parts[int(value.rsplit("-", 1)[1])], out)
        else:
            out.append(item)


@functools.cache
def _map_read_shape(kind: str, name: str, index: int) -> list[Any]:
    if kind == "MapKeyCount":
        helper: Any = exp.MapGetByKey(
            None, aerospike.MAP_RETURN_COUNT, exp.ResultType.INTEGER, _sentinel(0), exp.MapBin(name)
        )
    else:
        helper = exp.ListGetByIndex(
            None,
            aerospike.LIST_RETURN_VALUE,
            exp.ResultType.INTEGER,
            index,
            exp.MapGetByKey(
                None, aerospike.MAP_RETURN_VALUE, exp.ResultType.LIST, _sentinel(0), exp.MapBin(name)
            ),
        )
    compiled: list[Any] = helper.compile()
    return compiled


@functools.cache
def _log_put_shape(name: str, item_count: int, keep: int) -> list[Any]:
    """:class:`LogPut` with sentinels: 0 the key, 1 the age cutoff, 2... the items."""
    log = exp.Cond(exp.BinExists(name), exp.MapBin(name), exp.Val({}))
    cutoff = exp.ListAppend(None, None, _sentinel(1), exp.Val([]))
    aged = exp.MapRemoveByValueRange(None, None, cutoff, log)
    kept = exp.MapRemoveByRankRangeToEnd(None, -(keep - 1), aged, inverted=True)
    item: Any = exp.Val([])
    for index in range(item_count):
        item = exp.ListAppend(None, None, _sentinel(2 + index), item)
    compiled: list[Any] = exp.MapPut(None, None, _sentinel(0), item, kept).compile()
    return compiled


# (bin, key, items, keep, max age) -> the compiled log put and its parameters' positions
_LOG_PUTS: dict[tuple[Any, ...], tuple[list[Any], list[tuple[int, str]]]] = {}


def _log_put(op: LogPut) -> dict[str, Any]:
    """The expression write of a :class:`LogPut` (compiled once per shape; parameters put in)."""
    if op.keep < 2:
        raise ValueError(f"a log must keep at least 2 entries, not {op.keep}")
    shape_key = (op.bin, op.key, op.items, op.keep, op.max_age_ms)
    found = _LOG_PUTS.get(shape_key)
    if found is None:
        compiled: list[Any] = []
        parts = [op.key, c.sub(c.NowMs(), op.max_age_ms), *op.items]
        _splice(_log_put_shape(op.bin, len(op.items), op.keep), parts, compiled)
        positions = [(i, part.name) for i, part in enumerate(compiled) if isinstance(part, c.Param)]
        if len(_LOG_PUTS) >= _MOST_COMPILED:
            _LOG_PUTS.clear()
        found = _LOG_PUTS[shape_key] = (compiled, positions)
    compiled, positions = found
    if positions:
        if op.values is None:
            raise TypeError(f"{op!r} has parameters: give their values")
        compiled = list(compiled)
        for index, name in positions:
            compiled[index] = _value(op.values[name])
    write: dict[str, Any] = expression_operations.expression_write(op.bin, compiled)
    return write


#: a list write past the list's end fails (error 26) instead of padding the list with nils, as on
#: the embedded store; a write at the end appends
_BOUNDED = {"write_flags": aerospike.LIST_WRITE_INSERT_BOUNDED}

_BUILDERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    Read: lambda op: {"op": aerospike.OPERATOR_READ, "bin": op.bin},
    Write: lambda op: {"op": aerospike.OPERATOR_WRITE, "bin": op.bin, "val": op.value},
    Increment: lambda op: {"op": aerospike.OPERATOR_INCR, "bin": op.bin, "val": op.by},
    ListSet: lambda op: {
        "op": aerospike.OP_LIST_SET,
        "bin": op.bin,
        "index": op.index,
        "val": op.value,
        "list_policy": _BOUNDED,
    },
    ListGetRange: lambda op: {
        "op": aerospike.OP_LIST_GET_RANGE,
        "bin": op.bin,
        "index": op.index,
        "val": op.count,
    },
    ReadSinceUpdate: lambda op: expression_operations.expression_read(op.bin, _READ_SINCE_UPDATE),
    # an expression's template is compiled once; its values are put in at each command (see _built)
    Evaluate: lambda op: {
        "op": aerospike.OP_EXPR_READ,
        "bin": op.bin,
        "expr": compile_expression(op.expression, op.values),
        "expr_flags": aerospike.EXP_READ_EVAL_NO_FAIL,  # unknown (a bin missing): None, as embedded
    },
    Compute: lambda op: {
        "op": aerospike.OP_EXPR_WRITE,
        "bin": op.bin,
        "expr": compile_expression(op.expression, op.values),
        "expr_flags": aerospike.EXP_WRITE_DEFAULT,
    },
    MapGet: lambda op: map_operations.map_get_by_key(op.bin, op.key, aerospike.MAP_RETURN_VALUE),
    LogPut: _log_put,
}


#: operations whose dictionaries hold compiled expressions (kept per operation object: see _built).
#: Evaluate and Compute are not among them: made per command with their values (a quick take's
#: new head), each would take a place in the cache for one use, so their dictionaries are made
#: at each command from the template compiled once, as cheaply as a lookup.
_EXPRESSION_OPERATIONS = frozenset({ReadSinceUpdate, LogPut})

# id of an operations tuple -> (the tuple, its operation dictionaries): tuples are built once (constants)
_BUILT: dict[int, tuple[Sequence[Operation], list[dict[str, Any]]]] = {}


def client_operations(operations: Sequence[Operation]) -> list[dict[str, Any]]:
    """The client's operation dictionaries for ``operations``, in order (built once for a tuple)."""
    if type(operations) is not tuple:
        return _built(operations)
    found = _BUILT.get(id(operations))
    if found is None or found[0] is not operations:
        if len(_BUILT) >= _MOST_COMPILED:
            _BUILT.clear()
        found = _BUILT[id(operations)] = (operations, _built(operations))  # keeps the id taken
    return found[1]


#: id of an operation -> (the operation, its dictionary), for operations whose dictionary is an
#: expression's: built once for an operation made once (a constant), however it is sent
_EXPRESSION_BUILT: dict[int, tuple[Operation, dict[str, Any]]] = {}


def _built(operations: Sequence[Operation]) -> list[dict[str, Any]]:
    built: list[dict[str, Any]] = []
    for index, op in enumerate(operations):
        kind = type(op)
        if kind in OVERWRITING_READS and index:
            check_not_read_before(operations, index)
        if kind in _EXPRESSION_OPERATIONS:
            found = _EXPRESSION_BUILT.get(id(op))
            if found is None or found[0] is not op:
                if len(_EXPRESSION_BUILT) >= _MOST_COMPILED:
                    _EXPRESSION_BUILT.clear()
                found = _EXPRESSION_BUILT[id(op)] = (op, _BUILDERS[kind](op))  # keeps the id taken
            built.append(found[1])
            continue
        builder = _BUILDERS.get(kind)
        if builder is not None:
            built.append(builder(op))
        elif isinstance(op, ListSetRange):
            # Aerospike has no "set a range": remove it and insert the new values, in one command.
            built.append(
                {
                    "op": aerospike.OP_LIST_REMOVE_RANGE,
                    "bin": op.bin,
                    "index": op.index,
                    "val": len(op.values),
                }
            )
            built.append(
                {
                    "op": aerospike.OP_LIST_INSERT_ITEMS,
                    "bin": op.bin,
                    "index": op.index,
                    "val": op.values,
                    "list_policy": _BOUNDED,
                }
            )
        else:
            raise TypeError(f"unknown operation {op!r}")
    return built
