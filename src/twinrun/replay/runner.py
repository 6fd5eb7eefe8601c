"""`trainer = "optimizer_replay"`: one optimizer update on a captured batch.

After every check of `capture/checks.py` has passed (in order; the first failure stops the
replay before anything is written), the replay builds the model, loads the pinned adapter (and
the AdamW state a step inside a run started from), restores the captured torch generator
states, and runs the captured step once through the same `Loop.run_step` and the same
objective update function the source ran — so on CPU the final adapter is the source's, bit for
bit. It never opens the examples file, never builds the environment and never samples.

It writes `final/` (the adapter after the update), `metrics.jsonl` (one row, in the replay
vocabulary of DESIGN §5), `resolved_config.json` (redacted) and `twinrun.json` (last).
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from twinrun.capture.checks import Verified, run_checks
from twinrun.capture.digests import effective_rows_sha256, logical_sha256, padding_fraction
from twinrun.capture.payload import BatchArrays
from twinrun.capture.state import HEAD_PARAM, load_optimizer_state
from twinrun.config.toml import TomlRun, resolved_tree
from twinrun.core.digest import sha256_file
from twinrun.core.errors import ConfigError, ContractError
from twinrun.core.fileio import atomic_write_json, atomic_write_jsonl
from twinrun.core.rng import float_bits, restore_torch_rng
from twinrun.dispatch.toml_runs import FINAL, RESOLVED
from twinrun.train.hooks.capture import SKIPPED


@dataclass
class ReplaySession:
    """What the objectives' update functions use of a Session — and nothing that reads data."""

    cfg: Any
    tok: Any
    model: Any
    faults: Any

    def autocast(self) -> Any:
        if self.cfg.precision == "bf16":
            return torch.autocast(device_type=self.cfg.device.split(":")[0], dtype=torch.bfloat16)
        return contextlib.nullcontext()


@contextlib.contextmanager
def timed_backward(totals: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent in every `Tensor.backward` call to totals["backward_s"] (the
    objectives interleave forwards and backwards, so the backward is timed where it runs)."""
    original = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            totals["backward_s"] += time.perf_counter() - t0

    torch.Tensor.backward = backward  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.backward = original  # type: ignore[method-assign]


def update_fn(objective: str, s: ReplaySession, head: Any) -> Any:
    """The objective's own update on a captured OptimizerBatch."""
    if objective == "grpo":
        from twinrun.train.recipes.grpo import rollouts_from_batch, update_on

        return lambda batch: update_on(s, rollouts_from_batch(batch), batch.step)  # type: ignore[arg-type]
    if objective == "sft":
        from twinrun.data.examples import EncodedRow
        from twinrun.train.recipes.sft import sft_update

        def sft(batch: Any) -> Any:
            rows = [
                EncodedRow(tuple(r), tuple(m))
                for r, m in zip(batch.rows, batch.loss_masks, strict=True)
            ]
            forwards, start = [], 0
            for n in batch.forward_sizes:
                forwards.append(rows[start : start + n])
                start += n
            return sft_update(s, forwards, batch.step)  # type: ignore[arg-type]

        return sft
    from twinrun.train.recipes.pairs import pair_update, pairs_from_batch

    return lambda batch: pair_update(s, pairs_from_batch(batch), batch.step, head)  # type: ignore[arg-type]


def replay(run: TomlRun) -> dict[str, Any]:
    """Verify, then perform exactly one optimizer update; returns the sidecar record."""
    _, v = run_checks(run, stop=True)
    assert v.decoded is not None
    cfg, m = run.cfg, v.manifest
    objective, step = m["objective"], m["step"]
    cfg.objective = objective
    from twinrun.core.determinism import establish, runtime_versions
    from twinrun.core.rng import seed_torch
    from twinrun.model.build import build_model
    from twinrun.model.lora import lora_parameters, read_adapter_config
    from twinrun.model.tokens import load_tokenizer
    from twinrun.train.faults import parse_faults
    from twinrun.train.loop import Loop, make_optimizer
    from twinrun.train.outputs import begin_output_dir
    from twinrun.train.schedule import lr_at

    provenance = establish(strict=cfg.strict, threads=cfg.threads, device=cfg.device)
    provenance["torch_seed"] = seed_torch(cfg.seed)  # type: ignore[arg-type]
    model_dir = Path(cfg.model)  # type: ignore[arg-type]
    tok = load_tokenizer(model_dir)
    adapter = read_adapter_config(cfg.init_adapter)  # type: ignore[arg-type]
    if adapter["r"] != cfg.lora_rank or float(adapter["lora_alpha"]) != cfg.lora_alpha:
        raise ConfigError(
            f"adapter {cfg.init_adapter} is rank {adapter['r']} alpha "
            f"{adapter['lora_alpha']}, the config says {cfg.lora_rank}/"
            f"{cfg.lora_alpha}",
            "make [model] lora_* match the adapter",
        )
    model = build_model(
        model_dir,
        precision=cfg.precision,  # type: ignore[arg-type]
        device=cfg.device,
        adapter=cfg.init_adapter,
        batch_invariant=cfg.batch_invariant,
        gradient_checkpointing=cfg.gradient_checkpointing,
    )
    params = lora_parameters(model)
    head = build_head(v, model) if objective == "reward" else None
    if head is not None:
        params = [*params, (HEAD_PARAM, head.weight)]
    optimizer = make_optimizer(
        params,
        cfg.learning_rate,
        cfg.adam_betas,
        cfg.adam_eps,  # type: ignore[arg-type]
        cfg.weight_decay,
    )
    if "optimizer" in v.state_bytes:  # the AdamW state a step inside a run started from
        load_optimizer_state(v.state_bytes["optimizer"], params, optimizer, str(cfg.init_adapter))
    total = m["schedule"]["total_steps"]
    lr = lr_at(step, cfg.learning_rate, cfg.warmup_steps, total)  # type: ignore[arg-type]
    if float_bits(lr) != m["schedule"].get("lr_bits", float_bits(float(m["schedule"]["lr"]))):
        raise ContractError(
            f"learning rate at step {step} is {lr}, the source's was {m['schedule']['lr']}",
            "the schedule numbers differ",
        )
    out = Path(cfg.output)  # type: ignore[arg-type]
    begin_output_dir(out, False)

    session = ReplaySession(cfg, tok, model, parse_faults(cfg.inject, objective))
    recorder = None
    if cfg.diag:
        from twinrun.diag.recorder import DiagRecorder

        recorder = DiagRecorder(out / "diag.jsonl")
    loop = Loop(
        params=params,
        optimizer=optimizer,
        base_lr=cfg.learning_rate,  # type: ignore[arg-type]
        warmup_steps=cfg.warmup_steps,
        total_steps=total,
        recorder=recorder,
    )  # type: ignore[arg-type]
    totals = {"backward_s": 0.0, "optimizer_s": 0.0, "update_s": 0.0}
    optimizer_step = optimizer.step

    def timed_step() -> None:
        t0 = time.perf_counter()
        optimizer_step()
        totals["optimizer_s"] = time.perf_counter() - t0

    optimizer.step = timed_step  # type: ignore[method-assign]
    batch = v.decoded.arrays.to_batch()
    update = update_fn(objective, session, head)

    def step_fn() -> Any:
        t0 = time.perf_counter()
        outcome = update(batch)
        totals["update_s"] = time.perf_counter() - t0
        return outcome

    def before_update(_: int, outcome: Any) -> None:
        used = BatchArrays.from_batch(outcome.batch)  # what this replay actually trained on
        outcome.metrics |= {
            "optimizer/logical_batch_sha256": logical_sha256(used),
            "optimizer/effective_rows_sha256": effective_rows_sha256(used, tok.pad_id),
            "padding_fraction": padding_fraction(used),
        }

    loop.before_update = before_update
    if cfg.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(cfg.device)
    restore_torch_rng(v.decoded.rng)
    with timed_backward(totals):
        row = loop.run_step(step, step_fn)
    if recorder is not None:
        recorder.close()
    final_sha = save_final(out / FINAL, model, head, cfg)
    row |= replay_metrics(v, row, totals, final_sha, model)
    atomic_write_jsonl(out / "metrics.jsonl", [row])
    atomic_write_json(out / RESOLVED, resolved_tree(run))
    return write_sidecar(v, out, row, provenance, runtime_versions(), final_sha)


def build_head(v: Verified, model: Any) -> Any:
    """The reward head the captured step started from: from the seed (a fresh run), or the
    verified bytes of the captured state."""
    from safetensors.torch import load

    from twinrun.model.reward_head import HEAD_KEY, new_reward_head

    pin = v.manifest["initial_state"]["reward_head"]
    cfg = v.run.cfg
    head = new_reward_head(model.hidden_size, cfg.seed)  # type: ignore[arg-type]
    if pin is None or pin.get("from") != "seed":
        if "reward_head" not in v.state_bytes:
            raise ContractError("the capture pins no reward head", "re-capture the step")
        with torch.no_grad():
            head.weight.copy_(load(v.state_bytes["reward_head"])[HEAD_KEY])
    return head.to(cfg.device)


def save_final(folder: Path, model: Any, head: Any, cfg: Any) -> str:
    from twinrun.model.lora import save_adapter
    from twinrun.model.reward_head import save_reward_head

    save_adapter(
        model, folder, base_model_path=str(cfg.model), rank=cfg.lora_rank, alpha=cfg.lora_alpha
    )
    if head is not None:
        save_reward_head(head, folder)
    return sha256_file(folder / "adapter_model.safetensors")


def peak_memory(device: str) -> tuple[int, str]:
    """Peak memory of this replay: CUDA's allocator peak, or the process's peak resident set
    (VmHWM: unlike ru_maxrss it is not inherited from the process that started us)."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "process_peak_rss"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_max_rss"


def replay_metrics(
    v: Verified, row: dict[str, Any], totals: dict[str, float], final_sha: str, model: Any
) -> dict[str, Any]:
    m, cfg = v.manifest, v.run.cfg
    peak, kind = peak_memory(cfg.device)
    return {
        "optimizer_batch/manifest_sha256": v.manifest_sha256,
        "optimizer_batch/expected_logical_sha256": v.run.extras.expected_logical_sha256,
        "optimizer_batch/initial_adapter_sha256": m["initial_state"]["adapter"]["sha256"],
        "optimizer_batch/final_adapter_sha256": final_sha,
        **{f"optimizer_batch/{name}_skipped": True for name in SKIPPED},
        "optimizer_batch/declared_differences": list(v.run.extras.allow_config_differences),
        "optimizer_batch/observed_differences": v.observed,
        "backend/gradient_checkpointing": bool(model.gradient_checkpointing and model.training),
        "local_train_wall_s": row["wall_s"],
        "forward_s": max(0.0, totals["update_s"] - totals["backward_s"]),
        "backward_s": totals["backward_s"],
        "optimizer_s": totals["optimizer_s"],
        "peak_memory_bytes": peak,
        "peak_memory_kind": kind,
    }


def write_sidecar(
    v: Verified,
    out: Path,
    row: dict[str, Any],
    provenance: dict[str, Any],
    runtime: dict[str, Any],
    final_sha: str,
) -> dict[str, Any]:
    from twinrun.config.run import shaping_numbers
    from twinrun.train.outputs import sidecar

    cfg = v.run.cfg
    record = sidecar(
        train=shaping_numbers(cfg) | {"trainer": "optimizer_replay"},
        model_sha256=v.source_contract.get("model.sha256", ""),
        data_sha256="",  # no data is read
        adapter_sha256=final_sha,
        determinism=provenance,
        runtime=runtime,
        metrics={"final_loss": row["loss"], "steps": 1, "wall_s": row["local_train_wall_s"]},
        extra={
            "replay": {
                "manifest_sha256": v.manifest_sha256,
                "logical_batch_sha256": v.logical,
                "step": v.manifest["step"],
                "skipped": list(SKIPPED),
            }
        },
    )
    atomic_write_json(out / "twinrun.json", record)
    return record
