"""`--resume` that cannot mix two runs into one record.

A run writes `twinrun.inputs.json` into its output directory as soon as the directory exists:
every shaping number (the sidecar's `train` section) and the SHA256 of everything else that
shapes the bytes — the files the model loader reads (`model.loading.model_files`), its tokenizer
files, the examples file and the initial
adapter. `--resume` recomputes all of them and refuses, before any file is touched, when one
differs. A run that was killed before its first checkpoint has nothing to continue from: resume
starts it again from step 0 in the same directory (its partial logs are cleared).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinrun.config.resolved import ValidRun
from twinrun.config.run import shaping_numbers
from twinrun.core.digest import sha256_dir, sha256_files
from twinrun.core.errors import ConfigError, DataError
from twinrun.model.loading import model_sha256, tokenizer_files
from twinrun.train.outputs.run_dir import CHECKPOINTS, INPUTS, INPUTS_FORMAT, STATE_JSON
from twinrun.train.outputs.run_dir import SIDECAR as FINISHED

# flags that may differ on resume: they cannot change a byte of the result
MAY_DIFFER = frozenset({"resume", "quiet", "overwrite", "prefetch", "checkpoint_every"})
RESOLVED_FROM_MODEL = frozenset({"lora_targets", "max_length"})
DIGESTS = (
    "model_sha256", "tokenizer_sha256", "data_sha256", "eval_sha256", "init_adapter_sha256",
)  # fmt: skip


def run_inputs(
    run: ValidRun,
    data_sha256: str | None,
    eval_sha256: str | None = None,
    model_digest: str | None = None,
) -> dict[str, Any]:
    """What shapes the run's bytes, as recorded and as compared on resume (`data_sha256`: the
    examples file's or the text corpus's; `eval_sha256`: the evaluation examples';
    `model_digest`: the model's SHA256 when it is computed already — a sharded base's, by rank 0,
    `model.shard_digests`)."""
    model, adapter = Path(run.model), run.build.init_adapter
    tok_files = tokenizer_files(model)
    return {
        "format": INPUTS_FORMAT,
        "train": shaping_numbers(run),
        "model_sha256": model_digest or model_sha256(model),
        "tokenizer_sha256": sha256_files(tok_files, model) if tok_files else None,
        "data_sha256": data_sha256,
        "eval_sha256": eval_sha256,
        "init_adapter_sha256": sha256_dir(adapter) if adapter else None,
    }


def read_inputs(out: Path) -> dict[str, Any] | None:
    from twinrun.core.jsonlimits import check_sidecar, load_json_file

    path = out / INPUTS
    if not path.is_file():
        return None
    record = load_json_file(path, what="the run's inputs record")
    if isinstance(record, dict) and record.get("format") == INPUTS_FORMAT:
        check_sidecar(record, str(path), "inputs record")  # its train section an object
    if not isinstance(record, dict) or record.get("format") != INPUTS_FORMAT:
        raise DataError(
            f"{path} is not a {INPUTS_FORMAT} record", "restart the run without --resume"
        )
    return record


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs, one phrase each (flag values are already redacted; digests shortened)."""
    out: list[str] = []
    rec_train, cur_train = recorded.get("train") or {}, current.get("train") or {}
    for key in sorted((set(rec_train) | set(cur_train)) - MAY_DIFFER):
        if rec_train.get(key) != cur_train.get(key):
            out.append(f"{key}: {rec_train.get(key)!r} -> {cur_train.get(key)!r}")
    for key in DIGESTS:
        a, b = recorded.get(key), current.get(key)
        if a != b:
            out.append(f"{key.removesuffix('_sha256')} sha256 {str(a)[:12]} -> {str(b)[:12]}")
    return out


def check_resume(out: Path, inputs: dict[str, Any]) -> int:
    """Steps done by the checkpoint `--resume` will continue from; 0 when the run was killed
    before its first checkpoint (the caller starts it again). ConfigError, before anything is
    written, when there is nothing to resume or anything that shapes the bytes differs."""
    check_resumable(out)
    recorded = read_inputs(out)
    ckpt = newest_checkpoint_state(out)
    if recorded is None:  # check_resumable saw it: it was removed since
        raise ConfigError(f"--resume: {out / INPUTS} was removed while it was read", "rerun")
    differ = differences(recorded, inputs)
    if ckpt is not None:  # the checkpoint's own record of the flags must agree too
        # it records values resolved from the model (LoRA targets, max length) where the flags
        # said "from the model": those are pinned by the model's SHA256 and checked again once
        # the model is built
        current = inputs.get("train") or {}
        ckpt_train = {
            k: v
            for k, v in (ckpt.get("train") or {}).items()
            if not (k in RESOLVED_FROM_MODEL and current.get(k) is None)
        }
        as_ckpt = inputs | {"train": ckpt_train}
        differ += [d for d in differences(as_ckpt, inputs) if d not in differ]
    if differ:
        raise ConfigError(
            f"--resume with inputs that differ from the recorded run ({'; '.join(differ)})",
            "resume with the flags, model and examples the run was started with, or start a "
            "new --output",
        )
    return 0 if ckpt is None else int(ckpt["steps_done"])


def check_resumable(out: Path) -> None:
    """ConfigError unless `out` holds something `--resume` can continue, by its files alone (no
    torch: the training preflight runs it before torch loads): a checkpoint, or the inputs
    record of a run killed before its first one — not a finished run without checkpoints."""
    has_inputs = (out / INPUTS).is_file()
    has_checkpoint = any((p / STATE_JSON).is_file() for p in (out / CHECKPOINTS).glob("step-*"))
    if not has_inputs and not has_checkpoint:
        raise ConfigError(
            f"--resume: {out} has no complete checkpoint and no record of a started run",
            "start the run without --resume (and with --checkpoint-every to make checkpoints)",
        )
    if not has_inputs:
        raise ConfigError(
            f"--resume: {out} has no {INPUTS}, so its model and data cannot be verified",
            "restart it with --overwrite instead of --resume",
        )
    if not has_checkpoint and (out / FINISHED).is_file():  # restarting would erase it
        raise ConfigError(
            f"--resume: {out} holds a finished run (it has {FINISHED}) and no checkpoint",
            "nothing to resume; choose a new --output, or pass --overwrite instead of --resume",
        )


def newest_checkpoint_state(out: Path) -> dict[str, Any] | None:
    """`state.json` of the newest complete checkpoint, verified and read without touching anything
    (the loader, unlike this, also clears the leftovers of a killed checkpoint write)."""
    from twinrun.train.outputs.checkpoint import read_checkpoint

    root = out / CHECKPOINTS
    done = sorted(p for p in root.glob("step-*") if (p / STATE_JSON).is_file())
    if not done:
        return None
    return read_checkpoint(done[-1]).state  # verified: "checkpoint step-N is corrupt" otherwise
