"""Examples from the formats `datasets` writes, made here with `datasets` itself: a Parquet file
and a `save_to_disk` directory are read in the file's order with their nulls dropped, digested by
the bytes read, and every way they can be wrong (several splits, a broken file, a missing shard,
over a limit, `datasets` not installed) is one line naming the source."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from twinrun.core.digest import sha256_files
from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import EXAMPLES, Limits
from twinrun.data.examples import examples_sha256, load_rows, sft_parts

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

USER = {"role": "user", "content": "What is 1 + 1?"}
ANSWER = {"role": "assistant", "content": "2"}
ROWS: list[dict[str, Any]] = [
    {"prompt": "Say hi.", "completion": "hi"},
    {"messages": [USER, ANSWER]},
    {"prompt": "What is 2 + 2?", "completion": "4"},
]


def dataset(rows: list[dict[str, Any]]) -> Any:
    """The rows as one Dataset, column by column: a field a row lacks is null there."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return datasets.Dataset.from_dict({k: [r.get(k) for r in rows] for k in keys})


def parquet(tmp_path: Path, rows: list[dict[str, Any]] = ROWS, name: str = "t.parquet") -> Path:
    p = tmp_path / name
    dataset(rows).to_parquet(str(p))
    return p


def saved(tmp_path: Path, rows: list[dict[str, Any]] = ROWS, name: str = "saved") -> Path:
    p = tmp_path / name
    dataset(rows).save_to_disk(str(p))
    return p


def test_parquet_rows_in_the_files_order_and_its_sha256(tmp_path: Path) -> None:
    p = parquet(tmp_path)
    rows = load_rows(p)
    assert [r.data for r in rows] == ROWS  # Arrow's nulls (the other rows' fields) dropped
    assert [r.where for r in rows] == [f"{p}[0]", f"{p}[1]", f"{p}[2]"]
    assert sft_parts(rows[1]) == ([USER], "2")
    assert examples_sha256(p) == hashlib.sha256(p.read_bytes()).hexdigest()
    renamed = tmp_path / "train.data"  # the magic bytes, whatever the name
    renamed.write_bytes(p.read_bytes())
    assert [r.data for r in load_rows(renamed)] == ROWS


def test_conversational_rows_from_parquet(tmp_path: Path) -> None:
    p = parquet(tmp_path, [{"prompt": [USER], "completion": [ANSWER]}])
    (row,) = load_rows(p)
    assert sft_parts(row) == ([USER], "2")


def test_save_to_disk_rows_and_the_digest_of_what_is_read(tmp_path: Path) -> None:
    d = saved(tmp_path)
    assert [r.data for r in load_rows(d)] == ROWS
    state = json.loads((d / "state.json").read_text())
    read = [d / "state.json", d / "dataset_info.json"]
    read += [d / f["filename"] for f in state["_data_files"]]
    assert examples_sha256(d) == sha256_files(read, d)
    (d / "cache-0123.arrow").write_bytes(b"a map() cache, not read")
    assert examples_sha256(d) == sha256_files(read, d)
    other = saved(tmp_path, [*ROWS[:2], {"prompt": "What is 2 + 2?", "completion": "5"}], "o")
    assert examples_sha256(other) != examples_sha256(d)


def test_reading_writes_no_cache(tmp_path: Path) -> None:
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = sorted(cache.rglob("*")) if cache.exists() else []
    p, d = parquet(tmp_path), saved(tmp_path)
    load_rows(p)
    load_rows(d)
    assert (sorted(cache.rglob("*")) if cache.exists() else []) == before


def test_several_splits_name_them_and_the_directory_to_give(tmp_path: Path) -> None:
    d = tmp_path / "dd"
    one = dataset(ROWS)
    datasets.DatasetDict({"train": one, "test": one}).save_to_disk(str(d))
    for read in (load_rows, examples_sha256):
        with pytest.raises(DataError, match=r"holds several splits \(train, test\)") as err:
            read(d)
        assert f"--examples {d / 'train'}" in (err.value.hint or "")
    assert [r.data for r in load_rows(d / "train")] == ROWS


def test_a_broken_parquet_file_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    p.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    with pytest.raises(DataError, match=r"not readable as a Parquet file \(") as err:
        load_rows(p)
    assert "\n" not in err.value.message


def test_a_save_to_disk_directory_whose_state_is_wrong(tmp_path: Path) -> None:
    d = saved(tmp_path)
    shard = json.loads((d / "state.json").read_text())["_data_files"][0]["filename"]
    (d / shard).unlink()
    with pytest.raises(DataError, match=f"state.json lists '{shard}', which is not a file"):
        load_rows(d)
    (d / "state.json").write_text("{}")
    for read in (load_rows, examples_sha256):
        with pytest.raises(DataError, match="state.json: not a datasets state file"):
            read(d)


def test_limits_hold_for_datasets_sources(tmp_path: Path) -> None:
    p, d = parquet(tmp_path), saved(tmp_path)
    small_row = Limits(**{**EXAMPLES.__dict__, "max_bytes": 60})
    with pytest.raises(DataError, match=r"\[1\]: a row over the limit of 60 bytes"):
        load_rows(p, small_row)
    small_file = Limits(**{**EXAMPLES.__dict__, "max_file_bytes": 100})
    for source in (p, d):
        with pytest.raises(DataError, match="bytes, over the limit of 100"):
            load_rows(source, small_file)


def test_without_datasets_the_line_says_how_to_install_or_convert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, d = parquet(tmp_path), saved(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    for source, what, convert in (
        (p, "a Parquet file", "load_dataset('parquet'"),
        (d, "a datasets save_to_disk directory", "load_from_disk(PATH)"),
    ):
        with pytest.raises(DataError, match=f"is {what}; reading it needs the datasets") as err:
            load_rows(source)
        assert "pip install 'twinrun[datasets]'" in (err.value.hint or "")
        assert convert in (err.value.hint or "")


def test_jsonl_never_imports_datasets() -> None:
    """`datasets` costs about 2 s to import: only a Parquet or save_to_disk source pays it."""
    import subprocess

    code = (
        "import sys\n"
        "from twinrun.data.examples import load_rows, shipped_examples\n"
        "load_rows(shipped_examples('sft.jsonl'))\n"
        "assert 'datasets' not in sys.modules and 'pyarrow' not in sys.modules\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
