"""`twinrun export RUN --output DIR`: the run's base model with its LoRA adapter merged in, as a
plain transformers checkpoint (no PEFT needed to load it).

The merge is PEFT's own: `PeftModel.from_pretrained(base, RUN)` then `merge_and_unload()`, so
each adapted weight becomes `W + (alpha / r) * B @ A` in float32. The base is the one the run
recorded (`twinrun.json`'s `inputs.model`, or `--model`), and it must be the same bytes: its
SHA256 (every file the loader reads) is checked against the run's record before anything is
loaded. The checkpoint is written into a temporary directory beside DIR and renamed into place,
so DIR exists whole or not at all; it holds the merged weights (safetensors), the config and
generation config, the base's tokenizer files, and `twinrun.export.json` (the run, adapter and
base SHA256s, the merged checkpoint's SHA256 and the library versions).

What the merged model computes: the same function as base + adapter up to float32 rounding (the
adapter's product is added to the weight once instead of to each output), so its greedy tokens
are twinrun's with the adapter wherever no two logits are within that rounding.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twinrun.core import interrupts
from twinrun.core.errors import ConfigError, DataError, ModelError, OutputError
from twinrun.core.fileio import atomic_write_json, fsync_dir
from twinrun.core.jsonlimits import check_sidecar, load_json_file
from twinrun.core.owned import manifest_entries, refuse_input_overlap, remove

EXPORT_RECORD = "twinrun.export.json"
EXPORT_FORMAT = "twinrun.export.v1"


def run_record(run: Path) -> dict[str, Any]:
    """The run's sidecar; a DataError when the directory is not a finished twinrun run."""
    sidecar = run / "twinrun.json"
    if not (run / "adapter_model.safetensors").is_file() or not sidecar.is_file():
        raise DataError(
            f"{run} is not a finished twinrun run (no adapter_model.safetensors and twinrun.json)",
            "name a run directory a training command wrote (or its final/ folder after a replay)",
        )
    return check_sidecar(load_json_file(sidecar, "run sidecar"), str(sidecar))


def base_of(run: Path, record: dict[str, Any], model: str | None) -> Path:
    """The base model the run trained on: `model` when given, else the recorded path; refused
    unless its SHA256 is the recorded one."""
    from twinrun.model.loading import model_sha256

    recorded = record.get("inputs", {}).get("model")
    path = Path(model) if model is not None else Path(str(recorded or ""))
    if model is None and not recorded:
        raise ConfigError(f"{run}/twinrun.json records no base model", "give --model DIR")
    want = record.get("model", {}).get("sha256")
    got = model_sha256(path)
    if want is not None and got != want:
        raise ModelError(
            f"the base model at {path} is not the one {run} trained on: Expected sha256 {want}  "
            f"Got {got}",
            "give --model the checkpoint the run recorded (the same bytes, any path)",
        )
    return path


def earlier_export(out: Path, overwrite: bool) -> list[Path]:
    """The entries of an earlier export at `out` that `--overwrite` replaces (its manifest's
    files, with the bytes it recorded, and their folders); [] when `out` does not exist.
    OutputError, before anything is read or removed, for anything else."""
    if not os.path.lexists(out):
        return []
    if not overwrite:
        raise OutputError(f"{out} already exists", "choose a new --output, or pass --overwrite")
    if not out.is_dir():
        raise OutputError(f"--output {out} exists and is not a directory", "choose a new path")
    manifest = out / EXPORT_RECORD
    doc = load_json_file(manifest, "export record") if manifest.is_file() else None
    listed = doc.get("files") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != EXPORT_FORMAT
        or not isinstance(listed, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in listed.items())
    ):
        raise OutputError(
            f"--overwrite refused: {out} is not an export twinrun wrote (no {EXPORT_RECORD} "
            "listing its files)",
            "choose a new --output; --overwrite replaces only an earlier export's own files",
        )
    return manifest_entries(out, listed, EXPORT_RECORD)


def _merge(run_dir: Path, base: Path) -> tuple[Any, Any]:
    """The base with the run's adapter merged (PEFT's `merge_and_unload`) and the base's
    tokenizer. torch, PEFT and transformers are imported here: only once every input is checked,
    so a refusal costs no import."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(
            base, dtype=torch.float32, attn_implementation="eager"
        ),
        run_dir,
    ).merge_and_unload()
    return merged, AutoTokenizer.from_pretrained(base)


def _write_export(
    merged: Any,
    tokenizer: Any,
    run_dir: Path,
    record: dict[str, Any],
    base: Path,
    tmp: Path,
    out: Path,
) -> dict[str, Any]:
    """The merged checkpoint, its tokenizer and the export record written into `tmp` (renamed
    to `out` afterwards); the record."""
    from twinrun.core.determinism import runtime_versions
    from twinrun.core.digest import sha256_file, sha256_files
    from twinrun.core.safetensors_io import library_writes
    from twinrun.model.loading import model_files

    with library_writes(out):  # a full disk names the output, not the library's temporary file
        merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    files = [p for p in model_files(tmp) if p.is_file()]
    written = sorted(p for p in tmp.rglob("*") if p.is_file())
    info = {
        "format": EXPORT_FORMAT,
        "run": str(run_dir.resolve()),
        "adapter_sha256": sha256_file(run_dir / "adapter_model.safetensors"),
        "base": str(base.resolve()),
        "base_sha256": record.get("model", {}).get("sha256"),
        "merged_sha256": sha256_files(files, tmp),
        "versions": runtime_versions(),
        # every file this export wrote: what a later --overwrite may remove, and only while it
        # still holds these bytes
        "files": {p.relative_to(tmp).as_posix(): sha256_file(p) for p in written},
    }
    atomic_write_json(tmp / EXPORT_RECORD, info)
    return info


def export_merged(run: str | os.PathLike[str], output: str | os.PathLike[str],
                  model: str | None = None, overwrite: bool = False,
                  loading: Callable[[Path], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Merge RUN's adapter into its base and write the checkpoint to `output`; returns the
    export record. `loading(base)` is called once every input is checked, before the model
    loads (a progress line)."""
    from twinrun.core.paths import output_path
    from twinrun.model.adapter_check import check_run_adapter

    run_dir = Path(run)
    record = run_record(run_dir)  # a directory that is not a finished run: said first
    out = output_path(output)  # a link, a path under a file or an unwritable place: refused
    refuse_input_overlap(out, {"run": run_dir, "base model": model})
    earlier = earlier_export(out, overwrite)  # nothing foreign goes, and nothing changed
    check_run_adapter(run_dir, record)  # the recorded, finite bytes its config describes
    base = base_of(run_dir, record, model)
    refuse_input_overlap(out, {"base model": base})
    if loading is not None:
        loading(base)
    merged, tokenizer = _merge(run_dir, base)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        info = _write_export(merged, tokenizer, run_dir, record, base, tmp, out)
        interrupts.check()  # a Ctrl-C a library's __del__ swallowed stops it here, not placed
        remove(earlier)  # the earlier export's own files, deepest first; DIR stays, empty
        os.replace(tmp, out)  # a rename over the emptied directory
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info
