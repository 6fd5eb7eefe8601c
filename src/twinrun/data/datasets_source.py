"""Examples in the formats the `datasets` library writes: a Parquet file, or a `save_to_disk`
directory of one split. Read through `datasets` (an optional extra, imported only here and only
when such a source is given: its import takes about two seconds), with no cache written;
rows in the file's order, bounded as a JSONL file is — and before any row is decoded into Python:
a Parquet file's rows and bytes from its footer (`parquet_bounds`), a `save_to_disk` directory's
from its Arrow files' record batches (`saved_bounds`; never from state.json or
dataset_info.json, which may say anything); a null value is a field the row does not have
(Arrow stores every column in every row). Their digest is of the bytes read: the
Parquet file's SHA256, or one SHA256 over the directory's state, info and Arrow files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from twinrun.core.digest import sha256_file, sha256_files
from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import Limits

Kind = Literal["parquet", "saved", "splits"]
PARQUET_MAGIC = b"PAR1"
PAGE_OVERHEAD = 64 << 10  # bytes a column chunk may hold beyond its values (headers, levels)
SAVED_MARKERS = ("state.json", "dataset_info.json")
INSTALL = "pip install 'twinrun[datasets]'"
TO_JSONL = {
    "parquet": "datasets.load_dataset('parquet', data_files=PATH)['train'].to_json('x.jsonl')",
    "saved": "datasets.load_from_disk(PATH).to_json('x.jsonl')",
}
NAMES = {"parquet": "a Parquet file", "saved": "a datasets save_to_disk directory"}


def source_kind(p: Path, head: bytes = b"") -> Kind | None:
    """What `datasets` format `p` is in (by its name, its first bytes `head`, or the files a
    `save_to_disk` writes), or None for a file twinrun reads itself."""
    if p.is_dir():
        if (p / "dataset_dict.json").is_file():
            return "splits"
        if all((p / n).is_file() for n in SAVED_MARKERS):
            return "saved"
        return None
    if p.suffix.lower() == ".parquet" or head.startswith(PARQUET_MAGIC):
        return "parquet"
    return None


# other binary formats users bring, by their first bytes: what it is, and how to make JSONL of it
OTHER_FORMATS: tuple[tuple[bytes, str, str], ...] = (
    (b"\x1f\x8b", "a gzip file", "decompress it: gunzip FILE"),
    (b"PK\x03\x04", "a zip archive (or an Excel workbook)", "unzip it, or save the sheet as CSV"),
    (b"ARROW1", "an Arrow IPC (Feather) file",
     "datasets.Dataset.from_file(PATH).to_json('x.jsonl'), or give its save_to_disk directory"),
    (b"\xff\xff\xff\xff", "an Arrow stream file (a save_to_disk shard?)",
     "give the directory save_to_disk wrote (with state.json), not one of its .arrow files"),
)  # fmt: skip


def other_format(head: bytes) -> tuple[str, str] | None:
    """(what it is, how to convert) for a binary format twinrun does not read (by its magic)."""
    for magic, what, convert in OTHER_FORMATS:
        if head.startswith(magic):
            return what, convert
    return None


def _datasets(p: Path, kind: Kind) -> Any:
    """The `datasets` module, quiet; a DataError with the install line when absent (reading a
    local file or directory never reaches the network)."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{p} is {NAMES[kind]}; reading it needs the datasets package, which is not installed",
            f"{INSTALL}, or convert it to JSONL elsewhere: {TO_JSONL[kind]}",
        ) from None
    datasets.disable_progress_bars()
    return datasets


def _saved_files(p: Path) -> list[Path]:
    """The files `load_from_disk` reads: state, info and the Arrow files state.json lists."""
    try:
        state = json.loads((p / "state.json").read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(
            f"{p}/state.json: not a datasets state file", "write the directory with save_to_disk"
        ) from None
    files = [p / n for n in SAVED_MARKERS] + [p / str(n) for n in names]
    for f in files:
        if f.parent != p or not f.is_file():
            raise DataError(f"{p}: state.json lists {f.name!r}, which is not a file in it")
    return files


def source_sha256(p: Path, kind: Kind) -> str:
    """The digest of what is read: the Parquet file's SHA256, or one over the directory's files
    (each framed by its name and size)."""
    return sha256_file(p) if kind == "parquet" else sha256_files(_saved_files(p), p)


def _splits(p: Path) -> list[str]:
    try:
        value = json.loads((p / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        return [str(s) for s in value]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def parquet_bounds(p: Path, limits: Limits) -> None:
    """Refuse a Parquet file whose footer says it is over `limits`: more rows than
    `max_rows`, more uncompressed bytes than `max_file_bytes` (the cap a JSONL file's bytes
    have; compression ratios of 1000:1 make the file's own size no bound), or a row group whose
    bytes exceed `max_bytes` per row (then one of its rows is over the per-row limit). Only the
    footer is read."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(p).metadata
    except Exception as exc:  # any reader failure is the file's: one line naming it
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DataError(
            f"{p}: not readable as {NAMES['parquet']} ({reason})", "check the file, or rewrite it"
        ) from None
    hint = "split the data, or give a subset"
    if limits.max_rows is not None and meta.num_rows > limits.max_rows:
        raise DataError(f"{p}: {meta.num_rows} rows, over the limit of {limits.max_rows}", hint)
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        size = sum(group.column(c).total_uncompressed_size for c in range(group.num_columns))
        total += size
        overhead = PAGE_OVERHEAD * group.num_columns  # page headers, levels: not row data
        if size - overhead > limits.max_bytes * max(group.num_rows, 1):
            raise DataError(
                f"{p}: row group {g} holds {size} uncompressed bytes in {group.num_rows} rows, "
                f"so a row over the limit of {limits.max_bytes} bytes",
                "shorten the rows",
            )
    if total > limits.max_file_bytes:
        raise DataError(
            f"{p}: {total} bytes uncompressed, over the limit of {limits.max_file_bytes}", hint
        )


def _decoded_bounds(p: Path, table: Any, limits: Limits) -> None:
    """The decoded Arrow table within the limits (a footer can lie about its sizes): its
    buffers under `max_file_bytes`, no string or binary value over `max_bytes`."""
    if limits.max_rows is not None and table.num_rows > limits.max_rows:
        raise DataError(f"{p}: {table.num_rows} rows, over the limit of {limits.max_rows}")
    if table.nbytes > limits.max_file_bytes:
        raise DataError(
            f"{p}: {table.nbytes} bytes decoded, over the limit of {limits.max_file_bytes}",
            "split the data",
        )
    _longest_values(p, table, limits)


def _longest_values(p: Path, table: Any, limits: Limits) -> None:
    """No string or binary value of `table` (a Table or a RecordBatch) over `max_bytes`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):  # fmt: skip
            continue
        longest = pc.max(pc.binary_length(column)).as_py()
        if longest is not None and longest > limits.max_bytes:
            raise DataError(
                f"{p}: column {name!r} holds a value of {longest} bytes, over the limit of "
                f"{limits.max_bytes} for a row",
                "shorten the rows",
            )


def saved_bounds(p: Path, arrow_files: list[Path], limits: Limits) -> None:
    """Refuse a `save_to_disk` directory whose Arrow files (each an Arrow IPC stream) hold more
    rows than `max_rows`, more bytes than `max_file_bytes` once read, or a string or binary value
    over `max_bytes`: counted from the files' own record batches (memory-mapped, so an
    uncompressed batch is not copied), never from state.json or dataset_info.json, and before
    `datasets` loads a row. A file that is not an Arrow stream is one line naming it."""
    import pyarrow as pa

    rows = decoded = 0
    for f in arrow_files:
        try:
            with pa.memory_map(str(f)) as source:
                for batch in pa.ipc.open_stream(source):
                    rows += batch.num_rows
                    decoded += batch.nbytes
                    if decoded > limits.max_file_bytes:
                        raise DataError(
                            f"{p}: {decoded} bytes decoded by {f.name}, over the limit of "
                            f"{limits.max_file_bytes}",
                            "split the data",
                        )
                    _longest_values(p, batch, limits)
        except DataError:
            raise
        except Exception as exc:  # any reader failure is the file's: one line naming it
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise DataError(
                f"{f}: not readable as an Arrow stream ({reason})",
                "write the directory again with save_to_disk",
            ) from None
    if limits.max_rows is not None and rows > limits.max_rows:
        raise DataError(
            f"{p}: {rows} rows, over the limit of {limits.max_rows}",
            "split the data, or give a subset",
        )


def read_source(p: Path, kind: Kind, limits: Limits) -> list[tuple[dict[str, Any], str]]:
    """The rows of `p` as (object, where) pairs, where = `PATH[INDEX]`; a DataError naming the
    source for one that cannot be read, holds several splits, or is over `limits`."""
    if kind == "splits":
        splits = _splits(p)
        first = f"{p / splits[0]}" if splits else f"{p}/SPLIT"
        raise DataError(
            f"{p} holds several splits ({', '.join(splits) or 'unnamed'}), a DatasetDict",
            f"give one split's directory, e.g. --examples {first}",
        )
    files = [p] if kind == "parquet" else _saved_files(p)
    size = sum(f.stat().st_size for f in files)
    if size > limits.max_file_bytes:
        raise DataError(
            f"{p}: {size} bytes, over the limit of {limits.max_file_bytes}", "split the data"
        )
    datasets = _datasets(p, kind)
    if kind == "parquet":
        parquet_bounds(p, limits)  # from the footer, before a row is decoded
    else:
        saved_bounds(p, files[len(SAVED_MARKERS) :], limits)  # from the Arrow files' batches
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            arrow = pq.read_table(p)
            _decoded_bounds(p, arrow, limits)  # what was decoded, before any Python object
            rows = datasets.Dataset(datasets.table.InMemoryTable(arrow)).to_list()
        else:
            rows = datasets.load_from_disk(str(p), keep_in_memory=True).to_list()
    except DataError:
        raise
    except Exception as exc:  # any reader failure is the file's: one line naming it
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DataError(
            f"{p}: not readable as {NAMES[kind]} ({reason})", "check the file, or rewrite it"
        ) from None
    out = []
    for i, record in enumerate(rows):
        where = f"{p}[{i}]"
        row = {k: v for k, v in record.items() if v is not None}  # Arrow's null: a field not given
        if len(json.dumps(row, ensure_ascii=False, default=str)) > limits.max_bytes:
            raise DataError(f"{where}: a row over the limit of {limits.max_bytes} bytes")
        out.append((row, where))
    return out
