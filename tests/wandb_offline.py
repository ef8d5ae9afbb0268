"""Read back an offline wandb run (wandb 0.31 ships no reader for its ``.wandb`` log files)."""

import json
import struct
from pathlib import Path


def wandb_records(run_file: Path) -> list:
    """Parse a ``.wandb`` file: a leveldb-style log (32 KiB blocks, 7-byte chunk headers) of protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, chunk, records = run_file.read_bytes(), 32768, 7, b"", []  # 7: the ':W&B' file header
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: a record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def history(records: list) -> list[dict]:
    """The logged rows (name -> value, with ``_step``) of a run's records."""
    return [
        {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]


def run_file(local_dir: Path, run_id: str) -> Path:
    (path,) = run_files(local_dir, run_id)
    return path


def run_files(local_dir: Path, run_id: str) -> list[Path]:
    """Every offline segment of a run, oldest first: each resumed process writes its own, with the same id
    (``wandb sync`` appends them to one run)."""
    return sorted((Path(local_dir) / "wandb").glob(f"offline-run-*-{run_id}/run-*.wandb"))
