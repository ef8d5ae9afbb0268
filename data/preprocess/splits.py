"""Writing a preprocessed data set: one parquet file per split, each renamed into place whole."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def write_splits(splits: dict[str, list[dict[str, Any]]], out_dir: str | os.PathLike) -> dict[str, Path]:
    """``<out_dir>/<split>.parquet`` for every split of rows; returns split -> path."""
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, rows in splits.items():
        path = out / f"{split}.parquet"
        staging = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        pq.write_table(pa.Table.from_pylist(rows), staging)
        os.replace(staging, path)  # a reader never sees a half-written file
        written[split] = path
    return written
