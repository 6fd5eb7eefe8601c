"""Op-trace files beside a golden file: `DIR/optrace-<fingerprint>.json` holds every torch op of
the golden suite's first SFT step (`twinrun.golden.op_trace`) as one machine computed it.

    {"format": "twinrun.optrace.v1", "fingerprint": {...}, "written_on": {...},
     "entries": [[op, input_shapes, dtype, digest, site], ...]}

When the golden file's bytes differ on another machine, `check_trace` runs the same step there
and names the first op whose output moved and the line of code that called it — the op whose
kernel is not yet portable. `write_trace` writes the file atomically (refusing to replace one
without `overwrite`)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from twinrun.core import reading
from twinrun.core.errors import DataError
from twinrun.core.fileio import atomic_write_text
from twinrun.golden.fingerprint import fingerprint, slug, written_on
from twinrun.golden.op_trace import FORMAT, OpMismatch, compare_op_traces


def trace_path(folder: Path, fp: dict[str, Any]) -> Path:
    return folder / f"optrace-{slug(fp)}.json"


def traced_step(device: str = "cpu") -> list[list[Any]]:
    """The ops of the suite's SFT run cut to its first optimizer step (its first two rows)."""
    from twinrun.golden.op_trace import trace_callable
    from twinrun.golden.suite import common, run_settings, write_inputs
    from twinrun.model.toy import write_toy_checkpoint
    from twinrun.objectives.registry import OBJECTIVES
    from twinrun.train.recipes import train

    with tempfile.TemporaryDirectory(prefix="twinrun-optrace-") as tmp:
        root = Path(tmp)
        model = root / "toy"
        write_toy_checkpoint(model, seed=0)
        data = write_inputs(root)
        rows = data["sft.jsonl"].read_text(encoding="utf-8").splitlines()[:2]
        data["sft.jsonl"].write_text("\n".join(rows) + "\n", encoding="utf-8")
        sft = OBJECTIVES[0].name  # the registry's first objective: supervised fine-tuning
        cfg = common(model, root / sft, sft, **run_settings(data, device)[sft])
        return trace_callable(lambda: train(cfg))


def _dump(doc: dict[str, Any]) -> str:
    """One entry a line, so a diff of two files reads op by op."""
    head = {k: v for k, v in doc.items() if k != "entries"}
    lines = [json.dumps(e) for e in doc["entries"]]
    return json.dumps(head)[:-1] + ', "entries": [\n' + ",\n".join(lines) + "\n]}\n"


def write_trace(folder: str | Path, device: str = "cpu", overwrite: bool = False) -> Path:
    from twinrun.golden.files import refuse_existing

    fp = fingerprint(device)
    path = trace_path(Path(folder), fp)
    refuse_existing(path, overwrite, FORMAT)
    entries = traced_step(device)
    doc = {"format": FORMAT, "fingerprint": fp, "written_on": written_on(device),
           "entries": entries}  # fmt: skip
    atomic_write_text(path, _dump(doc))
    return path


def read_trace(path: Path) -> dict[str, Any]:
    hint = "rewrite it with twinrun golden trace --write on the machine that wrote the golden file"
    text = reading.read_text(path, "op trace", 64 << 20, DataError, hint)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DataError(f"cannot read {path}: {exc}", hint) from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DataError(f"{path} is not a {FORMAT} file", hint)
    if not isinstance(doc.get("entries"), list):
        raise DataError(f"{path} has no entries list", hint)
    return doc


def check_trace(
    folder: str | Path, device: str = "cpu"
) -> tuple[Path, dict[str, Any], OpMismatch | None, int]:
    """(the file, its document, the first op that moved or None, ops compared)."""
    from twinrun.golden.files import GoldenMissing

    fp = fingerprint(device)
    path = trace_path(Path(folder), fp)
    if not path.is_file():
        raise GoldenMissing(
            f"no op trace for this platform ({path.name}) in {folder}",
            f"run `twinrun golden trace {folder} --write` on the machine that wrote the "
            "golden file and commit the file",
        )
    doc = read_trace(path)
    here = json.loads(json.dumps(traced_step(device)))  # lists, as read back from a file
    return path, doc, compare_op_traces(doc["entries"], here), len(here)
