"""What every training command does around its step loop: validate everything before writing
anything, establish strict mode before any model exists, load the checkpoint and apply LoRA, and
at the end write the adapter, metrics and sidecar atomically."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinrun.config.resolved import (
    Evaluation,
    Examples,
    TextWindows,
    ValidRun,
)
from twinrun.config.run import shaping_numbers
from twinrun.config.trl_defaults import defaults_record
from twinrun.core.digest import sha256_file
from twinrun.core.fileio import atomic_write_json, atomic_write_jsonl
from twinrun.core.lock import acquire, release
from twinrun.core.progress import Progress
from twinrun.core.redact import redact
from twinrun.train.outputs.init_adapter import check_init_weights
from twinrun.train.outputs.resume_check import check_resume, run_inputs
from twinrun.train.outputs.run_dir import (
    adopt_run_dir,
    begin_output_dir,
    check_output_dir,
    sidecar,
)
from twinrun.train.parallel import distributed
from twinrun.train.setup.preflight import check_run_schedule
from twinrun.train.setup.run_data import RawData
from twinrun.train.step.faults import Faults, parse_faults

if TYPE_CHECKING:
    import torch

    from twinrun.data.examples import EncodedRow
    from twinrun.model.build import CausalLM
    from twinrun.model.prelude import Prelude
    from twinrun.model.shard_digests import BaseDigests
    from twinrun.model.tokens import CheckpointTokenizer
    from twinrun.train.step.loop import Params


@dataclass
class ModelSession:
    """What an objective's forwards use of a run: the validated run, tokenizer and model, and the
    objective's head (a training `Session`, or what replay builds without any data)."""

    run: ValidRun  # validated once the process knows its device; never changed after
    tok: CheckpointTokenizer
    model: CausalLM
    head: torch.nn.Linear | None  # the objective's own trainable module (`objective_head`)


def save_run_adapter(s: ModelSession, folder: Path) -> None:
    """The LoRA adapter of `s`'s model, in PEFT's format, into `folder` (a training run's, a
    replay's)."""
    from twinrun.model.lora import save_adapter

    run = s.run
    save_adapter(
        s.model, folder, base_model_path=run.model, rank=run.lora_rank, alpha=run.lora_alpha,
        dropout=run.build.lora_dropout or 0.0,
    )  # fmt: skip


@dataclass
class Session(ModelSession):
    """A training run's session: the model and what the run read, checked and recorded."""

    out: Path
    params: Params
    provenance: dict[str, Any]
    runtime: dict[str, Any]
    model_sha256: str
    data_sha256: str
    faults: Faults
    max_length: int  # tokens per row at most: --max-length, else the model's positions
    eval_rows: list[EncodedRow] = field(default_factory=list)  # --eval-examples, encoded, limited
    eval_sha256: str | None = None
    progress: Progress | None = None
    started: float = field(default_factory=time.perf_counter)
    lock: Path | None = None  # the output directory's lock, released by finish_session

    def save_adapter(self, folder: Path) -> None:
        """The run's LoRA adapter, in PEFT's format, into `folder`."""
        save_run_adapter(self, folder)

    def shaping(self) -> dict[str, Any]:
        """Every number that shaped the run, with the values twinrun resolved recorded."""
        return shaping_numbers(
            self.run,
            resolved={"lora_targets": self.lora_targets, "max_length": self.max_length},
        )

    def close(self) -> None:
        """Release the output directory's lock (finish_session does; call it when a run stops
        early inside a longer-lived process — a CLI process releases it at exit anyway)."""
        if self.lock is not None:
            release(self.lock)
            self.lock = None
        from twinrun.core.ledger import untrack

        untrack(self.out)

    @property
    def lora_targets(self) -> list[str]:
        """The module names the run's LoRA layers wrap, as resolved for this model."""
        from twinrun.model.lora import adapter_targets

        return adapter_targets(self.model)


def open_session(given: ValidRun, raw: RawData) -> Opening:
    """A checked run's set-up over its data (what the input checks, `preflight.CHECKS`, read):
    the output directory locked for the whole session (by the process that writes it: rank 0
    under torchrun), the model's files opened, a base that cannot fit refused and a resume
    checked against the inputs — nothing is written. The caller encodes the data with the
    opening's tokenizer and builds the session from it (`Opening.session`); it closes the
    opening when anything fails before."""
    # joins torchrun's process group, if any; rank 0 reports, the others only compute
    device = distributed.setup(given.backend.device)
    quiet = given.switches.quiet or not distributed.is_root()
    run = given.with_switches(device=device, quiet=quiet)
    faults = parse_faults(run.switches.inject, run.objective)
    # the second writer stops here; under torchrun only rank 0 writes, so only it locks
    lock = acquire(run.output) if distributed.is_root() else None
    try:
        return _open_locked(run, raw, faults, lock)
    except BaseException:
        if lock is not None:
            release(lock)
        raise


def _open_locked(run: ValidRun, raw: RawData, faults: Faults, lock: Path | None) -> Opening:
    """The model's files opened (tokenizer, config), the refusal of a base that cannot fit, and
    the resume checked against the run's inputs: a resume with other inputs is refused before
    they are tokenized (a changed tokenizer would warn about rows first) and before any file is
    touched."""
    backend = run.backend
    from twinrun.model.prelude import open_model

    p = open_model(
        run.model, strict=backend.strict, threads=backend.threads, device=backend.device,
        cpu_kernels=backend.cpu_kernels, adapter=run.build.init_adapter,
    )  # fmt: skip
    check_base_fits(run)
    out = Path(run.output)
    base, outline = None, None
    if run.backend.shard_base:  # rank 0 hashes every byte; each process what it reads
        from twinrun.model.shard_digests import base_digests, outline_sha256

        size = distributed.world().size
        base = distributed.from_root(lambda: base_digests(run.model, size), "hashing the model")
        outline = outline_sha256(run.model)
    inputs = run_inputs(run, raw.sha256, raw.eval_sha256, base.sha256 if base else None)
    if run.switches.resume and check_resume(out, inputs) == 0:
        # killed before its first checkpoint: start again from step 0 (a fresh run)
        run = run.with_switches(resume=False, overwrite=True)
        # its partial logs go; anything foreign stops
        check_output_dir(out, run.switches.overwrite)
    max_length = p.max_length(run.build.max_length)
    return Opening(run, p, faults, lock, raw, inputs, max_length, base, outline)


@dataclass
class Opening:
    """A run whose inputs are checked and read, its output locked (by rank 0), its model's files
    opened: what the recipe encodes its data with (`tok`, `max_length`) before the session is
    built."""

    run: ValidRun  # as it goes on (a resume killed before its first checkpoint starts again)
    prelude: Prelude
    faults: Faults
    lock: Path | None
    raw: RawData  # what the input checks read (the evaluation rows with it)
    inputs: dict[str, Any]  # the run's inputs record (train/outputs/resume_check.py `run_inputs`)
    max_length: int
    base: BaseDigests | None = None  # `--shard-base`: rank 0's pass (model/shard_digests.py)
    base_outline: str | None = None  # `--shard-base`: this process's digest of the model's outline

    @property
    def tok(self) -> CheckpointTokenizer:
        return self.prelude.tok

    def close(self) -> None:
        """Release the output directory's lock (when anything fails before the session)."""
        if self.lock is not None:
            release(self.lock)
            self.lock = None

    def session(self, encoded: Sequence[Any]) -> Session:
        """The session over the recipe's `encoded` data (rows, pairs, token ids): the schedule
        over its steps checked, the evaluation rows encoded, the model built, every process's
        settings and inputs agreed, the base sharded, then the run directory begun."""
        run = check_run_schedule(self.run, len(encoded))  # and --warmup-ratio's steps made
        eval_rows = encode_eval_rows(run, self.raw, self.tok, self.max_length)
        backend, switches, out = run.backend, run.switches, Path(run.output)
        from twinrun.core.determinism import runtime_versions
        from twinrun.train.parallel.sharding import bound_allocator

        # before the base is built: a sharded base's gather buffers and blockwise attention's
        # block temporaries, once freed, go back to the system (the long-row peaks halve; same
        # bytes)
        bounded = backend.shard_base or run.build.attention == "blockwise"
        allocator = bound_allocator() if bounded else {}
        model, params = _build_model(run, self.prelude)
        head = objective_head(run, model)
        params = [*params, *head_params(head)]  # the head trains with the adapter
        from twinrun.train.parallel.agreement import agreement_record

        # every process has the same settings and inputs (or every process stops), then rank 0
        # writes
        distributed.agree(
            "waiting for every process to check its inputs",
            agreement_record(run, self.inputs, self.base_outline),
        )
        sharding: dict[str, int] = {}
        if backend.shard_base:  # after the agreement: every process shards, or none does
            from twinrun.train.parallel.sharding import shard_base

            sharding = shard_base(model, params, backend.device, self.base)
        if not switches.resume and distributed.is_root():  # the list of files, the inputs record
            begin_output_dir(out, switches.overwrite, self.inputs)
        elif distributed.is_root():
            adopt_run_dir(out)  # a resume goes on listing what it writes
        session = Session(
            run=run,
            out=out,
            tok=self.tok,
            model=model,
            head=head,
            params=params,
            provenance=self.prelude.provenance,
            runtime=runtime_versions() | distributed.runtime_record() | sharding | allocator,
            model_sha256=self.inputs["model_sha256"],
            data_sha256=self.raw.sha256,
            faults=self.faults,
            max_length=self.max_length,
            lock=self.lock,
            eval_rows=eval_rows,
            eval_sha256=self.raw.eval_sha256,
        )
        self.lock = None  # the session holds it now (finish_session releases it)
        return session


def check_base_fits(run: ValidRun) -> None:
    """The memory refusal (`model.shards.check_fits`), from the weights' headers alone, before a
    byte of the base is read: the model's SHA256 comes after it, and reads every byte."""
    from twinrun.model.build import PRECISIONS
    from twinrun.model.shards import check_fits

    world = distributed.world().size if run.backend.shard_base else 1
    check_fits(run.model, PRECISIONS[run.precision], world)


def _build_model(run: ValidRun, p: Prelude) -> tuple[CausalLM, Params]:
    """The model with fresh LoRA factors (or the `--init-adapter`, its files and shape checked
    first) and its trainable parameters, their data in one buffer (`twinrun.core.tiles`)."""
    from twinrun.core.tiles import tile_parameters
    from twinrun.model.build import FreshLora
    from twinrun.model.lora import lora_parameters

    build, backend = run.build, run.backend
    loading = Progress(1, "", quiet=run.switches.quiet or not distributed.is_root())
    loading.note(f"{run.objective}: loading {run.model} ...")  # a large model takes minutes
    fresh = FreshLora(run.lora_rank, run.lora_alpha, run.seed, build.lora_targets)
    if build.init_adapter is not None:  # its weights finite, before the model loads (minutes);
        check_init_weights(build.init_adapter)  # its files, config and rank: the preflight
    model = p.build(
        precision=run.precision, seed=run.seed, attention=build.attention,
        lora=None if build.init_adapter is not None else fresh,
        batch_invariant=backend.batch_invariant,
        gradient_checkpointing=backend.gradient_checkpointing,
        shard_over=distributed.world().size if backend.shard_base else None,
    )  # fmt: skip
    params = lora_parameters(model)
    tile_parameters([p for _, p in params])
    return model, params


def objective_head(run: ValidRun, model: CausalLM) -> torch.nn.Linear | None:
    """The objective's own trainable module beyond the adapter, fresh from the run's seed on its
    device: the reward head where the objective's record has `head`, else None. Training and
    replay both build it here (replay then loads a captured step's bytes into it)."""
    from twinrun.objectives.registry import objective

    if not objective(run.objective).head:
        return None
    from twinrun.model.reward_head import new_reward_head

    return new_reward_head(model.hidden_size, run.seed).to(run.backend.device)


def head_params(head: torch.nn.Linear | None) -> Params:
    """The head's trainable parameter by its name in captures and checkpoints (none without a
    head)."""
    if head is None:
        return []
    import torch

    from twinrun.capture.state import HEAD_PARAM

    assert isinstance(head.weight, torch.nn.Parameter)  # typed as a Tensor by torch
    return [(HEAD_PARAM, head.weight)]


def encode_eval_rows(
    run: ValidRun, raw: RawData, tok: CheckpointTokenizer, max_length: int
) -> list[EncodedRow]:
    """The evaluation rows the checks read (SFT rows, the run's chat template and
    `--messages-loss`; a text run's plain), encoded."""
    if raw.eval is None:
        return []
    from twinrun.data.examples import encode_sft_rows

    all_tokens = run.build.messages_loss == "all"  # evaluated as the run trains its rows
    return encode_sft_rows(tok, raw.eval.rows, raw.eval.templated, max_length, all_tokens)


def finish_session(
    s: Session,
    metrics: list[dict[str, Any]],
    summary: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the adapter, metrics.jsonl and the sidecar (last: it marks a finished run). In a
    data-parallel run rank 0 writes them and the others return an empty record."""
    from twinrun.train.parallel import distributed

    if not distributed.is_root():
        return {}
    s.save_adapter(s.out)
    if s.run.switches.stop_after is not None:  # the steps run, not the steps planned
        summary = summary | {"steps": len(metrics), "planned_steps": summary.get("steps")}
    atomic_write_jsonl(s.out / "metrics.jsonl", metrics)
    adapter_sha = sha256_file(s.out / "adapter_model.safetensors")
    record = sidecar(
        train=s.shaping(),
        model_sha256=s.model_sha256,
        data_sha256=s.data_sha256,
        adapter_sha256=adapter_sha,
        determinism=s.provenance,
        runtime=s.runtime,
        metrics=summary | {"wall_s": time.perf_counter() - s.started},
        extra={"inputs": redact(inputs_of(s.run))}
        | ({"eval": {"sha256": s.eval_sha256, "examples": len(s.eval_rows)}} if s.eval_rows else {})
        | ({"defaults": taken} if (taken := defaults_record(s.run)) else {})
        | (extra or {}),
    )
    atomic_write_json(s.out / "twinrun.json", record)
    s.close()
    return record


def inputs_of(run: ValidRun) -> dict[str, Any]:
    """The input paths a sidecar names (the corpus files of a text run, in order; the evaluation
    examples when given) — what `twinrun reproduce` reads them from."""
    paths: dict[str, Any] = {"model": run.model}
    if run.has(Examples):
        paths["examples"] = run.record(Examples).examples
    else:
        paths["corpus"] = list(run.record(TextWindows).corpus)
    if run.has(Evaluation):
        paths["eval_examples"] = run.record(Evaluation).eval_examples
    return paths
