"""Run directories: refuse to clobber, clear on `--overwrite` only what twinrun wrote, then write
a run's artifacts atomically — `adapter_model.safetensors`, `adapter_config.json`,
`metrics.jsonl`, `twinrun.json`.

A run directory is twinrun's when its list of written entries says so: `twinrun.files.jsonl`
(`core.ledger`), created before anything else by `begin_output_dir` and appended to before each
file or folder is made, so a run killed at any moment lists all it wrote. `--overwrite` removes
exactly the entries that list names (each also of a name and kind `run_layout` declares) and
refuses — before any model is loaded or any file touched — a directory holding anything else.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinrun.core.errors import OutputError
from twinrun.core.ledger import LEDGER, covered, leads_to, read_listed, track
from twinrun.core.owned import Layout, refuse_input_overlap, remove, survey
from twinrun.diag.curves import CURVES_PICTURE
from twinrun.diag.report import DIFF_PICTURE

if TYPE_CHECKING:
    from twinrun.config.run import Settings

SIDECAR = "twinrun.json"
SIDECAR_FORMAT = "twinrun.run.v1"
INPUTS = "twinrun.inputs.json"  # what the run read; train.resume_check compares it on --resume
INPUTS_FORMAT = "twinrun.inputs.v1"  # a training run's inputs record
REPLAY_INPUTS_FORMAT = "twinrun.replay-inputs.v1"  # a replay's: what it verified
# a checkpoint (train.checkpoint): CHECKPOINTS/step-K/ holds STATE_JSON and STATE_TENSORS
CHECKPOINTS, STATE_JSON, STATE_TENSORS = "checkpoints", "state.json", "state.safetensors"
METRICS, DIAG, TRACE = "metrics.jsonl", "diag.jsonl", "trace.jsonl"
COMPLETIONS = "completions.jsonl"  # --log-completions (train/recipes/transcripts.py)
TRACKER_DIRS = ("tensorboard", "wandb", "mlruns")  # --report-to (train/hooks/report.py)


def _files(*names: str) -> dict[str, Layout | None]:
    return {re.escape(n): None for n in names}


@functools.cache
def run_layout() -> Layout:
    """Every name twinrun writes into a run directory (training runs, TOML runs, captures,
    replays) — the one list of what `--overwrite` may remove."""
    from twinrun.capture import manifest as mf
    from twinrun.capture.source import FINAL, FINAL_FILES, RESOLVED
    from twinrun.train.outputs.checkpoint_check import CHECKSUMS

    adapter = _files(*FINAL_FILES)  # adapter weights and config, the reward head
    checkpoint = _files(STATE_TENSORS, STATE_JSON, CHECKSUMS)
    step = r"\d{6,}"
    capture = re.escape(mf.stem(0).removesuffix("000000")) + step  # optimizer_batch_step_K
    return {
        **_files(LEDGER, SIDECAR, INPUTS, METRICS, DIAG, TRACE, COMPLETIONS, RESOLVED),
        **_files(CURVES_PICTURE, DIFF_PICTURE),
        **adapter,
        re.escape(CHECKPOINTS): {  # checkpoint.write_checkpoint: step-K, or a killed .tmp-step-K-
            rf"step-{step}": checkpoint,
            rf"\.tmp-step-{step}-[A-Za-z0-9_]+": checkpoint,
        },
        re.escape(FINAL): adapter,
        rf"{capture}\.safetensors": None,
        rf"{capture}\.manifest\.json": None,
        rf"{capture}\.state": _files(*mf.STATE_FILES.values()),
        rf"{capture}\.final": adapter,
        # not the --report-to folders (TRACKER_DIRS): their contents are the trackers' (an
        # offline W&B run not yet synced), so a directory holding one is never cleared
    }


def owned_entries(p: Path) -> list[Path]:
    """Every entry of the existing run directory `p`, deepest first — each one named by the list
    of what twinrun wrote there (`core.ledger`), and of a kind twinrun writes under that name.
    OutputError naming the first other entry, or the missing list, before anything is removed."""
    found = survey(p, run_layout())
    listed = read_listed(p)
    if found.foreign is None and listed is None:
        raise OutputError(
            f"--overwrite refused: {p} has no {LEDGER} of twinrun's listing the files it wrote "
            "(the directory was not made by this twinrun)",
            "remove it yourself if it is an old run, or choose another --output",
        )
    if found.foreign is None and listed is not None:
        for entry in found.entries:
            rel = entry.relative_to(p).as_posix()
            if not (covered(rel, listed) or (entry.is_dir() and leads_to(rel, listed))):
                found.foreign, found.why = entry, f"not in its {LEDGER}"
                break
    if found.foreign is not None:
        rel_path = found.foreign.relative_to(p)
        why = f" ({found.why})" if found.why else ""
        if rel_path.parts[0] in TRACKER_DIRS:
            why = " (a --report-to tracker's logs, perhaps not yet synced)"
        raise OutputError(
            f"--overwrite refused: {p} holds {rel_path}, which twinrun did not write{why}",
            "move it out of the directory, or choose another --output; --overwrite removes "
            "only the files a twinrun run wrote",
        )
    return found.entries


def adopt_run_dir(p: Path) -> None:
    """Go on listing what this process writes into the run directory `p` that it resumes; a
    run made before twinrun kept the list gets one naming its entries of twinrun's names."""
    from twinrun.core.owned import declared

    layout = run_layout()
    track(p, adopt=[n for n in sorted(os.listdir(p)) if declared(layout, n)])


def clear_run_dir(p: Path) -> None:
    """Empty the twinrun run directory `p` (it stays, empty): exactly the entries
    `owned_entries` names, nothing when it holds anything foreign."""
    entries = owned_entries(p) if any(p.iterdir()) else []
    # the list goes last: a clear killed half-way leaves a directory that is still known
    remove(sorted(entries, key=lambda e: e == p / LEDGER))


def check_output_dir(
    path: str | Path, overwrite: bool, inputs: dict[str, Any] | None = None
) -> Path:
    """Refuse a symbolic link, a file, an existing non-empty directory unless `overwrite` and
    it is a twinrun run directory holding nothing else, and a directory that is one of `inputs`
    (name -> path or None), lies in one or holds one; changes nothing on disk."""
    from twinrun.core.paths import output_path

    p = Path(path)
    output_path(p)  # a link (dangling too), under a file, in an unwritable directory
    refuse_input_overlap(p, inputs or {})
    if p.exists() and not p.is_dir():
        raise OutputError(f"--output {p} exists and is not a directory", "choose another path")
    if p.is_dir() and any(p.iterdir()):
        if not overwrite:
            raise OutputError(
                f"output directory {p} exists and is not empty",
                "choose a new --output, or pass --overwrite to replace it",
            )
        owned_entries(p)
    return p


def config_inputs(cfg: Settings) -> dict[str, Any]:
    """The paths a training config reads (name -> path or None): its output is none of them."""
    corpus = {f"corpus file {c}": c for c in (cfg.value("corpus") or [])}
    return {
        "model": cfg.value("model"),
        "examples": cfg.value("examples"),
        "eval examples": cfg.value("eval_examples"),
        "initial adapter": cfg.value("init_adapter"),
        **corpus,
    }


def begin_output_dir(p: Path, overwrite: bool, inputs: dict[str, Any]) -> None:
    """Create (or, with --overwrite, clear) the run directory, then write `inputs` (a record of
    INPUTS_FORMAT or REPLAY_INPUTS_FORMAT) as its first file: from then on the directory is
    known as twinrun's. Call after all validation; the directory is checked again, so nothing
    foreign is removed even if it appeared since."""
    check_output_dir(p, overwrite)
    if overwrite and p.is_dir():
        clear_run_dir(p)
    p.mkdir(parents=True, exist_ok=True)
    track(p)  # the list of what is written, before anything else is
    from twinrun.core.fileio import atomic_write_json

    atomic_write_json(p / INPUTS, inputs)


def command_line() -> list[str]:
    return (
        ["twinrun", *sys.argv[1:]]
        if sys.argv and sys.argv[0].endswith("twinrun")
        else list(sys.argv)
    )


def sidecar(
    *,
    train: dict[str, Any],
    model_sha256: str,
    data_sha256: str,
    adapter_sha256: str,
    determinism: dict[str, Any],
    runtime: dict[str, Any],
    metrics: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": SIDECAR_FORMAT,
        "train": train,
        "model": {"sha256": model_sha256},
        "data": {"sha256": data_sha256},
        "adapter": {"sha256": adapter_sha256},
        "determinism": determinism,
        "runtime": runtime,
        "metrics": metrics,
    }
    if extra:
        out.update(extra)
    return out
