"""What a written row becomes, without Spark: the ends of the timestamp range, a JSON queue's types."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Iterator

import pytest
from pyspark.sql.types import BinaryType, IntegerType, MapType, StringType, StructField, StructType

from large_queue.errors import InvalidArgumentError, UnsupportedEntryError
from large_queue.spark._rows import _instant, check_writable


@pytest.fixture
def zone() -> Iterator[Callable[[str], None]]:
    """Sets this process's local time zone (``TZ``) for a test, and restores it."""
    before = os.environ.get("TZ")

    def to(name: str) -> None:
        os.environ["TZ"] = name
        time.tzset()

    yield to
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.mark.parametrize(
    ("tz", "local", "utc"),
    [
        ("UTC", datetime.datetime(1, 1, 1), "0001-01-01T00:00:00+00:00"),  # Spark's earliest timestamp
        ("UTC", datetime.datetime(9999, 12, 31, 23, 59, 59, 999999), "9999-12-31T23:59:59.999999+00:00"),
        ("Etc/GMT+5", datetime.datetime(1, 1, 1), "0001-01-01T05:00:00+00:00"),  # west of UTC: later there
        ("Etc/GMT-2", datetime.datetime(1, 1, 1, 3), "0001-01-01T01:00:00+00:00"),
        ("Etc/GMT-2", datetime.datetime(9999, 12, 31, 23), "9999-12-31T21:00:00+00:00"),
        ("Etc/GMT-2", datetime.datetime(2020, 5, 1, 12), "2020-05-01T10:00:00+00:00"),
    ],
)
def test_a_timestamp_at_either_end_of_the_range_is_written_as_its_instant_in_utc(
    zone: Callable[[str], None], tz: str, local: datetime.datetime, utc: str
) -> None:
    zone(tz)
    assert _instant(local) == utc


@pytest.mark.parametrize(
    ("tz", "local"),
    [("Etc/GMT-2", datetime.datetime(1, 1, 1)), ("Etc/GMT+5", datetime.datetime(9999, 12, 31, 20))],
)
def test_a_timestamp_whose_instant_is_outside_the_years_an_entry_holds_is_refused_by_name(
    zone: Callable[[str], None], tz: str, local: datetime.datetime
) -> None:
    zone(tz)
    with pytest.raises(
        UnsupportedEntryError, match=f"timestamp {local.isoformat()} .* outside years 1 to 9999"
    ):
        _instant(local)


def test_a_json_queue_takes_only_columns_json_holds() -> None:
    def schema(data_type: object) -> StructType:
        return StructType([StructField("id", IntegerType()), StructField("c", data_type)])  # type: ignore[arg-type]

    fine = [StringType(), MapType(StringType(), IntegerType())]
    for data_type in fine:
        check_writable(schema(data_type), as_json=True)
    for data_type, named in [
        (BinaryType(), "column c is of type binary"),
        (MapType(IntegerType(), StringType()), r"column c \(its keys\) is of type int"),
    ]:
        check_writable(schema(data_type))  # any other queue holds it
        with pytest.raises(InvalidArgumentError, match=named + ", which cannot .* JSON-encoded queue"):
            check_writable(schema(data_type), as_json=True)


def test_json_text_is_read_with_its_integers_exact_and_its_numbers_in_a_doubles_range() -> None:
    from large_queue.spark._rows import _from_json

    big = 2**64  # past 64 bits: read exact, for an entry check to refuse
    assert _from_json(f'{{"n": {big}, "s": "x"}}') == {"n": big, "s": "x"}
    assert type(_from_json(f"[{-(2**63) - 1}]".encode())[0]) is int
    assert _from_json('{"n": 1, "s": "12345678901234567890"}') == {"n": 1, "s": "12345678901234567890"}
    assert _from_json("[NaN, Infinity, 1.5]")[1:] == [float("inf"), 1.5]  # the tokens reads write
    with pytest.raises(ValueError, match="1e400 is out of the range of a double"):
        _from_json("[1e400]")
