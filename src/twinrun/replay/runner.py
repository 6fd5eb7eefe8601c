"""`trainer = "optimizer_replay"`: one optimizer update on a captured batch.

After every check of `capture/checks.py` has passed (in order; the first failure stops the
replay before anything is written), the replay builds the model, loads the pinned adapter (and
the AdamW state a step inside a run started from), restores the captured torch generator
states, and runs the captured step once through a loop built as training builds it
(train/driver.py `build_loop`) with the objective's own recipe (`from_batch`: its forwards on
the captured batch) — so on CPU the final adapter is the source's, bit for bit. It never opens
the examples file, never builds the environment and never samples. Its timings and digests come
from hooks (nothing is patched).

It writes `twinrun.inputs.json` (first: the manifest and batch it verified, which mark the
directory as twinrun's), `twinrun.run-id.json` (this replay's own random run id, start time
and PID: `replay/identity.py`), `final/` (the adapter after the update), `metrics.jsonl` (one
row, in the replay vocabulary of docs/capture.md), `resolved_config.json` (redacted) and
`twinrun.json` (last).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from twinrun.capture.checks import Verified, run_checks, schedule
from twinrun.capture.digests import effective_rows_sha256, logical_sha256, padding_fraction
from twinrun.capture.payload import BatchArrays
from twinrun.capture.source import FINAL, RESOLVED
from twinrun.capture.state import load_optimizer_state
from twinrun.config.resolved import ValidRun
from twinrun.config.toml import TomlRun, resolved_tree
from twinrun.core.determinism import runtime_versions
from twinrun.core.digest import sha256_file
from twinrun.core.errors import ContractError
from twinrun.core.fileio import atomic_write_json, atomic_write_jsonl
from twinrun.core.rng import restore_torch_rng
from twinrun.replay.identity import write_identity
from twinrun.train.driver import build_loop
from twinrun.train.hooks.capture import SKIPPED
from twinrun.train.hooks.timing import TimingHook, peak_memory
from twinrun.train.outputs.run_dir import REPLAY_INPUTS_FORMAT, begin_output_dir
from twinrun.train.setup.session import (
    ModelSession,
    head_params,
    objective_head,
    save_run_adapter,
)
from twinrun.train.step.loop import Hook, Loop, Params, Phase, StepView

if TYPE_CHECKING:
    from twinrun.model.build import CausalLM
    from twinrun.model.tokens import CheckpointTokenizer


class ReplayDigestHook(Hook):
    """At the boundary: the digests of what this replay actually trained on."""

    points = {"at_boundary": Phase.RECORD}

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def at_boundary(self, view: StepView) -> None:
        batch = view.outcome.batch
        assert batch is not None  # the forwards of every objective describe their batch
        used = BatchArrays.from_batch(batch)
        view.metrics.update({
            "optimizer/logical_batch_sha256": logical_sha256(used),
            "optimizer/effective_rows_sha256": effective_rows_sha256(used, self.pad_id),
            "padding_fraction": padding_fraction(used),
        })  # fmt: skip


@dataclass
class Built:
    """The model, tokenizer, trainable parameters (and reward head) of a replay."""

    tok: CheckpointTokenizer
    model: CausalLM
    params: Params
    head: torch.nn.Linear | None
    provenance: dict[str, Any]


def replay(run: TomlRun) -> dict[str, Any]:
    """Verify, then perform exactly one optimizer update; returns the sidecar record."""
    check_base_fits(run)
    _, v = run_checks(run, stop=True)
    assert v.decoded is not None
    valid = v.replay()  # the captured objective's run, as the contract check resolved it
    built = build(v)
    out = Path(valid.output)
    loop = replay_loop(v, built, out)  # nothing is written yet: a bad state stops it here
    schedule(v)  # the captured step's learning rate, recomputed: the source's bits
    begin_output_dir(out, False, replay_inputs(v))
    write_identity(out)  # this replay's own run id: what tells it from a copy
    row = replay_step(v, built, loop)
    final_sha = save_final(out / FINAL, built, valid)
    row |= replay_metrics(v, row, final_sha, built.model)
    atomic_write_jsonl(out / "metrics.jsonl", [row])
    atomic_write_json(out / RESOLVED, resolved_tree(run))
    return write_sidecar(v, out, row, built.provenance, runtime_versions(), final_sha)


def check_base_fits(run: TomlRun) -> None:
    """The memory refusal (`model.shards.check_fits`), from the weights' headers alone, before
    the checks hash every byte of the base (a missing model directory: the checks name it)."""
    from twinrun.model.build import PRECISIONS
    from twinrun.model.shards import check_fits

    model, dtype = Path(run.pins().model), PRECISIONS.get(str(run.cfg.precision))
    if model.is_dir() and dtype is not None:
        check_fits(model, dtype, 1)


def replay_inputs(v: Verified) -> dict[str, Any]:
    """The replay directory's first file (its twinrun marker): what the replay verified."""
    return {
        "format": REPLAY_INPUTS_FORMAT,
        "manifest_sha256": v.manifest_sha256,
        "logical_batch_sha256": v.logical,
        "step": v.manifest["step"],
    }


def build(v: Verified) -> Built:
    """Strict mode, then the model with the pinned adapter (and the reward head)."""
    from twinrun.model.lora import lora_parameters
    from twinrun.model.prelude import open_model

    valid = v.replay()
    backend = valid.backend
    # the adapter's rank and alpha were checked against the config by the shared check path
    p = open_model(
        valid.model, strict=backend.strict, threads=backend.threads, device=backend.device,
        cpu_kernels=backend.cpu_kernels, adapter=valid.build.init_adapter,
    )  # fmt: skip
    model = p.build(
        precision=valid.precision, seed=valid.seed, attention=valid.build.attention,
        batch_invariant=backend.batch_invariant,
        gradient_checkpointing=backend.gradient_checkpointing,
    )  # fmt: skip
    head = captured_head(v, valid, model)
    params = [*lora_parameters(model), *head_params(head)]  # as a training session's
    return Built(p.tok, model, params, head, p.provenance)


def replay_loop(v: Verified, built: Built, out: Path) -> Loop:
    """The training loop of the captured step (built as training builds it), with the hooks of
    a replay, and the AdamW state a step inside a run started from."""
    valid, m = v.replay(), v.manifest
    hooks: list[Hook] = [ReplayDigestHook(built.tok.pad_id)]
    if valid.switches.diag:
        from twinrun.diag.recorder import DiagRecorder
        from twinrun.train.hooks.diag import DiagHook

        hooks.append(DiagHook(DiagRecorder(out / "diag.jsonl")))
    hooks.append(TimingHook(valid.backend.device))
    loop = build_loop(valid, built.params, m["schedule"]["total_steps"], hooks)
    if "optimizer" in v.state_bytes:  # the AdamW state a step inside a run started from
        load_optimizer_state(
            v.state_bytes["optimizer"], built.params, loop.optimizer, v.run.pins().init_adapter
        )
    return loop


def replay_step(v: Verified, built: Built, loop: Loop) -> dict[str, Any]:
    """The captured step, once, through the training loop, from the captured generator states,
    with the objective's own recipe (`from_batch`: its forwards on the captured batch)."""
    from twinrun.train.recipes import RECIPES

    assert v.decoded is not None
    valid, m = v.replay(), v.manifest
    device = valid.backend.device
    session = ModelSession(valid, built.tok, built.model, built.head)
    batch = v.decoded.arrays.to_batch()
    recipe = RECIPES[valid.objective].from_batch(session, batch)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    restore_torch_rng(v.decoded.rng)
    try:
        return loop.run_step(m["step"], recipe, recipe.prepare(m["step"]))
    finally:
        for hook in loop.hooks:
            hook.close()


def captured_head(v: Verified, run: ValidRun, model: CausalLM) -> torch.nn.Linear | None:
    """The objective's head (built as training builds it) as the captured step started from:
    from the seed (a fresh run), or the verified bytes of the captured state."""
    from twinrun.core.safetensors_io import read_safetensors
    from twinrun.model.reward_head import HEAD_KEY

    head = objective_head(run, model)
    if head is None:
        return None
    pin = v.manifest["initial_state"]["reward_head"]
    if pin is None or pin.get("from") != "seed":
        if "reward_head" not in v.state_bytes:
            raise ContractError("the capture pins no reward head", "re-capture the step")
        with torch.no_grad():
            saved = read_safetensors(
                v.state_bytes["reward_head"], "reward head", "re-capture the step",
                where="the capture's reward head",
            ).tensors  # fmt: skip
            head.weight.copy_(saved[HEAD_KEY])
    return head


def save_final(folder: Path, built: Built, run: ValidRun) -> str:
    """The replayed adapter (and the objective's head, as training writes them) into `folder`;
    the adapter's SHA256."""
    from twinrun.train.recipes import RECIPES

    save_run_adapter(ModelSession(run, built.tok, built.model, built.head), folder)
    RECIPES[run.objective].save_head(built.head, folder)
    return sha256_file(folder / "adapter_model.safetensors")


def replay_metrics(
    v: Verified, row: dict[str, Any], final_sha: str, model: CausalLM
) -> dict[str, Any]:
    m = v.manifest
    peak, kind = peak_memory(v.replay().backend.device)
    return {
        "optimizer_batch/manifest_sha256": v.manifest_sha256,
        "optimizer_batch/expected_logical_sha256": v.run.extras.expected_logical_sha256,
        "optimizer_batch/initial_adapter_sha256": m["initial_state"]["adapter"]["sha256"],
        "optimizer_batch/final_adapter_sha256": final_sha,
        **{f"optimizer_batch/{name}_skipped": True for name in SKIPPED},
        "optimizer_batch/declared_differences": list(v.run.extras.allow_config_differences),
        "optimizer_batch/observed_differences": v.observed,
        "backend/gradient_checkpointing": bool(model.gradient_checkpointing and model.training),
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
    from twinrun.train.outputs.run_dir import sidecar

    record = sidecar(
        train=shaping_numbers(v.replay()) | {"trainer": "optimizer_replay"},
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
