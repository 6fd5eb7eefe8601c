"""`--overwrite` only ever removes what twinrun wrote: a directory holding anything else survives
byte for byte (the command exits 2 with one line naming the foreign file, before any model is
loaded); a real twinrun run directory — finished, or killed mid-run before its sidecar — is
overwritten into exactly what a fresh run writes; a symlink inside is never followed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.toy_runs import OBJECTIVES, run_args, write_examples
from twinrun.cli.main import run_cli
from twinrun.core.owned import survey
from twinrun.train.outputs.run_dir import run_layout

RUN_FLAGS = ("--diag", "--checkpoint-every", "1", "--trace-step", "0")


@pytest.fixture(scope="module")
def example_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_examples(tmp_path_factory.mktemp("examples"))


@pytest.fixture(scope="module")
def examples(example_files: dict[str, Path]) -> Path:
    return example_files["sft"]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, examples: Path) -> Path:
    """A fresh run into a new directory: what an overwritten one must equal."""
    out = tmp_path_factory.mktemp("fresh") / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, out, *RUN_FLAGS)) == 0
    return out


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root`, links not followed: a file's bytes, a link's target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = (
            f"-> {p.readlink()}" if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
        )
    return out


def same_as_fresh(run: Path, fresh: Path) -> None:
    """The same entries, and the same bytes wherever a run's bytes are pinned (the sidecar,
    metrics and checkpoint state.json hold wall-clock times — and so does checksums.json, the
    SHA256 of state.json; the metrics' other fields are compared)."""
    assert sorted(snapshot(run)) == sorted(snapshot(fresh))
    timed = ("twinrun.json", "metrics.jsonl", "state.json", "checksums.json")
    for rel, data in snapshot(fresh).items():
        if Path(rel).name not in timed and data != "dir":
            assert (run / rel).read_bytes() == data, rel
    assert untimed_metrics(run) == untimed_metrics(fresh)


def untimed_metrics(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.endswith("_s")} for row in rows]


def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a model was built before the output was checked")

    monkeypatch.setattr("twinrun.model.build.build_model", refuse)


def test_a_directory_twinrun_did_not_write_survives(
    tmp_path: Path,
    toy_model_dir: Path,
    examples: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "project"
    (out / "src").mkdir(parents=True)
    (out / "src" / "train.py").write_text("print('my code')\n")
    (out / "notes.txt").write_text("my notes\n")
    (out / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    before = snapshot(out)
    no_model(monkeypatch)
    capsys.readouterr()
    rc = run_cli(run_args("sft", toy_model_dir, examples, out, "--overwrite"))
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("twinrun: error: --overwrite refused:") and "\n" not in err, err
    assert "holds notes.txt, which twinrun did not write" in err, err
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]  # no lock left either


def test_a_previous_run_is_overwritten_into_a_fresh_one(
    tmp_path: Path, toy_model_dir: Path, examples: Path, fresh: Path
) -> None:
    out = tmp_path / "run"
    other = run_args("sft", toy_model_dir, examples, out, *RUN_FLAGS, "--epochs", "2")
    assert run_cli(other) == 0  # another run: more steps, more checkpoints
    assert run_cli(["plot", str(out), "--output", str(out / "curves.png")]) == 0  # beside it
    assert (out / "checkpoints" / "step-000003").is_dir()  # the fresh run has only 1
    assert run_cli(run_args("sft", toy_model_dir, examples, out, *RUN_FLAGS, "--overwrite")) == 0
    same_as_fresh(out, fresh)


def test_a_twinrun_name_twinrun_did_not_write_is_kept(
    tmp_path: Path, toy_model_dir: Path, examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file of the user's that bears a name twinrun writes (a diff picture made elsewhere, a
    metrics file): --overwrite goes by the list of what the run wrote, not by names."""
    out = tmp_path / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, out, *RUN_FLAGS)) == 0
    (out / "diff.png").write_bytes(b"\x89PNG the user's own picture")
    before = snapshot(out)
    capsys.readouterr()
    rc = run_cli(run_args("sft", toy_model_dir, examples, out, *RUN_FLAGS, "--overwrite"))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err, err
    assert "holds diff.png, which twinrun did not write (not in its twinrun.files.jsonl)" in err
    assert snapshot(out) == before


def test_a_symlink_inside_is_never_followed(
    tmp_path: Path,
    toy_model_dir: Path,
    examples: Path,
    fresh: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.safetensors").write_bytes(b"weights I keep elsewhere")
    out = tmp_path / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, out, "--diag")) == 0
    (out / "final").symlink_to(outside)  # a twinrun name, but a link
    before, kept = snapshot(out), snapshot(outside)
    no_model(monkeypatch)
    capsys.readouterr()
    assert run_cli(run_args("sft", toy_model_dir, examples, out, "--overwrite")) == 2
    err = capsys.readouterr().err
    assert "holds final, which twinrun did not write (a symbolic link" in err, err
    assert snapshot(out) == before and snapshot(outside) == kept


def test_an_output_that_is_a_symlink_is_refused(
    tmp_path: Path,
    toy_model_dir: Path,
    examples: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "notes.txt").write_text("mine\n")
    (tmp_path / "link").symlink_to(real)
    no_model(monkeypatch)
    capsys.readouterr()
    link = tmp_path / "link"
    assert run_cli(run_args("sft", toy_model_dir, examples, link, "--overwrite")) == 2
    assert f"--output {link} is a symbolic link" in capsys.readouterr().err
    assert snapshot(real) == {"notes.txt": b"mine\n"}


def test_a_run_killed_before_its_sidecar_is_overwritable(
    tmp_path: Path, toy_model_dir: Path, examples: Path, fresh: Path
) -> None:
    out = tmp_path / "killed"
    args = run_args("sft", toy_model_dir, examples, out, *RUN_FLAGS)
    env = os.environ | {"TWINRUN_CRASH_AT": "checkpoint-mid-write:1"}
    proc = subprocess.run([sys.executable, "-m", "twinrun", *args], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    names = {p.name for p in out.iterdir()}
    assert "twinrun.inputs.json" in names and "twinrun.json" not in names  # marker, no sidecar
    assert any(p.name.startswith(".tmp-step-000001") for p in (out / "checkpoints").iterdir())
    assert run_cli([*args, "--overwrite"]) == 0
    same_as_fresh(out, fresh)


@pytest.mark.parametrize("objective", [o for o in OBJECTIVES if o != "sft"])
def test_every_objective_writes_only_declared_names(
    tmp_path: Path, toy_model_dir: Path, example_files: dict[str, Path], objective: str
) -> None:
    out = tmp_path / objective
    flags = ("--diag", "--checkpoint-every", "1")
    assert run_cli(run_args(objective, toy_model_dir, example_files[objective], out, *flags)) == 0
    found = survey(out, run_layout())
    assert found.foreign is None, (found.foreign, found.why)
    assert run_cli(run_args(objective, toy_model_dir, example_files[objective], out,
                            *flags, "--overwrite")) == 0  # fmt: skip
