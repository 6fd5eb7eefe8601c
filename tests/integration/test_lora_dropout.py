"""`--lora-dropout P` (TRL/PEFT's `lora_dropout`) end to end on the toy model. Its masks come
from the keyed stream, so a run with it reproduces its bytes for every objective and differs
from one without; it is recorded (the sidecar when given, `adapter_config.json`'s
`lora_dropout`, the optimizer contract); gradient checkpointing writes the same bytes with it;
in batch-invariant mode the same rows split into other forwards write the same adapter bytes
with it (the promise that mode makes without dropout; the same losses too for the epoch
objectives); a captured step with it replays bit for bit — the replay draws the same masks from
its seed, step and rows — also under the checkpointing arm, and a replay without it is refused
by the contract; a run with it resumes bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testkit.captures import (
    Capture,
    arith,
    epoch_source,
    grpo_source,
    init_adapter,
    metrics,
    plugin,
    run_config,
    shipped,
)
from testkit.toy_runs import OBJECTIVES, run_args, sha256_of, write_examples
from tests.distributed.runs import resumable, timeless, with_flags
from twinrun.cli.main import run_cli

ADAPTER = "adapter_model.safetensors"


def train(args: list[str]) -> Path:
    assert run_cli(args) == 0
    return Path(args[args.index("--output") + 1])


def sidecar_train(run: Path) -> dict:
    return json.loads((run / "twinrun.json").read_text())["train"]


def adapter_dropout(folder: Path) -> float:
    return json.loads((folder / "adapter_config.json").read_text())["lora_dropout"]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_dropout_reproduces_is_recorded_and_changes_the_update(
    objective: str, tmp_path: Path, toy_model_dir: Path
) -> None:
    data = write_examples(tmp_path / "data")[objective]
    on, again, off = (
        train(run_args(objective, toy_model_dir, data, tmp_path / name, *extra))
        for name, extra in (("on", ["--lora-dropout", "0.1"]), ("again", ["--lora-dropout", "0.1"]),
                            ("off", []))
    )  # fmt: skip
    assert sha256_of(on / ADAPTER) == sha256_of(again / ADAPTER)
    assert sha256_of(on / ADAPTER) != sha256_of(off / ADAPTER)
    assert metrics(on)[0]["grad_norm"] != metrics(off)[0]["grad_norm"]  # from the first step
    assert sidecar_train(on)["lora_dropout"] == 0.1 and "lora_dropout" not in sidecar_train(off)
    assert adapter_dropout(on) == 0.1 and adapter_dropout(off) == 0.0


def test_a_dropout_of_zero_is_recorded_and_changes_no_byte(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    data = write_examples(tmp_path / "data")["sft"]
    zero = train(run_args("sft", toy_model_dir, data, tmp_path / "zero", "--lora-dropout", "0"))
    off = train(run_args("sft", toy_model_dir, data, tmp_path / "off"))
    assert sha256_of(zero / ADAPTER) == sha256_of(off / ADAPTER)
    assert sidecar_train(zero)["lora_dropout"] == 0.0


@pytest.mark.parametrize(
    ("objective", "attention"), [("sft", "eager"), ("sft", "blockwise"), ("grpo", "eager")]
)
def test_gradient_checkpointing_writes_the_same_bytes_with_dropout(
    objective: str, attention: str, tmp_path: Path, toy_model_dir: Path
) -> None:
    data = write_examples(tmp_path / "data")[objective]
    runs = [
        train(run_args(objective, toy_model_dir, data, tmp_path / name, "--attention", attention,
                       *extra))
        for name, extra in (
            ("plain", ["--lora-dropout", "0.2"]),
            ("gc", ["--lora-dropout", "0.2", "--gradient-checkpointing"]),
            ("off", []),
        )
    ]  # fmt: skip
    assert sidecar_train(runs[1])["gradient_checkpointing"] is True
    assert sha256_of(runs[0] / ADAPTER) == sha256_of(runs[1] / ADAPTER)
    assert sha256_of(runs[0] / ADAPTER) != sha256_of(runs[2] / ADAPTER)  # the dropout acted


@pytest.mark.parametrize(
    ("objective", "splits"),
    [("sft", ({"batch_size": "1", "accumulation": "4"}, {"batch_size": "4", "accumulation": "1"})),
     ("dpo", ({"batch_size": "1", "accumulation": "2"}, {"batch_size": "2", "accumulation": "1"})),
     ("grpo", ({"batch_size": "1"}, {"batch_size": "6"}))],
)  # fmt: skip
def test_batch_invariant_splits_write_the_same_bytes_with_dropout(
    objective: str, splits: tuple[dict[str, str], ...], tmp_path: Path, toy_model_dir: Path
) -> None:
    data = write_examples(tmp_path / "data")[objective]
    runs = []
    for i, split in enumerate(splits):
        args = run_args(objective, toy_model_dir, data, tmp_path / f"split{i}", "--batch-invariant",
                        "--lora-dropout", "0.3")  # fmt: skip
        runs.append(train(with_flags(args, **split)))
    assert sha256_of(runs[0] / ADAPTER) == sha256_of(runs[1] / ADAPTER)
    if objective != "grpo":  # GRPO's logged loss adds its forwards' floats (its bytes are equal)
        assert [r["loss"] for r in metrics(runs[0])] == [r["loss"] for r in metrics(runs[1])]


def test_a_run_with_dropout_resumes_bit_for_bit(tmp_path: Path, toy_model_dir: Path) -> None:
    """Killed after its first of three steps (a checkpoint after each), then resumed: the masks
    are keyed by the step, not by how many were drawn before, so the bytes are the whole run's."""
    data = write_examples(tmp_path / "data")["sft"]
    args = with_flags(
        run_args("sft", toy_model_dir, data, tmp_path / "whole", "--lora-dropout", "0.2"),
        batch_size="1", accumulation="3", checkpoint_every="1",
    )  # fmt: skip
    whole = train(args)
    killed = resumable(whole, tmp_path / "killed")
    shutil.rmtree(killed / "checkpoints" / "step-000002")
    assert run_cli([*with_flags(args, output=str(killed)), "--resume"]) == 0
    assert sha256_of(killed / ADAPTER) == sha256_of(whole / ADAPTER)
    assert timeless(metrics(killed)) == timeless(metrics(whole))


def source(objective: str, tmp_path: Path, toy_model_dir: Path) -> Capture:
    """A one-step capture with `model.lora_dropout = 0.3` from a fresh adapter."""
    init = init_adapter(tmp_path / "init", toy_model_dir, seed=5)
    if objective == "grpo":
        doc = grpo_source(toy_model_dir, arith(tmp_path), plugin(tmp_path), init, tmp_path / "src")
    else:
        data = shipped("sft.jsonl" if objective == "sft" else "pairs.jsonl", tmp_path)
        doc = epoch_source(objective, toy_model_dir, init, tmp_path / "src", data)
    doc["model"]["lora_dropout"] = 0.3
    assert run_config(tmp_path / "src.toml", doc) == 0
    return Capture(doc, tmp_path / "src", 0)


@pytest.mark.parametrize("objective", ["sft", "dpo", "grpo"])
def test_a_captured_step_with_dropout_replays_bitwise(
    objective: str, tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = source(objective, tmp_path, toy_model_dir)
    manifest = json.loads(cap.manifest.read_text())
    assert manifest["optimizer_contract"]["values"]["model.lora_dropout"] == 0.3
    final = Path("final") / ADAPTER
    assert run_config(tmp_path / "rep.toml", cap.replay_config(tmp_path / "rep")) == 0
    assert sha256_of(tmp_path / "rep" / final) == sha256_of(cap.out / final)
    assert adapter_dropout(tmp_path / "rep" / "final") == 0.3
    gc = cap.replay_config(
        tmp_path / "gc",
        **{"backend.options": {"gradient_checkpointing": True},
           "optimizer_batch": {"allow_config_differences": [
               "backend.options.gradient_checkpointing"]}},
    )  # fmt: skip
    assert run_config(tmp_path / "gc.toml", gc) == 0
    assert sha256_of(tmp_path / "gc" / final) == sha256_of(cap.out / final)
    capsys.readouterr()
    without = cap.replay_config(tmp_path / "bare")
    del without["model"]["lora_dropout"]
    assert run_config(tmp_path / "bare.toml", without) != 0
    err = capsys.readouterr().err
    assert "undeclared difference model.lora_dropout: source 0.3, replay absent" in err
    assert not (tmp_path / "bare").exists()


def test_off_leaves_the_contract_and_the_capture_as_they_were(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    init = init_adapter(tmp_path / "init", toy_model_dir, seed=5)
    data = shipped("sft.jsonl", tmp_path)
    doc = epoch_source("sft", toy_model_dir, init, tmp_path / "src", data)
    assert run_config(tmp_path / "src.toml", doc) == 0
    manifest = json.loads(Capture(doc, tmp_path / "src", 0).manifest.read_text())
    assert "model.lora_dropout" not in manifest["optimizer_contract"]["values"]
