"""Run directories: `--overwrite` removes exactly what twinrun writes (train.outputs, core.owned)
and refuses — naming the first foreign entry, changing nothing — a directory with anything else."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from twinrun.capture import manifest as mf
from twinrun.core.errors import OutputError
from twinrun.core.owned import remove, survey
from twinrun.train.checkpoint import checkpoint_dir
from twinrun.train.outputs import (
    INPUTS,
    INPUTS_FORMAT,
    REPLAY_INPUTS_FORMAT,
    SIDECAR,
    SIDECAR_FORMAT,
    begin_output_dir,
    check_output_dir,
    clear_run_dir,
    run_layout,
)

INPUTS_RECORD = {"format": INPUTS_FORMAT, "train": {"seed": 1}}


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root` (links not followed): a file's bytes, a link's target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"-> {p.readlink()}"
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = "dir"
    return out


def a_run(root: Path, marker: str = INPUTS) -> Path:
    """A directory laid out as a killed or finished twinrun run (every kind of entry)."""
    root.mkdir(parents=True)
    record = INPUTS_RECORD if marker == INPUTS else {"format": SIDECAR_FORMAT}
    (root / marker).write_text(json.dumps(record))
    for name in ("metrics.jsonl", "diag.jsonl", "trace.jsonl", "adapter_model.safetensors",
                 "adapter_config.json", "resolved_config.json", "diff.png",
                 ".metrics.jsonl.k2j4x_9q.tmp"):  # fmt: skip
        (root / name).write_bytes(b"x")
    step = root / "checkpoints" / "step-000001"
    step.mkdir(parents=True)
    (step / "state.json").write_text("{}")
    torn = root / "checkpoints" / ".tmp-step-000002-abcd1234"
    torn.mkdir()
    (torn / "state.safetensors").write_bytes(b"half")
    (root / "final").mkdir()
    (root / "final" / "adapter_model.safetensors").write_bytes(b"y")
    state = root / mf.state_dir_name(3)
    state.mkdir()
    (state / "optimizer.safetensors").write_bytes(b"z")
    (root / mf.payload_name(3)).write_bytes(b"p")
    return root


def test_every_name_the_writers_make_is_declared(tmp_path: Path) -> None:
    layout = run_layout()
    run = tmp_path / "run"
    for step in (0, 7, 1_234_567):  # past six digits too
        for name in (mf.payload_name(step), mf.manifest_name(step)):
            (run / name).parent.mkdir(parents=True, exist_ok=True)
            (run / name).write_bytes(b"")
        for folder in (mf.state_dir_name(step), mf.final_dir_name(step)):
            (run / folder).mkdir()
            (run / folder / "adapter_model.safetensors").write_bytes(b"")
        ckpt = checkpoint_dir(run, step)
        ckpt.mkdir(parents=True)
        (ckpt / "state.json").write_text("{}")
    for name in mf.STATE_FILES.values():
        (run / mf.state_dir_name(0) / name).write_bytes(b"")
    found = survey(run, layout)
    assert found.foreign is None, (found.foreign, found.why)
    assert len(found.entries) == len(list(run.rglob("*")))


def test_a_twinrun_run_is_cleared_exactly(tmp_path: Path) -> None:
    run = a_run(tmp_path / "run")
    assert check_output_dir(run, overwrite=True) == run
    entries = survey(run, run_layout()).entries
    assert entries.index(run / "checkpoints" / "step-000001" / "state.json") < entries.index(
        run / "checkpoints" / "step-000001"
    ), "deepest first"
    begin_output_dir(run, True, INPUTS_RECORD)
    assert [p.name for p in run.iterdir()] == [INPUTS]  # written first, the rest gone
    assert json.loads((run / INPUTS).read_text()) == INPUTS_RECORD


@pytest.mark.parametrize("marker", [INPUTS, SIDECAR])
def test_either_marker_makes_it_twinrun_s(tmp_path: Path, marker: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    record = {"format": INPUTS_FORMAT if marker == INPUTS else SIDECAR_FORMAT}
    (run / marker).write_text(json.dumps(record))
    clear_run_dir(run)
    assert list(run.iterdir()) == []


def test_a_replay_s_marker_counts(tmp_path: Path) -> None:
    run = tmp_path / "replay"
    run.mkdir()
    (run / INPUTS).write_text(json.dumps({"format": REPLAY_INPUTS_FORMAT}))
    (run / "final").mkdir()
    clear_run_dir(run)
    assert list(run.iterdir()) == []


def test_only_a_killed_write_of_the_marker_counts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / f".{INPUTS}.ab12cd34.tmp").write_bytes(b'{"form')
    clear_run_dir(run)
    assert list(run.iterdir()) == []


@pytest.mark.parametrize(
    "marker_text", [None, "{}", '{"format": "someone.else.v1"}', "not json", "[1]"]
)
def test_twinrun_names_without_the_marker_are_refused(tmp_path: Path, marker_text: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "checkpoints").mkdir()
    if marker_text is not None:
        (run / SIDECAR).write_text(marker_text)
    before = snapshot(run)
    with pytest.raises(OutputError, match="does not look like a twinrun run directory"):
        check_output_dir(run, overwrite=True)
    with pytest.raises(OutputError, match="does not look like a twinrun run directory"):
        begin_output_dir(run, True, INPUTS_RECORD)
    assert snapshot(run) == before


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda r: (r / "notes.txt").write_text("mine"), "notes.txt"),
        (lambda r: (r / "src").mkdir(), "src"),
        (lambda r: (r / "checkpoints" / "step-000001" / "notes.txt").write_text("m"),
         "checkpoints/step-000001/notes.txt"),
        (lambda r: (r / "final" / "model.py").write_text("m"), "final/model.py"),
        (lambda r: (r / ".notes.txt.ab12cd34.tmp").write_text("m"), ".notes.txt.ab12cd34.tmp"),
        (lambda r: (r / "checkpoints" / "step-000009").write_text("m"),
         "checkpoints/step-000009"),  # a file where twinrun writes a folder
        (lambda r: (r / "metrics.jsonl").unlink() or (r / "metrics.jsonl").mkdir(),
         "metrics.jsonl"),  # a folder where twinrun writes a file
    ],
)  # fmt: skip
def test_a_foreign_entry_is_named_and_nothing_changes(
    tmp_path: Path, make: Callable[[Path], object], named: str
) -> None:
    run = a_run(tmp_path / "run")
    make(run)
    before = snapshot(run)
    with pytest.raises(OutputError) as err:
        check_output_dir(run, overwrite=True)
    line = err.value.one_line()
    assert f"holds {named}, which twinrun did not write" in line and "\n" not in line
    with pytest.raises(OutputError, match="which twinrun did not write"):
        begin_output_dir(run, True, INPUTS_RECORD)
    assert snapshot(run) == before


def test_the_first_foreign_entry_in_sorted_order_is_named(tmp_path: Path) -> None:
    run = a_run(tmp_path / "run")
    (run / "src").mkdir()
    (run / "src" / "train.py").write_text("print(1)\n")
    (run / "notes.txt").write_text("mine\n")
    with pytest.raises(OutputError, match=r"holds notes\.txt,"):
        check_output_dir(run, overwrite=True)


@pytest.mark.parametrize("name", ["link", "checkpoints", "diag.jsonl"])
def test_a_symlink_inside_is_refused_and_never_followed(tmp_path: Path, name: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    run = a_run(tmp_path / "run")
    target = outside if name != "diag.jsonl" else outside / "precious.txt"
    if (run / name).is_dir():
        shutil.rmtree(run / name)
    elif (run / name).exists():
        (run / name).unlink()
    (run / name).symlink_to(target)
    before, kept = snapshot(run), snapshot(outside)
    with pytest.raises(OutputError, match=rf"holds {name}, .*symbolic link"):
        begin_output_dir(run, True, INPUTS_RECORD)
    assert snapshot(run) == before and snapshot(outside) == kept


def test_an_output_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = a_run(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    before = snapshot(real)
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="is a symbolic link"):
            check_output_dir(link, overwrite)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputError, match="is a symbolic link"):
        check_output_dir(dangling, False)
    assert snapshot(real) == before


def test_without_overwrite_a_non_empty_directory_is_refused(tmp_path: Path) -> None:
    run = a_run(tmp_path / "run")
    with pytest.raises(OutputError, match="exists and is not empty"):
        check_output_dir(run, overwrite=False)
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", overwrite=False)
    begin_output_dir(tmp_path / "fresh" / "run", False, INPUTS_RECORD)
    assert [p.name for p in (tmp_path / "fresh" / "run").iterdir()] == [INPUTS]


def test_an_entry_that_appears_after_the_survey_stays(tmp_path: Path) -> None:
    run = a_run(tmp_path / "run")
    entries = survey(run, run_layout()).entries
    (run / "final" / "late.txt").write_text("arrived late")
    with pytest.raises(OutputError, match="changed while being cleared"):
        remove(entries)
    assert (run / "final" / "late.txt").read_text() == "arrived late"


def test_the_trackers_folders_are_never_cleared(tmp_path: Path) -> None:
    """--report-to writes tensorboard/, wandb/ and mlruns/ with the trackers' own contents (an
    offline wandb run not yet synced): --overwrite refuses a run directory holding one, naming
    it, and removes nothing — a link there is not followed either."""
    run = a_run(tmp_path / "run")
    deep = run / "wandb" / "offline-run-1" / "files"
    deep.mkdir(parents=True)
    (deep / "wandb-summary.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    (run / "wandb" / "latest-run").symlink_to(outside)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for tracker in ("tensorboard", "mlruns"):
        (run / tracker).mkdir()
        with pytest.raises(OutputError, match=rf"holds {tracker}, .*tracker's logs"):
            begin_output_dir(run, True, INPUTS_RECORD)
        (run / tracker).rmdir()
    with pytest.raises(OutputError, match=r"holds wandb, .*perhaps not yet synced"):
        check_output_dir(run, overwrite=True)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert (deep / "wandb-summary.json").read_text() == "{}"
    assert (outside / "precious.txt").read_text() == "keep me"
