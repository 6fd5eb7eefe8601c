"""Optimizer-batch capture inside a running trainer, a hook at the optimizer boundary.

`capture_hook(session, total_steps)` serves any objective. At a captured step K:

1. before the step's forwards, the torch generator states are taken (what replay restores);
2. at the optimizer boundary — after advantage normalisation, clipping and the token cap, the
   gradients computed, the optimizer not yet stepped — the step's `OptimizerBatch` is written as
   the payload, and the manifest is committed last. Neither parameters nor AdamW state have
   changed since the step began, so this is also when a step inside a longer run
   (`capture_steps`) saves the state it starts from (`optimizer_batch_step_K.state/`);
3. the optimizer steps as usual (the source run still updates); then the adapter after the
   step is hashed (and, for `capture_steps`, saved to `optimizer_batch_step_K.final/`).

The step's metrics row gains the replay vocabulary: both digests, the manifest and initial /
final adapter SHA256, the skipped flags (all false: the source ran every stage), and the same
timing and memory fields a replay's row has (train/hooks/timing.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinrun.capture import manifest as mf
from twinrun.capture.digests import effective_rows_sha256, logical_sha256, padding_fraction
from twinrun.capture.payload import BatchArrays, encode, validate
from twinrun.capture.state import HEAD_PARAM, adapter_bytes, head_bytes, optimizer_bytes
from twinrun.capture.store import check_free, new_dir, write_new
from twinrun.core.digest import sha256_bytes, sha256_file, sha256_json
from twinrun.core.errors import ConfigError, ContractError
from twinrun.core.fileio import atomic_write_json
from twinrun.core.rng import capture_torch_rng, float_bits
from twinrun.train.hooks.timing import step_timing_fields
from twinrun.train.step.loop import Hook, Phase, StepOutcome, StepView

if TYPE_CHECKING:
    from twinrun.train.setup.session import Session

SKIPPED = ("dataset", "environment", "rollout", "sampling")


@dataclass
class CaptureHook(Hook):
    # at the boundary after the finite check (and the loop's spike rerun)
    points = {"before_step": Phase.RECORD, "at_boundary": Phase.RECORD, "after_step": Phase.RECORD}

    s: Session
    steps: set[int]
    within_run: bool  # capture_steps: pin the AdamW state and adapter the step starts from
    rng_before: dict[int, dict[str, Any]] = field(default_factory=dict)

    def before_step(self, view: StepView) -> None:
        if view.step in self.steps:
            self.rng_before[view.step] = capture_torch_rng()

    def at_boundary(self, view: StepView) -> None:
        if view.step in self.steps:
            self.capture(view, view.outcome)

    def after_step(self, view: StepView, row: dict[str, Any]) -> None:
        if view.step in self.steps:
            self.after(view.step, row)
            row.update(step_timing_fields(view, row, self.s.run.backend.device))

    def files(self, step: int) -> list[Path]:
        out = self.s.out
        names = [mf.payload_name(step), mf.manifest_name(step)]
        if self.within_run:
            names += [mf.state_dir_name(step), mf.final_dir_name(step)]
        return [out / n for n in names]

    def capture(self, view: StepView, outcome: StepOutcome) -> None:
        s, run, step = self.s, self.s.run, view.step
        if outcome.batch is None:
            raise ContractError(f"{run.objective} step {step} did not describe its optimizer batch")
        check_free(self.files(step))
        arrays = BatchArrays.from_batch(outcome.batch)
        validate(arrays)
        rng = self.rng_before.pop(step, None) or capture_torch_rng()
        payload = encode(arrays, rng, s.run.seed)
        logical = logical_sha256(arrays)
        effective = effective_rows_sha256(arrays, s.tok.pad_id)
        initial = self.initial_state(view)
        lr = float(view.optimizer.param_groups[0]["lr"])
        from twinrun.config.contract import optimizer_contract
        from twinrun.config.toml import RunExtras, settings_tree
        from twinrun.core.determinism import runtime_versions

        contract = optimizer_contract(run, run.objective, s.model_sha256, s.lora_targets)
        tree = settings_tree(run.objective, run, RunExtras(), run.value("steps"))
        manifest = {
            "format": mf.FORMAT,
            "objective": run.objective,
            "step": step,
            "schedule": {"total_steps": view.total_steps, "lr": lr, "lr_bits": float_bits(lr)},
            "payload": {
                "file": mf.payload_name(step),
                "sha256": sha256_bytes(payload),
                "bytes": len(payload),
            },
            "logical_batch_sha256": logical,
            "effective_rows_sha256": effective,
            "rows": arrays.rows,
            "tokens": int(len(arrays.tokens)),
            "forwards": int(len(arrays.forward_sizes)),
            "initial_state": initial,
            "config": {"sha256": sha256_json(tree), "resolved": tree},
            "optimizer_contract": {"sha256": sha256_json(contract), "values": contract},
            "rng": {"cpu": True, "cuda_devices": len(rng.get("cuda", []))},
            "runtime": runtime_versions(),
        }
        write_new(s.out / mf.payload_name(step), payload)
        data = mf.dumps(manifest)
        write_new(s.out / mf.manifest_name(step), data)  # last: the commit marker
        outcome.metrics.update(
            {
                "optimizer/logical_batch_sha256": logical,
                "optimizer/effective_rows_sha256": effective,
                "optimizer_batch/manifest_sha256": sha256_bytes(data),
                "optimizer_batch/initial_adapter_sha256": initial["adapter"]["sha256"],
                **{f"optimizer_batch/{name}_skipped": False for name in SKIPPED},
            }
        )
        outcome.metrics.setdefault("padding_fraction", padding_fraction(arrays))

    def initial_state(self, view: StepView) -> dict[str, Any]:
        """Pins of the state the step starts from (written first when inside a run)."""
        s, run, step = self.s, self.s.run, view.step
        head = dict(s.params).get(HEAD_PARAM)
        if not self.within_run:
            from twinrun.capture.state import read_trainer_state

            assert run.build.init_adapter is not None  # a capture outside a run starts from one
            adapter_dir = Path(run.build.init_adapter)
            state = read_trainer_state(adapter_dir)
            pins: dict[str, Any] = {
                "resume_step": state["step"],
                **{
                    key: {"file": name, "sha256": sha256_file(adapter_dir / name)}
                    for key, name in mf.STATE_FILES.items()
                    if key in mf.REQUIRED_STATE
                },
                "optimizer": None,
                "reward_head": None,
            }
            if head is not None:  # a fresh head from stream(seed, "reward_head")
                pins["reward_head"] = {"from": "seed", "sha256": sha256_bytes(head_bytes(head))}
            return pins
        folder = new_dir(s.out / mf.state_dir_name(step))
        s.save_adapter(folder)
        files = {"optimizer": optimizer_bytes(list(view.params), view.optimizer)}
        if head is not None:
            files["reward_head"] = head_bytes(head)
        pins = {"resume_step": step - 1, "dir": folder.name, "reward_head": None}
        for key, data in files.items():
            write_new(folder / mf.STATE_FILES[key], data)
            pins[key] = {"file": mf.STATE_FILES[key], "sha256": sha256_bytes(data)}
        name = mf.STATE_FILES["adapter"]
        pins["adapter"] = {"file": name, "sha256": sha256_file(folder / name)}
        from twinrun.capture.state import STATE_FORMAT, TRAINER_STATE

        atomic_write_json(
            folder / TRAINER_STATE,
            {
                "format": STATE_FORMAT,
                "step": step - 1,
                "seed": run.seed,
                "lora_rank": run.lora_rank,
                "lora_alpha": run.lora_alpha,
                "captured_as": mf.stem(step),
            },
        )
        for key in mf.REQUIRED_STATE:  # the replay reads these too: pin every one
            name = mf.STATE_FILES[key]
            pins[key] = {"file": name, "sha256": sha256_file(folder / name)}
        return pins

    def after(self, step: int, row: dict[str, Any]) -> None:
        s = self.s
        data = adapter_bytes(s.model)
        if self.within_run:
            folder = new_dir(s.out / mf.final_dir_name(step))
            s.save_adapter(folder)
            head = dict(s.params).get(HEAD_PARAM)
            if head is not None:
                write_new(folder / mf.STATE_FILES["reward_head"], head_bytes(head))
        row["optimizer_batch/final_adapter_sha256"] = sha256_bytes(data)


def capture_hook(s: Session, total_steps: int) -> CaptureHook:
    """Capture the configured steps of this run (`capture_steps`, or step 0 for a v1 capture)."""
    capture_steps = s.run.switches.capture_steps
    steps = set(capture_steps or [0])
    late = sorted(k for k in steps if k >= total_steps)
    if late:
        raise ConfigError(
            f"optimizer_batch.capture_steps {late} are past the run's {total_steps} steps",
            "capture steps that the run performs",
        )
    return CaptureHook(s, steps, within_run=capture_steps is not None)
