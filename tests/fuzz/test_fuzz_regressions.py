"""Minimal examples the fuzz suite found in the decode path and serialization, kept as plain tests.

Each was found by `test_fuzz_sql_rows` or `test_fuzz_enqueue` and fixed in
`pgtasks.serialization`; they run without a database.
"""

from __future__ import annotations

import datetime as dt

import pytest

from pgtasks.errors import SerializationError
from pgtasks.serialization import decode, dumps, loads_json


def test_a_time_zone_name_with_nul_is_refused_at_the_call_not_by_postgresql() -> None:
    """Found by test_apply_async: jsonb refused the text and enqueue raised DatabaseError."""
    value = dt.datetime(2030, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1), "A\x00B"))
    with pytest.raises(SerializationError) as info:
        dumps([value], "args")
    assert info.value.path.startswith("args[0]")


@pytest.mark.parametrize("number", [-(2**63) - 1, 2**64, 10**30, -(10**300)])
def test_a_plain_integer_beyond_64_bits_written_by_sql_is_read_exactly(number: int) -> None:
    """Found by test_rows_written_by_sql: ``[-9223372036854775809]`` reached the task as a float."""
    got = loads_json(f'[{number}, "x", {{"n": {number}}}]'.encode())
    assert got == [number, "x", {"n": number}]
    assert type(got[0]) is int and type(got[2]["n"]) is int


def test_a_number_beyond_a_float_stays_unreadable() -> None:
    with pytest.raises(ValueError, match="number is infinity"):
        loads_json(b"[" + b"1" + b"0" * 400 + b"]")


@pytest.mark.parametrize(
    "stored",
    [
        {"$pgtasks": None, "v": 1},  # read as a dict holding the reserved key: its result could not be stored
        {"$pgtasks": "tuple", "v": "abc"},  # read as ("a", "b", "c")
        {"$pgtasks": "set", "v": {"a": 1}},  # read as {"a"}
        {"$pgtasks": "int", "v": " 12"},
        {"$pgtasks": "int", "v": "1_000"},
        {"$pgtasks": "int", "v": "\u0661\u0662"},  # Arabic-Indic digits: int() reads 12
        {"$pgtasks": "bytes", "v": "!!!!"},  # base64 skipped the junk and read b""
        {"$pgtasks": "timedelta", "v": [1.5, 0, 0]},
        {"$pgtasks": "datetime", "v": "2030-01-01T00:00:00", "fold": 2},
        {"$pgtasks": "datetime", "v": "2030-01-01T00:00:00", "tz": {"k": 1}},
        {"$pgtasks": "uuid", "v": 5},
    ],
)
def test_a_malformed_tagged_value_is_refused_not_guessed(stored: dict[str, object]) -> None:
    """docs/workers.md: a malformed tagged value makes a row UNDECODABLE."""
    with pytest.raises((SerializationError, ValueError, TypeError)):
        decode([stored])


def test_well_formed_tagged_values_still_read_back() -> None:
    values = [
        (1, "a"),
        {1.5},
        frozenset({2}),
        2**70,
        float("inf"),
        dt.timedelta(days=-1, microseconds=5),
        b"\x00",
    ]
    values.append(dt.datetime(2030, 1, 1, fold=1, tzinfo=dt.timezone(dt.timedelta(hours=-3), "X")))
    assert loads_json(dumps(values).encode()) == values
