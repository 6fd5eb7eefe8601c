"""The replay checks, in a fixed order (docs/capture.md), shared by `replay` and `explain`:

1. fresh output paths — a replay never writes into an existing run;
2. manifest pin — the manifest file's SHA256 against `expected_manifest_sha256`, *before* a byte
   of it is parsed (then it is parsed and its fields validated);
3. payload SHA256 — the payload file (a plain name beside the manifest) against the manifest;
4. decode and validate — every tensor name, dtype, shape and invariant of the payload;
5. logical digest — recomputed from the payload, against the manifest and
   `expected_logical_sha256`;
6. initial adapter SHA256 — `resume.from`'s adapter weight file (and AdamW state, reward head,
   when the step starts from them) against the manifest;
7. optimizer contract — the replay's contract against the source's: only differences declared
   in `allow_config_differences` (v1: `backend.options.gradient_checkpointing`), and every
   declared one present.

`run_checks(run, stop=True)` raises the first failure (replay); `stop=False` runs every check
whose inputs are trusted and marks the rest skipped (explain). No check builds a model. The
hashing runs ahead on other threads (`capture/hashing.py`: the adapter and model from the start,
the payload's decode and logical digest beside its file digest); results are taken in this order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinrun.capture import manifest as mf
from twinrun.capture.hashing import Hashes, PayloadDigests, read_hashed, read_whole
from twinrun.capture.payload import Decoded
from twinrun.config.resolved import ValidRun, replay_run
from twinrun.config.toml import TomlRun
from twinrun.core.digest import sha256_bytes, sha256_json
from twinrun.core.errors import (
    ConfigError,
    ContractError,
    DataError,
    IntegrityError,
    OutputError,
    TwinrunError,
)

NAMES = (
    "fresh output paths",
    "manifest pin",
    "payload sha256",
    "decode and validate",
    "logical digest",
    "initial adapter sha256",
    "optimizer contract",
)
NEEDS = {  # a check runs only when the checks it trusts passed
    "payload sha256": ("manifest pin",),
    "decode and validate": ("payload sha256",),
    "logical digest": ("decode and validate",),
    "initial adapter sha256": ("manifest pin",),
    "optimizer contract": ("manifest pin",),
}


@dataclass
class Check:
    name: str
    status: str  # pass | fail | skip
    detail: str = ""
    expected: str | None = None
    got: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Verified:
    """What the checks established, for the replay to use."""

    run: TomlRun
    hashes: Hashes
    manifest_path: Path | None = None
    manifest_bytes: bytes = b""
    manifest: dict[str, Any] = field(default_factory=dict)
    payload_path: Path | None = None
    payload: bytes | memoryview = b""
    payload_digests: PayloadDigests | None = None  # the decode and logical digest, under way
    decoded: Decoded | None = None
    logical: str = ""
    source_contract: dict[str, Any] = field(default_factory=dict)
    replay_contract: dict[str, Any] = field(default_factory=dict)
    observed: list[str] = field(default_factory=list)
    state_bytes: dict[str, bytes] = field(default_factory=dict)  # verified optimizer / head
    replayed: ValidRun | None = None  # the run the replay performs, once its contract holds

    def replay(self) -> ValidRun:
        """The replay's validated run; RuntimeError (a bug) before the contract check passed."""
        if self.replayed is None:
            raise RuntimeError("the replay's run is read before its optimizer contract passed")
        return self.replayed

    @property
    def manifest_sha256(self) -> str:
        return sha256_bytes(self.manifest_bytes)


def fresh_output(v: Verified) -> str:
    from twinrun.core.paths import output_path

    out = Path(v.run.pins().output)
    output_path(out, "replay output")  # under a file, on a symlink loop: one line
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(
            f"replay output {out} exists and is not empty",
            "a replay never overwrites: choose a new [logging] dir",
        )
    return f"{out} is new"


def manifest_pin(v: Verified) -> str:
    path = Path(v.run.extras.replay_path)  # type: ignore[arg-type]  # a replay config has it
    data, got = read_hashed(path, "manifest")
    pin = v.run.extras.expected_manifest_sha256
    if got != pin:
        raise IntegrityError(
            pin,  # type: ignore[arg-type]  # a replay config has it
            got,
            str(path),
            "expected_manifest_sha256 does not pin this manifest; it was not parsed",
        )
    v.manifest_path, v.manifest_bytes = path, data
    v.manifest = mf.parse(data, str(path))  # only now: the bytes are the pinned ones
    return f"sha256 {got}"


def payload_sha(v: Verified) -> str:
    assert v.manifest_path is not None
    pin = v.manifest["payload"]
    path = mf.member(v.manifest_path.parent, pin.get("file"), "payload")
    digests = PayloadDigests(read_whole(path, "payload"), str(path))
    data, got = digests.data, digests.sha256
    if got != pin["sha256"]:
        raise IntegrityError(
            pin["sha256"], got, str(path), "the payload is not the one the manifest pins"
        )
    v.payload_path, v.payload, v.payload_digests = path, data, digests
    return f"sha256 {got} ({len(data)} bytes)"


def decode_payload(v: Verified) -> str:
    assert v.payload_digests is not None
    decoded = v.payload_digests.decoded()  # decode(v.payload), done on the digests' thread
    m, a = v.manifest, decoded.arrays
    mismatch = [
        k
        for k, got in (
            ("objective", a.objective),
            ("step", a.step),
            ("rows", a.rows),
            ("tokens", len(a.tokens)),
            ("forwards", len(a.forward_sizes)),
        )
        if m.get(k) != got
    ]
    if mismatch:
        raise DataError(
            f"{v.payload_path}: payload and manifest disagree on {mismatch}", "re-capture the step"
        )
    v.decoded = decoded
    return f"{a.objective} step {a.step}: {a.rows} rows, {len(a.tokens)} tokens"


def logical(v: Verified) -> str:
    assert v.payload_digests is not None and v.decoded is not None
    got = v.payload_digests.logical()  # logical_sha256(v.decoded.arrays), on that thread
    recorded = v.manifest["logical_batch_sha256"]
    where = f"logical batch of {v.payload_path}"
    if got != recorded:
        raise IntegrityError(recorded, got, where, "the payload does not hold the manifest's batch")
    pin = v.run.extras.expected_logical_sha256
    if got != pin:
        msg = "expected_logical_sha256 does not pin this batch"
        raise IntegrityError(pin, got, where, msg)  # type: ignore[arg-type]  # a replay config has it
    v.logical = got
    return f"sha256 {got}"


def initial_adapter(v: Verified) -> str:
    from twinrun.capture.state import read_trainer_state

    folder = Path(v.run.pins().init_adapter)
    initial = v.manifest["initial_state"]
    for key, name in mf.STATE_FILES.items():
        pin = initial.get(key)
        if pin is None:
            continue
        where = str(folder / name)
        if pin.get("from") == "seed":
            got, where = seed_head_sha256(v), f"reward head from seed {v.run.cfg.seed}"
        elif key == "adapter":  # the big one: hashed in the background already
            got = v.hashes.file(Path(where)) if Path(where).is_file() else "missing file"
        elif Path(where).is_file():  # small: kept, so the replay loads the bytes checked here
            v.state_bytes[key], got = read_hashed(Path(where), key)
        else:
            got = "missing file"
        if got != pin["sha256"]:
            raise IntegrityError(
                pin["sha256"], got, where, "the replay does not start from the captured state"
            )
    state = read_trainer_state(folder)  # only now: its bytes are the pinned ones
    if state["step"] != initial["resume_step"]:
        raise ContractError(
            f"{folder}: trainer_state step {state['step']}, the capture starts from step "
            f"{initial['resume_step']}",
            "point [resume] from at the state the capture was taken from",
        )
    adapter_shape(v, folder)
    return f"sha256 {initial['adapter']['sha256']}"


def adapter_shape(v: Verified, folder: Path) -> None:
    """The pinned adapter_config.json must describe the adapter the config asks for (the replay
    refuses it otherwise, so explain must too)."""
    from twinrun.core.jsonlimits import SMALL, parse_json

    cfg = v.run.cfg
    adapter = parse_json(
        v.state_bytes["adapter_config"], str(folder / "adapter_config.json"), SMALL
    )
    if not isinstance(adapter, dict):
        raise DataError(f"{folder / 'adapter_config.json'} is not a JSON object")
    rank, alpha = adapter.get("r"), adapter.get("lora_alpha")
    if rank != cfg.lora_rank or not isinstance(alpha, int | float) or alpha != cfg.lora_alpha:
        raise ConfigError(
            f"adapter {folder} is rank {rank} alpha {alpha}, the config says "
            f"{cfg.lora_rank}/{cfg.lora_alpha}",
            "make [model] lora_* match the adapter",
        )


def seed_head_sha256(v: Verified) -> str:
    from twinrun.capture.state import head_bytes
    from twinrun.model.loading import read_model_config
    from twinrun.model.reward_head import new_reward_head

    pins = v.run.pins()
    hidden = int(read_model_config(Path(pins.model))["hidden_size"])
    return sha256_bytes(head_bytes(new_reward_head(hidden, pins.seed).weight))


def adapter_target_modules(adapter_dir: Path) -> list[str]:
    """The modules the adapter a replay starts from wraps (its adapter_config.json)."""
    import json

    from twinrun.core import reading
    from twinrun.core.errors import ModelError

    path = adapter_dir / "adapter_config.json"
    try:
        text = reading.read_text(path, "adapter config", 16 << 20, ModelError)
        targets = json.loads(text).get("target_modules")
    except ModelError:
        raise
    except (OSError, ValueError, AttributeError, RecursionError) as exc:
        raise ModelError(f"cannot read {path}", "point [resume] from at an adapter") from exc
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ModelError(f"{path}: target_modules is not a list of names", "re-create it")
    return sorted(targets)


def contract(v: Verified) -> str:
    from twinrun.config.contract import allowlist_problems, contract_diff, optimizer_contract
    from twinrun.core.errors import ModelError

    cfg, pinned = v.run.cfg, v.manifest["optimizer_contract"]
    source = pinned["values"]
    if sha256_json(source) != pinned["sha256"]:
        raise IntegrityError(
            pinned["sha256"], sha256_json(source), f"optimizer contract of {v.manifest_path}"
        )
    model = Path(v.run.pins().model)
    if not model.is_dir():
        raise ModelError(f"model directory {cfg.model} does not exist", "check [model] path")
    model_sha = v.hashes.dir(model)
    targets = adapter_target_modules(Path(v.run.pins().init_adapter))
    replay = optimizer_contract(
        cfg, v.manifest["objective"], model_sha, targets, v.run.extras.engine
    )
    declared = list(v.run.extras.allow_config_differences)
    problems = allowlist_problems(source, replay, declared)
    if problems:
        raise ContractError(
            "optimizer contract: " + "; ".join(problems),
            "make the replay config match the source, declaring only what v1 allows to differ",
        )
    v.source_contract, v.replay_contract = source, replay
    v.observed = contract_diff(source, replay)
    # the contract pins the numbers the update reads: the replay of the captured objective
    v.replayed = replay_run(dataclasses.replace(cfg, objective=v.manifest["objective"]))
    schedule(v)
    return f"differences: {', '.join(v.observed) or 'none'}"


def schedule(v: Verified) -> None:
    """The learning rate of the captured step, recomputed from the replay config (its schedule,
    warm-up and wsd's decay), must be the source's to the bit: `explain` and the replay run the
    same check."""
    from twinrun.config.schedule import lr_at, warmup_of
    from twinrun.core.rng import float_bits

    run, m = v.replay(), v.manifest
    step, recorded, total = m["step"], m["schedule"], m["schedule"]["total_steps"]
    warmup = warmup_of(run.warmup_steps, run.optimizer.warmup_ratio, total)
    lr = lr_at(step, run.learning_rate, warmup, total, run.lr_schedule, run.optimizer.decay_steps)
    if float_bits(lr) != recorded.get("lr_bits", float_bits(float(recorded["lr"]))):
        raise ContractError(
            f"learning rate at step {step} is {lr}, the source's was {recorded['lr']}",
            "the schedule numbers differ",
        )


STEPS = (
    fresh_output,
    manifest_pin,
    payload_sha,
    decode_payload,
    logical,
    initial_adapter,
    contract,
)


def run_checks(run: TomlRun, stop: bool) -> tuple[list[Check], Verified]:
    cfg = run.cfg
    files = [Path(cfg.init_adapter) / mf.STATE_FILES["adapter"]] if cfg.init_adapter else []
    v = Verified(run, hashes=Hashes(files, [Path(cfg.model)] if cfg.model else []))
    try:
        return _run(v, stop)
    finally:
        v.hashes.close()


def _run(v: Verified, stop: bool) -> tuple[list[Check], Verified]:
    results: list[Check] = []
    status: dict[str, str] = {}
    for name, fn in zip(NAMES, STEPS, strict=True):
        blocked = [n for n in NEEDS.get(name, ()) if status.get(n) != "pass"]
        if blocked:
            results.append(Check(name, "skip", f"not trusted: {', '.join(blocked)} did not pass"))
        else:
            try:
                results.append(Check(name, "pass", fn(v)))
            except TwinrunError as exc:
                if stop:
                    raise
                check = Check(name, "fail", exc.one_line())
                if isinstance(exc, IntegrityError):
                    check.expected, check.got = exc.expected, exc.got
                results.append(check)
        status[name] = results[-1].status
    return results, v
