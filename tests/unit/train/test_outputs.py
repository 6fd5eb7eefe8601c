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
from twinrun.core.ledger import LEDGER, note_written, read_listed, track, untrack
from twinrun.core.owned import remove, survey
from twinrun.train.outputs.checkpoint import checkpoint_dir
from twinrun.train.outputs.run_dir import (
    INPUTS,
    INPUTS_FORMAT,
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


def a_run(root: Path, listed: bool = True) -> Path:
    """A directory laid out as a killed or finished twinrun run (every kind of entry), each
    entry listed as the writers list it — before it is made (`listed=False`: no list)."""
    root.mkdir(parents=True)
    if listed:
        track(root)

    def made(path: Path) -> Path:
        note_written(path)
        return path

    made(root / INPUTS).write_text(json.dumps(INPUTS_RECORD))
    for name in ("metrics.jsonl", "diag.jsonl", "trace.jsonl", "adapter_model.safetensors",
                 "adapter_config.json", "resolved_config.json", "diff.png"):  # fmt: skip
        made(root / name).write_bytes(b"x")
    (root / ".metrics.jsonl.k2j4x_9q.tmp").write_bytes(b"x")  # a killed rewrite of a listed file
    step = made(checkpoint_dir(root, 1))
    step.mkdir(parents=True)
    (step / "state.json").write_text("{}")
    made(checkpoint_dir(root, 2))  # listed, then killed while in its temporary folder
    torn = root / "checkpoints" / ".tmp-step-000002-abcd1234"
    torn.mkdir()
    (torn / "state.safetensors").write_bytes(b"half")
    made(root / "final" / "adapter_model.safetensors").parent.mkdir()
    (root / "final" / "adapter_model.safetensors").write_bytes(b"y")
    state = made(root / mf.state_dir_name(3))
    state.mkdir()
    (state / "optimizer.safetensors").write_bytes(b"z")
    made(root / mf.payload_name(3)).write_bytes(b"p")
    untrack(root)
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
    assert sorted(p.name for p in run.iterdir()) == [LEDGER, INPUTS]  # the list first, then it
    assert json.loads((run / INPUTS).read_text()) == INPUTS_RECORD
    assert read_listed(run) == {INPUTS}


def test_a_marker_proves_nothing_the_list_decides(tmp_path: Path) -> None:
    """A directory holding only names twinrun writes, and even twinrun's own sidecar, is not
    cleared without the list of what twinrun wrote there (a user's copy of a run's files)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    (run / SIDECAR).write_text(json.dumps({"format": SIDECAR_FORMAT}))
    (run / INPUTS).write_text(json.dumps(INPUTS_RECORD))
    before = snapshot(run)
    with pytest.raises(OutputError, match=f"has no {LEDGER} of twinrun's"):
        check_output_dir(run, overwrite=True)
    assert snapshot(run) == before
    track(run, adopt=["metrics.jsonl", SIDECAR, INPUTS])  # what a resume of such a run does
    untrack(run)
    clear_run_dir(run)
    assert list(run.iterdir()) == []


def test_a_run_killed_while_it_began_its_list_is_cleared(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / LEDGER).write_bytes(b'{"form')  # its first line cut short
    clear_run_dir(run)
    assert list(run.iterdir()) == []


@pytest.mark.parametrize(
    "ledger_text", [None, "", '{"format": "someone.else.v1"}\n', "not json\n", "[1]\n",
                    '{"format": "twinrun.files.v1"}\n{"path": "../up"}\n'],
)  # fmt: skip
def test_twinrun_names_without_the_list_are_refused(
    tmp_path: Path, ledger_text: str | None
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "checkpoints").mkdir()
    if ledger_text is not None:
        (run / LEDGER).write_text(ledger_text)
    before = snapshot(run)
    refused = f"(has no {LEDGER} of twinrun's|holds checkpoints, .*not in its {LEDGER})"
    with pytest.raises(OutputError, match=refused):
        check_output_dir(run, overwrite=True)
    with pytest.raises(OutputError, match=refused):
        begin_output_dir(run, True, INPUTS_RECORD)
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "name", ["trace.jsonl.bak", "completions.jsonl", "checkpoints/step-000007", "curves.png"]
)
def test_a_twinrun_name_the_list_does_not_hold_is_refused(tmp_path: Path, name: str) -> None:
    run = a_run(tmp_path / "run")
    if name.startswith("checkpoints"):
        (run / name).mkdir()
    else:
        (run / name).write_text("the user's")
    before = snapshot(run)
    with pytest.raises(OutputError, match="which twinrun did not write") as err:
        check_output_dir(run, overwrite=True)
    if name != "trace.jsonl.bak":  # a name twinrun never writes is refused for its name
        assert f"holds {name}, which twinrun did not write (not in its {LEDGER})" in str(err.value)
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
    assert sorted(p.name for p in (tmp_path / "fresh" / "run").iterdir()) == [LEDGER, INPUTS]


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


def test_a_list_line_a_kill_cut_short_is_mended_by_the_next_entry(tmp_path: Path) -> None:
    """Killed while it listed an entry (before the entry was made): the next process's first
    entry starts on a line of its own, and the list still reads (the torn line named nothing
    that exists)."""
    run = tmp_path / "run"
    run.mkdir()
    track(run)
    note_written(run / "metrics.jsonl")
    untrack(run)
    with open(run / LEDGER, "ab") as fh:
        fh.write(b'{"path": "diag.js')  # the kill
    track(run)
    note_written(run / "trace.jsonl")
    untrack(run)
    assert (run / LEDGER).read_bytes().count(b"\n") == 4  # the torn line ended, then the entry
    assert read_listed(run) == {"metrics.jsonl", "trace.jsonl"}
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "trace.jsonl").write_text("{}\n")
    clear_run_dir(run)
    assert list(run.iterdir()) == []
