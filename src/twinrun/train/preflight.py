"""What a training run reads and writes, checked before torch loads.

`preflight(run)` runs the cheap checks of `train.session.open_session` early, in its order and
with its own functions, so a path mistake costs no torch, transformers or PEFT import (seconds
on a small machine): the output directory (not when resuming), the model directory and its
`config.json`, and that each examples file, evaluation examples file and corpus file exists as
a file (a `datasets` directory as a directory), and that an `--init-adapter`'s weights are a
readable safetensors file of float32 tensors (its header: `train.init_adapter.check_init_header`).
The session checks them all
again — the files may change in between — and everything that needs a tokenizer or a model.
"""

from __future__ import annotations

from pathlib import Path

from twinrun.config.resolved import ValidRun
from twinrun.core import reading
from twinrun.model.loading import check_model_dir, read_model_config
from twinrun.train.init_adapter import check_init_header
from twinrun.train.outputs import check_output_dir, config_inputs


def _readable(path: str, what: str, hint: str, missing: str | None = None) -> None:
    if Path(path).is_dir():  # a `datasets` save_to_disk directory: its reader says the rest
        return
    reading.open_regular(path, what, hint=hint, missing=missing).close()


def preflight(run: ValidRun) -> None:
    """OutputError, ModelError or DataError — the line the session would give — for the first
    path of `run` that cannot be used."""
    cfg = run.config
    if not cfg.resume:
        check_output_dir(run.output, cfg.overwrite, config_inputs(cfg))
    check_model_dir(Path(run.model))
    read_model_config(run.model)
    if cfg.examples is not None:
        _readable(cfg.examples, "examples file", "check the --examples path")
    if cfg.eval_examples is not None:
        _readable(cfg.eval_examples, "examples file", "check the --eval-examples path")
    for corpus in cfg.corpus or []:
        _readable(
            corpus,
            "corpus file",
            "check the --corpus paths",
            f"corpus file {corpus} does not exist",
        )
    if cfg.init_adapter is not None:
        check_init_header(cfg.init_adapter)
