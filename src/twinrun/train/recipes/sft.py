"""`twinrun tune sft`: LoRA supervised fine-tuning with completion-only loss (objectives/sft.py),
shuffled per epoch by `stream(seed, "shuffle", epoch)`, AdamW, warmup then cosine to zero."""

from __future__ import annotations

import random
from typing import Any

import torch

from twinrun.config.run import RunConfig
from twinrun.core.progress import Progress
from twinrun.data.batching import StepPlan, pad_rows, padding_fraction, plan_steps
from twinrun.data.examples import EncodedRow, encode_sft_rows
from twinrun.data.prefetch import Prefetcher
from twinrun.objectives.sft import completion_nll
from twinrun.train.batch import OptimizerBatch
from twinrun.train.driver import drive
from twinrun.train.loop import Loop, StepOutcome, make_optimizer
from twinrun.train.session import Session, finish_session, open_session


def train_sft(cfg: RunConfig) -> dict[str, Any]:
    """Run SFT end to end; returns the sidecar record."""
    cfg.objective = "sft"
    session, rows = open_session(
        cfg, lambda tok, raw, max_len: encode_sft_rows(tok, raw, cfg.chat_template == "on", max_len)
    )
    plans = plan_steps(len(rows), cfg.epochs, cfg.batch_size, cfg.accumulation, cfg.seed)
    loop = make_loop(session, len(plans))

    def prepare(step: int) -> Prepared:
        forwards = step_forwards(session, len(rows), plans[step])
        batches = [[rows[i] for i in fw] for fw in forwards]
        return forwards, batches, [pad_rows(b, session.tok.pad_id) for b in batches]

    ahead = Prefetcher(prepare, range(len(plans)), cfg.prefetch)
    try:
        drive(
            session,
            loop,
            len(plans),
            lambda step: lambda: sft_step(session, plans[step], ahead.get(step)),
        )
    finally:
        ahead.close()
    last = loop.metrics[-1]
    return finish_session(
        session,
        loop.metrics,
        {"final_loss": last["loss"], "steps": len(plans), "spikes": loop.spikes},
    )


def make_loop(s: Session, total_steps: int) -> Loop:
    cfg = s.cfg
    recorder = None
    if cfg.resume:
        from twinrun.train.driver import resume_point, truncate_logs

        truncate_logs(s.out, resume_point(s.out))
    if cfg.diag:
        from twinrun.diag.recorder import DiagRecorder

        recorder = DiagRecorder(s.out / "diag.jsonl", append=cfg.resume)
    loop = Loop(
        params=s.params,
        optimizer=make_optimizer(
            s.params, cfg.learning_rate, cfg.adam_betas, cfg.adam_eps, cfg.weight_decay
        ),
        base_lr=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        total_steps=total_steps,
        recorder=recorder,
        progress=Progress(total_steps, f"{cfg.objective} step", quiet=cfg.quiet),
        trace_step=cfg.trace_step,
        spike_factor=cfg.spike_factor,
        spike_window=cfg.spike_window,
        faults=s.faults,
        trace_model=s.model,
        trace_path=s.out / "trace.jsonl",
    )
    if cfg.capture:  # optimizer-batch capture (DESIGN §5) wraps the loop
        from twinrun.train.hooks.capture import attach_capture

        attach_capture(s, loop)
    return loop


def step_forwards(s: Session, n: int, plan: StepPlan) -> tuple[tuple[int, ...], ...]:
    """The forwards of a step; with `--inject sampler@K` step K's indices are drawn unseeded."""
    if s.faults.at("sampler", plan.step):
        unseeded = random.SystemRandom()
        return tuple(tuple(unseeded.randrange(n) for _ in fw) for fw in plan.forwards)
    return plan.forwards


def sft_step_fn(s: Session, plan: StepPlan, ahead: Prefetcher[Any]) -> Any:
    """The step function of `plan`: its batch is taken from the prefetcher once, here, so a
    spike rerun of the step trains on the same batch."""
    prepared = ahead.get(plan.step)
    return lambda: sft_step(s, plan, prepared)


Padded = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Prepared = tuple[tuple[tuple[int, ...], ...], list[list[EncodedRow]], list[Padded]]


def sft_step(s: Session, plan: StepPlan, prepared: Prepared) -> StepOutcome:
    forwards, batches, padded = prepared
    if s.faults.at("rng", plan.step):
        torch.rand(1)  # the planted stray draw: shifts the torch CPU generator
    outcome = sft_update(s, batches, plan.step, padded)
    if s.cfg.diag:
        indices = torch.tensor([i for fw in forwards for i in fw])
        outcome.leaves = {"batch.sample_indices": indices, **outcome.leaves}
    outcome.metrics["epoch"] = plan.epoch
    return outcome


def sft_update(
    s: Session, forwards: list[list[EncodedRow]], step: int, padded: list[Padded] | None = None
) -> StepOutcome:
    """Forwards and backwards of one step over these rows (also what replay runs); `padded`
    are the rows already padded (by the prefetcher), else they are padded here."""
    reorder = s.faults.at("reduction", step)
    device = s.cfg.device
    total = sum(r.targets for fw in forwards for r in fw)
    loss_sum = torch.zeros((), dtype=torch.float64)
    tokens, logits_parts, pad = [], [], []
    if padded is None:
        padded = [pad_rows(batch, s.tok.pad_id) for batch in forwards]
    for batch, tensors in zip(forwards, padded, strict=True):
        ids, attn, mask = (t.to(device) for t in tensors)
        with s.autocast():
            logits = s.model(ids, attn)
        sums, _ = completion_nll(logits, ids, mask, batch_invariant=s.cfg.batch_invariant)
        if reorder:  # the planted reduction fault: per-row backwards, last row first
            for b in reversed(range(len(batch))):
                (sums[b] / total).backward(retain_graph=True)
        else:
            (sums.sum() / total).backward()
        loss_sum += sums.detach().double().sum().cpu()
        if s.cfg.diag:
            tokens.append(ids.cpu())
            logits_parts.append(logits.detach().float().cpu())
        pad.append(padding_fraction(batch))
    loss = loss_sum / total
    leaves: dict[str, Any] = {}
    if s.cfg.diag:
        leaves = {"batch.tokens": tokens, "forward.logits": logits_parts, "loss": loss.reshape(1)}
    flat = [r for fw in forwards for r in fw]
    return StepOutcome(
        loss=float(loss),
        tokens=total,
        rows=len(flat),
        leaves=leaves,
        metrics={"padding_fraction": sum(pad) / len(pad)},
        batch=OptimizerBatch(
            objective="sft",
            step=step,
            rows=[list(r.input_ids) for r in flat],
            loss_masks=[list(r.loss_mask) for r in flat],
            forward_sizes=[len(fw) for fw in forwards],
            denominator=total,
        ),
    )
