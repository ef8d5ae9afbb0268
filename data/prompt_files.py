"""A prompt file's rows: parquet read with pyarrow, JSON Lines (or one JSON list of objects) with ``json``.

The rows are those ``datasets.load_dataset`` gives for the same file, in the same order with the same
columns: each row a dict of Python values, nested columns as lists and dicts; in JSON a key that some rows lack is
None in them. One difference, in JSON only: a column that mixes integers and floats keeps each value as written,
where ``datasets`` makes every one a float (``1`` -> ``1.0``). Read directly, a run needs neither ``datasets`` nor
pandas, and writes nothing into the Hugging Face cache.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SUFFIXES = (".parquet", ".jsonl", ".json")
ONE_OBJECT_PER_LINE = 'expected one JSON object per line, {"prompt": ..., ...}'


def read_rows(path: str, columns: dict[str, str]) -> list[dict[str, Any]]:
    """One parquet or JSON Lines file's rows, checked: readable, with rows, and with each of ``columns``
    (column -> the config key that names it)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"unsupported data file type {suffix!r} ({path}); use .parquet or .jsonl")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is empty (0 bytes); expected one prompt per row")
    rows, names = _read_parquet(path) if suffix == ".parquet" else _read_json(path)
    if not rows:
        raise ValueError(f"{path} holds no rows; expected one prompt per row")
    for column, key in columns.items():
        if column not in names:
            raise ValueError(
                f"{key.rpartition('.')[2].replace('_', ' ')} {column!r} not found in {path}; its columns "
                f"are {names}. Set {key} to one of them."
            )
    return rows


def _read_parquet(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:  # ArrowInvalid: say what is wrong with the file, not where it broke
        first = (str(exc).splitlines() or [""])[0]
        raise ValueError(
            f"{path} cannot be read ({type(exc).__name__}: {first}); expected a parquet file (as "
            "pandas.DataFrame.to_parquet writes it)"
        ) from None
    return table.to_pylist(), table.column_names


def _read_json(path: str) -> tuple[list[dict[str, Any]], list[str]]:
    """JSON Lines, or one JSON list of objects: each row as written, with every column (None where a row lacks
    the key), the columns in the order they first appear."""
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a byte order mark is not part of the first row
            text = f.read()
        listed = text.lstrip().startswith("[")
        records = json.loads(text) if listed else None
    except ValueError as exc:  # not UTF-8, or a JSON list that does not parse
        first = (str(exc).splitlines() or [""])[0]
        raise ValueError(f"{path} cannot be read ({type(exc).__name__}: {first}); expected a JSON file") from None
    if listed:
        bad = next((i for i, record in enumerate(records) if not isinstance(record, dict)), None)
        if bad is not None:
            raise ValueError(f"{path}: item {bad} of its list is not a JSON object; expected a list of objects")
    else:
        records = [_json_object(line, path, number) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    names = list(dict.fromkeys(key for record in records for key in record))
    return [{name: record.get(name) for name in names} for record in records], names


def _json_object(line: str, path: str, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
        problem = None if isinstance(record, dict) else f"a {type(record).__name__}"
    except ValueError as exc:
        problem = str(exc)
    if problem is not None:
        raise ValueError(f"line {number} of {path} is not a JSON object ({problem}); {ONE_OBJECT_PER_LINE}")
    return record
