"""`--log-completions N`: what a GRPO run's model said, as transcripts a person can read.

Each optimizer step appends, to `completions.jsonl` in the run directory, one JSON line for each
of the step's first N fresh rollouts (global rollout order: prompt group after group, sample k
within a group) — the rollouts the update trains on, not replayed ones:

    {"step": 3, "example": 5, "k": 0, "reward": 1.0, "advantage": 0.5,
     "prompt": "<|im_start|>user\\n...", "completion": "...<|im_end|>",
     "turns": [{"said": "...<tool_call>...</tool_call>"},
               {"observation": [{"role": "tool", ...}], "said": "..."}]}

`prompt` and every `said` are the token ids decoded with their special tokens (what the model
saw and wrote, `<tool_call>` markup included); a tool environment's `turns` give each model turn
and, from the second on, the messages the environment answered with before it (tool replies);
a single-turn environment's rollout has no `turns`. Nothing in a line depends on the time or
the machine, so two runs of one command write the same bytes. Only the first process of a
torchrun launch writes (every process holds every rollout). A resumed run keeps the lines of
the steps before its checkpoint (`train.driver.truncate_logs`). The update reads nothing of it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from twinrun.core.fileio import write_failed
from twinrun.core.ledger import note_written
from twinrun.train.outputs.run_dir import COMPLETIONS

__all__ = ["COMPLETIONS", "TranscriptLog", "transcript"]


class Rollout(Protocol):
    """What a transcript reads of a rollout (`train.recipes.grpo.Rollout`)."""

    step: int
    example: int
    k: int
    reward: float
    advantage: float
    prompt_ids: list[int]
    completion: list[int]
    model_mask: list[int] | None
    turns: list[dict[str, Any]] | None


def transcript(tok: Any, r: Rollout) -> dict[str, Any]:
    """One rollout as its transcript line's object."""
    record: dict[str, Any] = {
        "step": r.step,
        "example": r.example,
        "k": r.k,
        "reward": r.reward,
        "advantage": r.advantage,
        "prompt": tok.decode(r.prompt_ids, skip_special=False),
        "completion": tok.decode(r.completion, skip_special=False),
    }
    if r.model_mask is not None and r.turns:  # a tool environment's episode
        turns = []
        for i, turn in enumerate(r.turns):
            entry: dict[str, Any] = {}
            if i:
                entry["observation"] = json.loads(turn["observation"])
            entry["said"] = tok.decode(turn["sampled"], skip_special=False)
            turns.append(entry)
        record["turns"] = turns
    return record


class TranscriptLog:
    """Appends each step's first `limit` rollouts to `path` (flushed at every step)."""

    def __init__(self, path: Path, limit: int, tok: Any) -> None:
        self.path, self.limit, self.tok = path, limit, tok

    def write(self, rollouts: Sequence[Rollout]) -> None:
        lines = [
            json.dumps(transcript(self.tok, r), ensure_ascii=False, allow_nan=False) + "\n"
            for r in rollouts[: self.limit]
        ]
        try:
            note_written(self.path)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("".join(lines))
        except OSError as exc:
            raise write_failed(self.path, exc) from exc
