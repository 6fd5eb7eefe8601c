"""`twinrun tune evaluate`: per-example completion losses in input order, with provenance.

Rows go through forwards of `batch_size` in input order (no shuffle). An example's loss is its
token-mean completion NLL; the report's `loss` is the mean over examples. With `batch_invariant`
the model runs in batch-invariant mode (`twinrun.model.invariant`) and each row's sum is taken over
its own span (objectives/sft.py): every per-example number is then bitwise what a batch of one
gives, whatever `batch_size`. Rows longer than one head chunk are scored from the hidden states
by position chunks (`model/head_chunks.py`), except with `--diag`, which records the whole logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.config.inference import EvalConfig
from twinrun.model.prelude import Prelude, open_for_inference

REPORT_FORMAT = "twinrun.infer.evaluate.v1"


def claim_outputs(cfg: EvalConfig) -> None:
    """Before the model loads: refuse a link, a directory, a path under a file, an unwritable
    place, an input, a file another program wrote — for the report and the `--diag` file."""
    from twinrun.core.owned import claim_file, json_format

    inputs = {"model": cfg.model, "adapter": cfg.adapter, "examples": cfg.examples}
    claim_file(
        str(cfg.output), cfg.overwrite, "twinrun tune evaluate", json_format(REPORT_FORMAT), inputs
    )
    if cfg.diag is not None:
        claim_file(cfg.diag, cfg.overwrite, "twinrun tune evaluate", diag_file, inputs, "--diag")


def diag_file(path: Path) -> bool:
    """`is_ours` for an earlier `--diag` file: a JSONL file whose first row is a diag row."""
    import json

    from twinrun.diag.rows import DIAG_FORMAT

    try:
        with open(path, "rb") as f:
            first = json.loads(f.readline(1 << 20) or b"null")
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and first.get("format") == DIAG_FORMAT


def run_evaluate(cfg: EvalConfig) -> dict[str, Any]:
    r = cfg.resolve()  # before torch is imported
    from twinrun.data.examples import encode_sft_rows
    from twinrun.infer.inputs import read_examples

    claim_outputs(cfg)
    p = open_for_inference(cfg)
    raw, kind = read_examples(r.examples)
    if kind == "pairs":
        from twinrun.data.pairs import encode_pairs

        pairs = encode_pairs(p.tok, raw, p.templated, p.max_length())
    else:
        rows = encode_sft_rows(p.tok, raw, p.templated, p.max_length())
    model = p.build(precision=r.precision, batch_invariant=cfg.batch_invariant)
    head = None
    if cfg.adapter is not None:
        from twinrun.model.reward_head import load_reward_head

        head = load_reward_head(cfg.adapter)
    if kind == "pairs":
        per_pair = score_pairs(model, head, pairs, p.tok.pad_id, cfg)
        report = {
            "format": REPORT_FORMAT,
            "mode": "pairwise",
            "scorer": "reward_head" if head is not None else "completion_logprob_sum",
            "loss": sum(e["loss"] for e in per_pair) / len(per_pair),
            "accuracy": sum(e["correct"] for e in per_pair) / len(per_pair),
            "examples": len(per_pair),
            "per_example": per_pair,
        }
        return write_report(cfg, report, p)
    recorder = None
    if cfg.diag:
        from twinrun.diag.recorder import DiagRecorder

        recorder = DiagRecorder(cfg.diag)
    per_example: list[dict[str, Any]] = []
    bs = cfg.batch_size
    assert bs is not None
    for batch_no, scored in enumerate(
        score_batches(
            model, rows, p.tok.pad_id, bs, cfg.device, cfg.batch_invariant, recorder is not None
        )
    ):
        per_example += scored.examples()
        if recorder is not None:
            recorder.record(batch_no, scored.leaves(), phase="eval")
    if recorder is not None:
        recorder.close()
    report = {
        "format": REPORT_FORMAT,
        "mode": "loss",
        "loss": sum(e["loss"] for e in per_example) / len(per_example),
        "tokens": sum(e["tokens"] for e in per_example),
        "examples": len(per_example),
        "per_example": per_example,
    }
    return write_report(cfg, report, p)


@dataclass
class ScoredBatch:
    """One evaluation forward: rows `start ..`, their tokens and logits (on the CPU), and each
    row's completion NLL sum and completion-token count."""

    start: int
    ids: Any
    logits: Any
    sums: Any
    counts: Any

    def examples(self) -> list[dict[str, Any]]:
        """Per row: its index, token-mean completion NLL, completion tokens."""
        out = []
        for b in range(len(self.counts)):
            n = int(self.counts[b])
            out.append({"index": self.start + b, "loss": float(self.sums[b]) / n if n else 0.0,
                        "tokens": n})  # fmt: skip
        return out

    def losses(self) -> Any:
        """Each row's token-mean NLL, float64 (the `loss` leaf of an eval row)."""
        return self.sums.double() / self.counts.clamp(min=1)

    def leaves(self) -> dict[str, Any]:
        """The eval-phase diag leaves of this forward, in dataflow order."""
        import torch

        return {
            "batch.sample_indices": torch.arange(self.start, self.start + len(self.counts)),
            "batch.tokens": self.ids,
            "forward.logits": self.logits,
            "loss": self.losses(),
        }


def score_batches(
    model: Any,
    rows: list[Any],
    pad_id: int,
    batch_size: int,
    device: str,
    invariant: bool,
    keep_logits: bool = True,
) -> Any:
    """Forwards of `batch_size` rows in input order, without gradients: one ScoredBatch each.
    Without `keep_logits` (no `--diag`) rows longer than one head chunk are scored from the
    hidden states by chunks (`model/head_chunks.py`): no [B, T, V] logits, and None in the
    batch's `logits`."""
    import torch

    from twinrun.data.batching import pad_rows
    from twinrun.model.head_chunks import chunks_head, completion_nll_by_chunks
    from twinrun.objectives.sft import completion_nll

    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            ids, attn, mask = (t.to(device) for t in pad_rows(batch, pad_id))
            if not keep_logits and chunks_head(model, ids.shape[1] - 1):
                sums, counts, _ = completion_nll_by_chunks(model, ids, attn, mask)
                yield ScoredBatch(start, ids.cpu(), None, sums.cpu(), counts.cpu())
                continue
            logits = model(ids, attn)
            sums, counts = completion_nll(logits, ids, mask, invariant)
            yield ScoredBatch(start, ids.cpu(), logits.float().cpu(), sums.cpu(), counts.cpu())


def write_report(cfg: EvalConfig, report: dict[str, Any], p: Prelude) -> dict[str, Any]:
    from twinrun.core.determinism import runtime_versions
    from twinrun.core.fileio import atomic_write_json
    from twinrun.data.examples import examples_sha256

    report = report | {
        "precision": cfg.precision,
        "chat_template": cfg.chat_template,
        "batch_size": cfg.batch_size,
        "batch_invariant": cfg.batch_invariant,
        "model_sha256": p.model_sha256(),
        "adapter_sha256": p.adapter_sha256(),
        "data_sha256": examples_sha256(str(cfg.examples)),
        "determinism": p.provenance,
        "runtime": runtime_versions(),
    }
    atomic_write_json(str(cfg.output), report)
    return report


def score_pairs(
    model: Any, head: Any, pairs: list[Any], pad_id: int, cfg: EvalConfig
) -> list[dict[str, Any]]:
    """Per pair: chosen and rejected scores (reward head, else completion log-prob sums), the
    Bradley-Terry loss -logsigmoid(c - r), and whether chosen scored higher."""
    import torch
    import torch.nn.functional as F

    from twinrun.data.batching import pad_rows
    from twinrun.model.head_chunks import chunks_head, completion_nll_by_chunks
    from twinrun.objectives.dpo import sequence_logprob

    def side(rows: list[Any]) -> torch.Tensor:
        ids, attn, mask = (t.to(cfg.device) for t in pad_rows(rows, pad_id))
        if head is not None:
            from twinrun.model.reward_head import scores

            return scores(model, head, ids, attn).double().cpu()
        if chunks_head(model, ids.shape[1] - 1):  # long rows: no [B, T, V] logits
            return (-completion_nll_by_chunks(model, ids, attn, mask)[0]).double().cpu()
        logits = model(ids, attn)
        return sequence_logprob(logits, ids, mask, cfg.batch_invariant).double().cpu()

    out: list[dict[str, Any]] = []
    bs = cfg.batch_size
    assert bs is not None
    with torch.no_grad():
        for start in range(0, len(pairs), bs):
            batch = pairs[start : start + bs]
            c = side([p.chosen for p in batch])
            r = side([p.rejected for p in batch])
            losses = -F.logsigmoid(c - r)
            for b in range(len(batch)):
                out.append({
                    "index": start + b, "loss": float(losses[b]),
                    "chosen_score": float(c[b]), "rejected_score": float(r[b]),
                    "correct": bool(c[b] > r[b]),
                })  # fmt: skip
    return out
