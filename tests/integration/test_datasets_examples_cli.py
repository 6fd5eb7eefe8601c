"""`tune sft` on the same rows as JSONL, as a Parquet file and as a `save_to_disk` directory
(made here with `datasets`): the same adapter bytes and metrics, each sidecar recording the SHA256
of what it read; and a DatasetDict given whole is one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli
from twinrun.data.examples import examples_sha256

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, sft_examples: Path) -> dict[str, Path]:
    """The 16 shipped rows three ways; the JSONL mixes prompt/completion and messages rows."""
    root = tmp_path_factory.mktemp("datasets_sources")
    rows = [json.loads(line) for line in sft_examples.read_text().splitlines()]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    table = datasets.Dataset.from_dict({k: [r.get(k) for r in rows] for k in keys})
    table.to_parquet(str(root / "sft.parquet"))
    table.save_to_disk(str(root / "sft_saved"))
    return {"jsonl": sft_examples, "parquet": root / "sft.parquet", "saved": root / "sft_saved"}


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sources: dict[str, Path]
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("datasets_runs")
    out = {}
    for name, examples in sources.items():
        assert run_cli(sft_args(toy_model_dir, examples, root / name, 1)) == 0
        out[name] = root / name
    return out


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


@pytest.mark.parametrize("name", ["parquet", "saved"])
def test_same_rows_same_bytes_whatever_the_format(runs: dict[str, Path], name: str) -> None:
    a, b = runs["jsonl"], runs[name]
    adapter = "adapter_model.safetensors"
    assert (a / adapter).read_bytes() == (b / adapter).read_bytes()
    assert metrics(a) == metrics(b)
    assert len(metrics(b)) == 4


@pytest.mark.parametrize("name", ["jsonl", "parquet", "saved"])
def test_the_sidecar_records_the_sha256_of_what_was_read(
    runs: dict[str, Path], sources: dict[str, Path], name: str
) -> None:
    side = json.loads((runs[name] / "twinrun.json").read_text())
    assert side["data"]["sha256"] == examples_sha256(sources[name])
    assert len({examples_sha256(p) for p in sources.values()}) == 3


def test_a_dataset_dict_is_one_line_and_nothing_is_written(
    tmp_path: Path, toy_model_dir: Path, sources: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    whole = tmp_path / "dd"
    one = datasets.load_from_disk(str(sources["saved"]))
    datasets.DatasetDict({"train": one, "test": one}).save_to_disk(str(whole))
    out = tmp_path / "run"
    assert run_cli(sft_args(toy_model_dir, whole, out, 1)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds several splits (train, test)" in err[0], err
    assert f"--examples {whole / 'train'}" in err[0]
    assert not out.exists()
