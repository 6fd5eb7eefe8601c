"""A `save_to_disk` directory is bounded on rows and bytes before `datasets` loads a row, as a
Parquet file is from its footer: counted from its Arrow files' record batches (not from
state.json or dataset_info.json, which can say anything), each refusal one line naming the
directory, and `load_from_disk` never called."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import EXAMPLES, Limits
from twinrun.data.examples import load_rows

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

ROWS = [{"prompt": f"Say {i}.", "completion": str(i)} for i in range(5)]


def limits(**changes: Any) -> Limits:
    return Limits(**{**EXAMPLES.__dict__, **changes})


def saved(tmp_path: Path, rows: list[dict[str, Any]] = ROWS) -> Path:
    d = tmp_path / "saved"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    datasets.Dataset.from_dict({k: [r.get(k) for r in rows] for k in keys}).save_to_disk(str(d))
    return d


def shard(d: Path) -> Path:
    (entry,) = json.loads((d / "state.json").read_text())["_data_files"]
    return d / entry["filename"]


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every directory `datasets.load_from_disk` is asked to load."""
    seen: list[str] = []
    real = datasets.load_from_disk

    def spy(path: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_from_disk", spy)
    return seen


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_within_the_limits_every_row_is_read(tmp_path: Path, loads: list[str]) -> None:
    d = saved(tmp_path)
    assert [r.data for r in load_rows(d, limits(max_rows=5))] == ROWS
    assert loads == [str(d)]


def test_more_rows_than_the_limit_are_refused_before_loading(
    tmp_path: Path, loads: list[str]
) -> None:
    d = saved(tmp_path)
    # the metadata claims one row: the Arrow file's own batches are what counts
    info = json.loads((d / "dataset_info.json").read_text())
    info["splits"] = {"train": {"name": "train", "num_bytes": 10, "num_examples": 1}}
    (d / "dataset_info.json").write_text(json.dumps(info))
    before = snapshot(d)
    with pytest.raises(DataError) as err:
        load_rows(d, limits(max_rows=4))
    assert err.value.one_line() == (
        f"{d}: 5 rows, over the limit of 4 — split the data, or give a subset"
    )
    assert loads == [] and snapshot(d) == before


def test_decoded_bytes_over_the_limit_are_refused_though_the_files_are_small(
    tmp_path: Path, loads: list[str]
) -> None:
    """A compressed Arrow stream is small on disk: its batches' decoded size is what counts."""
    import pyarrow as pa

    d = saved(tmp_path)
    f = shard(d)
    table = pa.table({"prompt": ["x" * 100_000] * 8, "completion": ["y"] * 8})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with (
        pa.OSFile(str(f), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema, options=options) as w,
    ):
        w.write_table(table)
    on_disk = sum(p.stat().st_size for p in d.iterdir())
    decoded = table.to_batches()[0].nbytes
    cap = 200_000
    assert on_disk < cap < decoded  # the cheap gate on the files' size lets it through
    before = snapshot(d)
    with pytest.raises(DataError) as err:
        load_rows(d, limits(max_file_bytes=cap))
    assert err.value.one_line() == (
        f"{d}: {decoded} bytes decoded by {f.name}, over the limit of {cap} — split the data"
    )
    assert loads == [] and snapshot(d) == before


def test_a_value_over_the_row_limit_is_refused_before_loading(
    tmp_path: Path, loads: list[str]
) -> None:
    d = saved(tmp_path, [*ROWS, {"prompt": "p" * 500, "completion": "c"}])
    with pytest.raises(DataError) as err:
        load_rows(d, limits(max_bytes=100))
    assert err.value.one_line() == (
        f"{d}: column 'prompt' holds a value of 500 bytes, over the limit of 100 for a row"
        " — shorten the rows"
    )
    assert loads == []


def test_an_arrow_file_that_is_not_a_stream_is_one_line_naming_it(
    tmp_path: Path, loads: list[str]
) -> None:
    d = saved(tmp_path)
    f = shard(d)
    f.write_bytes(b"not an arrow stream at all")
    with pytest.raises(DataError) as err:
        load_rows(d)
    line = err.value.one_line()
    assert line.startswith(f"{f}: not readable as an Arrow stream (") and "\n" not in line, line
    assert line.endswith(" — write the directory again with save_to_disk"), line
    assert loads == []


def test_the_files_size_is_the_first_gate(tmp_path: Path, loads: list[str]) -> None:
    d = saved(tmp_path)
    size = sum(p.stat().st_size for p in d.iterdir())
    with pytest.raises(DataError) as err:
        load_rows(d, limits(max_file_bytes=size - 1))
    assert (
        err.value.one_line() == f"{d}: {size} bytes, over the limit of {size - 1} — split the data"
    )
    assert loads == []
