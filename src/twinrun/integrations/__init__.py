"""Integrations of twinrun's diagnostics with other training loops.

- `twinrun.integrations.hf.DiagCallback`: a `transformers.TrainerCallback` that writes a
  twinrun diag.jsonl (one row per optimizer step) from a Hugging Face `Trainer`, so two Trainer
  runs can be compared with `twinrun diff`.

Submodules are imported on use: importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

__all__: list[str] = []
