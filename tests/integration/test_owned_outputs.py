"""Every writer owns its output the same way: an existing output is refused without
`--overwrite`; with it only what that command wrote goes (an export's manifest, a PNG signed by
its writer, a run directory's declared names — never a tracker's logs); an output that is an
input, lies in one or holds one is refused. Each refusal is one line, exit 2, and the files it
protects survive byte for byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes): what must survive a refusal."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path) -> Path:
    out = tmp_path_factory.mktemp("owned") / "run"
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 4, "--diag")) == 0
    return out


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> str:
    capsys.readouterr()
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err, err
    return err


def test_export_overwrite_removes_only_what_its_manifest_lists(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a directory holding an empty twinrun.export.json beside a source tree and notes
    fake = tmp_path / "project"
    (fake / "src").mkdir(parents=True)
    (fake / "src" / "main.py").write_text("print('mine')\n")
    (fake / "notes.md").write_text("keep\n")
    (fake / "twinrun.export.json").write_text("{}")
    before = tree(fake)
    argv = ["export", str(run), "--output", str(fake), "--overwrite"]
    refused(capsys, argv, "is not an export twinrun wrote")
    assert tree(fake) == before

    # a real export, then a README and eval_results/ added by its user
    out = tmp_path / "merged"
    assert run_cli(["export", str(run), "--output", str(out)]) == 0
    first = tree(out)
    record = json.loads((out / "twinrun.export.json").read_text())
    assert set(record["files"]) == set(first) - {"twinrun.export.json"}
    (out / "README.md").write_text("my model card\n")
    (out / "eval_results").mkdir()
    (out / "eval_results" / "scores.json").write_text("[1]")
    mine = tree(out)
    refused(capsys, ["export", str(run), "--output", str(out), "--overwrite"],
            "which the earlier output's manifest does not list")  # fmt: skip
    assert tree(out) == mine
    (out / "README.md").unlink()
    shutil.rmtree(out / "eval_results")

    # a file the export wrote, changed since: refused, not replaced
    weights = out / "model.safetensors"
    saved = weights.read_bytes()
    weights.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
    refused(capsys, ["export", str(run), "--output", str(out), "--overwrite"], "changed since")
    weights.write_bytes(saved)

    # the export as it was written: replaced, with the same bytes
    assert run_cli(["export", str(run), "--output", str(out), "--overwrite"]) == 0
    assert tree(out) == first


def test_export_never_writes_into_or_over_its_inputs(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(run)
    refused(capsys, ["export", str(run), "--output", str(run), "--overwrite"], "is the run")
    refused(capsys, ["export", str(run), "--output", str(run / "m")], "lies inside the run")
    refused(capsys, ["export", str(run), "--output", str(run.parent), "--overwrite"], "holds")
    assert tree(run) == before and not (run / "m").exists()


@pytest.mark.parametrize("name", ["twinrun.json", "adapter_model.safetensors", "metrics.jsonl"])
def test_plot_never_replaces_a_runs_file(
    run: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(run)
    for extra in ([], ["--overwrite"]):
        refused(capsys, ["plot", str(run), "--output", str(run / name), *extra], "inside the run")
    assert tree(run) == before


def test_plot_replaces_only_its_own_png(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "photo.png"
    other.write_bytes(b"\x89PNG\r\n\x1a\n" + b"someone else's picture")
    before = other.read_bytes()
    refused(capsys, ["plot", str(run), "--output", str(other)], "exists")
    refused(capsys, ["plot", str(run), "--output", str(other), "--overwrite"], "not written by")
    assert other.read_bytes() == before
    mine = tmp_path / "curves.png"
    assert run_cli(["plot", str(run), "--output", str(mine)]) == 0
    refused(capsys, ["plot", str(run), "--output", str(mine)], "exists")
    assert run_cli(["plot", str(run), "--output", str(mine), "--overwrite"]) == 0
    # the declared picture beside a run's own files is not one of them
    assert run_cli(["plot", str(run), "--output", str(run / "curves.png")]) == 0
    (run / "curves.png").unlink()


def test_plot_draws_huge_values_and_a_dollar_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weird = tmp_path / "$\\frac{$"
    weird.mkdir()
    rows = [{"step": 0, "loss": 1e308}, {"step": 1, "loss": -1e308}, {"step": 2, "loss": 1.0},
            {"step": 3, "loss": 2.0}]  # fmt: skip
    (weird / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "weird.png"
    assert run_cli(["plot", str(weird), "--output", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_diff_report_never_replaces_an_input_or_anothers_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(run)
    sidecar = str(run / "twinrun.json")
    refused(capsys, ["diff", str(run), str(run), "--report", sidecar, "--overwrite"], "inside")
    diag = run / "diag.jsonl"
    refused(capsys, ["diff", str(diag), str(diag), "--report", str(diag)], "is the run")
    assert tree(run) == before
    other = tmp_path / "chart.png"
    other.write_bytes(b"not mine")
    refused(capsys, ["diff", str(run), str(run), "--report", str(other), "--overwrite"],
            "not written by twinrun diff")  # fmt: skip
    assert other.read_bytes() == b"not mine"
    mine = tmp_path / "d.png"
    assert run_cli(["diff", str(run), str(run), "--report", str(mine)]) == 0
    assert run_cli(["diff", str(run), str(run), "--report", str(mine), "--overwrite"]) == 0


def test_reproduce_never_writes_over_the_run_it_checks(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(run)
    for out in (run, run / "again"):
        capsys.readouterr()
        assert run_cli(["reproduce", str(run), "--output", str(out), "--overwrite"]) == 2
        err = capsys.readouterr()
        text = (err.out + err.err).strip()
        assert "the run being reproduced" in text and "REPRODUCED" not in text, text
    assert tree(run) == before


def test_training_overwrite_keeps_a_trackers_logs(
    toy_model_dir: Path, sft_examples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1)) == 0
    offline = out / "wandb" / "offline-run-20261202_000000-abc"
    offline.mkdir(parents=True)
    (offline / "run-abc.wandb").write_bytes(b"not yet synced")
    before = tree(out)
    refused(capsys, [*sft_args(toy_model_dir, sft_examples, out, 1), "--overwrite"],
            "a --report-to tracker's logs")  # fmt: skip
    assert tree(out) == before


def test_training_output_is_not_an_input(
    toy_model_dir: Path, sft_examples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data" / "sft.jsonl"
    data.parent.mkdir()
    shutil.copy(sft_examples, data)
    before = tree(data.parent)
    argv = [*sft_args(toy_model_dir, data, data.parent, 1), "--overwrite"]
    refused(capsys, argv, "holds the examples")
    assert tree(data.parent) == before


def test_extract_sidecar_is_never_its_examples(
    toy_model_dir: Path, sft_examples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "rows.json"
    data.write_bytes(sft_examples.read_bytes())
    argv = ["extract", "--model", str(toy_model_dir), "--examples", str(data), "--layer", "0",
            "--pool", "last", "--chat-template", "off", "--precision", "f32", "--batch-size",
            "2", "--threads", "1", "--output", str(tmp_path / "rows.safetensors"),
            "--overwrite"]  # fmt: skip
    refused(capsys, argv, "is the examples")
    assert data.read_bytes() == sft_examples.read_bytes()


def test_golden_overwrite_replaces_only_a_golden_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from twinrun.golden.files import golden_path
    from twinrun.golden.fingerprint import fingerprint

    target = golden_path(tmp_path, fingerprint("cpu"))
    target.write_text('{"my": "notes"}')
    refused(capsys, ["golden", "write", str(tmp_path), "--overwrite"], "not written by")
    assert target.read_text() == '{"my": "notes"}'
