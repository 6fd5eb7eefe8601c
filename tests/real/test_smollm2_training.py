"""Training on SmolLM2-135M-Instruct: every objective run twice writes the same adapter bytes;
PEFT's `PeftModel` on a trained adapter computes twinrun's losses; the resolved LoRA targets and
max length are recorded; a resumed run, a batch-invariant evaluation and a captured step replayed
are bitwise what they promise. Runs are short (two steps of two rows) and on one thread."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from testkit.captures import Capture, epoch_source, init_adapter, metrics, run_config
from tests.real.reference import reference_model
from tests.real.test_smollm2_numbers import examples_file
from tests.real.test_smollm2_tokens import trl_tokenize
from twinrun.cli.main import run_cli
from twinrun.data.examples import encode_sft_rows, load_rows, sft_parts, shipped_examples
from twinrun.model.tokens import load_tokenizer

pytestmark = pytest.mark.real

ATTENTION = ["k_proj", "o_proj", "q_proj", "v_proj"]
ALL_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sidecar(run: Path) -> dict[str, Any]:
    return json.loads((run / "twinrun.json").read_text())


def without_walls(run: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in metrics(run)]


def tune(objective: str, model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """Two optimizer steps of two rows each (a pair is two rows: one pair a step)."""
    common = ["--model", str(model), "--examples", str(data), "--output", str(out),
              "--seed", "3", "--learning-rate", "1e-3", "--warmup-steps", "0",
              "--lr-schedule", "cosine",
              "--lora-rank", "2", "--lora-alpha", "4", "--precision", "f32",
              "--chat-template", "on", "--quiet", "--threads", "1"]  # fmt: skip
    if objective == "grpo":
        shape = ["--steps", "2", "--prompts-per-step", "1", "--group-size", "2",
                 "--batch-size", "2", "--max-new-tokens", "3", "--temperature", "1.0",
                 "--clip-eps", "0.2", "--advantage-clip", "5", "--token-cap", "3",
                 "--env", "arithmetic"]  # fmt: skip
    elif objective == "sft":
        shape = ["--epochs", "1", "--batch-size", "2", "--accumulation", "1"]
    else:
        shape = ["--epochs", "1", "--batch-size", "1", "--accumulation", "1"]
        shape += ["--beta", "0.1"] if objective == "dpo" else []
    return ["tune", objective, *common, *shape, *extra]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("smol_data")
    sft = examples_file(folder, 4)
    pairs = examples_file(folder, 2, "pairs.jsonl")
    return {"sft": sft, "dpo": pairs, "reward": pairs, "grpo": shipped_examples("arith.jsonl")}


@pytest.fixture(scope="module")
def sft_run(
    tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, data: dict[str, Path]
) -> Path:
    """SFT with diag, a step-1 module trace and a checkpoint after every step."""
    out = tmp_path_factory.mktemp("smol_sft") / "a"
    extra = ("--diag", "--trace-step", "1", "--checkpoint-every", "1")
    assert run_cli(tune("sft", smollm2_dir, data["sft"], out, *extra)) == 0
    return out


def test_sft_twice_same_bytes_and_the_sidecar_records_targets_and_length(
    sft_run: Path, smollm2_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    # the second run has no diag, trace or checkpoints: hooks that observe change no byte
    assert run_cli(tune("sft", smollm2_dir, data["sft"], tmp_path / "b")) == 0
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (sft_run / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert without_walls(sft_run) == without_walls(tmp_path / "b")
    assert [r["step"] for r in metrics(sft_run)] == [0, 1]
    train = sidecar(sft_run)["train"]
    assert train["lora_targets"] == ATTENTION and train["max_length"] == 8192
    assert train["attention"] == "eager"
    config = json.loads((sft_run / "adapter_config.json").read_text())
    assert config["target_modules"] == ATTENTION and config["r"] == 2
    diag = [json.loads(x) for x in (sft_run / "diag.jsonl").read_text().splitlines()]
    assert [d["step"] for d in diag] == [0, 1]
    (trace,) = [json.loads(x) for x in (sft_run / "trace.jsonl").read_text().splitlines()]
    names = {e[1] for e in trace["entries"]}
    assert trace["step"] == 1 and "model.layers.29.self_attn.o_proj.lora_B" in names
    assert "model.layers.0.mlp.down_proj" in names


def test_resume_from_the_step_1_checkpoint_is_bitwise(
    sft_run: Path, smollm2_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    """As if killed right after checkpoint 1: the final files and the step-1 lines gone."""
    run = tmp_path / "killed"
    shutil.copytree(sft_run, run)
    for name in ("twinrun.json", "adapter_model.safetensors", "adapter_config.json"):
        (run / name).unlink()
    for name in ("metrics.jsonl", "diag.jsonl"):
        first = (run / name).read_text().splitlines()[0]
        (run / name).write_text(first + "\n")
    (run / "trace.jsonl").unlink()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001"]
    extra = ("--diag", "--trace-step", "1", "--checkpoint-every", "1", "--resume")
    assert run_cli(tune("sft", smollm2_dir, data["sft"], run, *extra)) == 0
    for name in ("adapter_model.safetensors", "diag.jsonl", "trace.jsonl"):
        assert (run / name).read_bytes() == (sft_run / name).read_bytes(), name
    assert without_walls(run) == without_walls(sft_run)


def evaluate(model: Path, data: Path, out: Path, *extra: str) -> list[dict[str, Any]]:
    assert run_cli(["tune", "evaluate", "--model", str(model), "--examples", str(data),
                    "--chat-template", "on", "--precision", "f32", "--output", str(out),
                    "--threads", "1", "--quiet", *extra]) == 0  # fmt: skip
    return json.loads(out.read_text())["per_example"]


def test_peft_on_the_adapter_computes_twinruns_losses(
    sft_run: Path, smollm2_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel

    ours = evaluate(smollm2_dir, data["sft"], tmp_path / "e.json", "--adapter", str(sft_run),
                    "--batch-size", "2")  # fmt: skip
    base = reference_model(smollm2_dir)
    peft = PeftModel.from_pretrained(base, str(sft_run)).eval()
    try:
        tok = load_tokenizer(smollm2_dir)
        for entry, row in zip(ours, load_rows(data["sft"]), strict=True):
            messages, completion = sft_parts(row)
            ids, mask = trl_tokenize(tok.hf, messages, completion, conversational=True)
            with torch.no_grad():
                logits = peft(input_ids=torch.tensor([ids])).logits[0, :-1].double()
                with peft.disable_adapter():
                    plain = base(torch.tensor([ids])).logits[0, :-1].double()
            target = torch.tensor(ids[1:])[:, None]
            keep = torch.tensor(mask[1:], dtype=torch.bool)
            loss = -torch.log_softmax(logits, -1).gather(1, target)[:, 0][keep].mean()
            untrained = -torch.log_softmax(plain, -1).gather(1, target)[:, 0][keep].mean()
            assert entry["loss"] == pytest.approx(float(loss), rel=1e-5)
            assert abs(entry["loss"] - float(untrained)) > 1e-4  # the adapter moved the loss
    finally:
        peft.unload()  # leave the cached reference model as it was


def test_batch_invariant_evaluate_is_a_batch_of_one_bit_for_bit(
    smollm2_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    one = evaluate(smollm2_dir, data["sft"], tmp_path / "1.json", "--batch-size", "1")
    four = evaluate(smollm2_dir, data["sft"], tmp_path / "4.json", "--batch-size", "4",
                    "--batch-invariant")  # fmt: skip
    rows = encode_sft_rows(load_tokenizer(smollm2_dir), load_rows(data["sft"]), True, 8192)
    assert len({len(r.input_ids) for r in rows}) > 1  # rows of different lengths: padding
    assert [e["loss"] for e in four] == [e["loss"] for e in one]


@pytest.mark.parametrize("objective", ["dpo", "reward", "grpo"])
def test_pairs_and_grpo_twice_same_bytes(
    objective: str, smollm2_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        assert run_cli(tune(objective, smollm2_dir, data[objective], run)) == 0
    names = ["adapter_model.safetensors", "adapter_config.json"]
    names += ["reward_head.safetensors"] if objective == "reward" else []
    for name in names:
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), name
    rows = without_walls(runs[0])
    assert rows == without_walls(runs[1]) and [r["step"] for r in rows] == [0, 1]
    assert sidecar(runs[0])["train"]["lora_targets"] == ATTENTION
    assert all(r["loss"] == r["loss"] for r in rows)  # finite, not NaN


def test_all_linear_in_bf16_and_a_custom_list_are_recorded(
    smollm2_dir: Path, data: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors import safe_open

    two = examples_file(tmp_path, 2)
    cases = {
        "wide": (["--lora-targets", "all-linear", "--precision", "bf16"], ALL_LINEAR),
        "custom": (["--lora-targets", "v_proj,q_proj"], ["q_proj", "v_proj"]),
    }
    for name, (extra, want) in cases.items():
        out = tmp_path / name
        args = tune("sft", smollm2_dir, two, out)
        args = args[: args.index("--precision")] + args[args.index("--precision") + 2 :]
        if "--precision" not in extra:
            extra = [*extra, "--precision", "f32"]
        assert run_cli([*args, *extra]) == 0, name
        train = sidecar(out)["train"]
        assert train["lora_targets"] == want, name
        config = json.loads((out / "adapter_config.json").read_text())
        assert config["target_modules"] == want
        with safe_open(str(out / "adapter_model.safetensors"), "pt") as fh:
            keys = list(fh.keys())
        wrapped = {k.split(".")[-3] for k in keys}
        assert wrapped == set(want) and len(keys) == 2 * 30 * len(want)
        (row,) = metrics(out)
        assert row["loss"] == row["loss"] and row["grad_norm"] > 0
    assert sidecar(tmp_path / "wide")["train"]["precision"] == "bf16"


def test_capture_replay_evidence(smollm2_dir: Path, tmp_path: Path) -> None:
    """One SFT step captured from an initial adapter, replayed with the examples gone: the same
    adapter bytes, and `evidence --require B` agrees."""
    init = init_adapter(tmp_path / "init", smollm2_dir)
    examples = examples_file(tmp_path, 2)
    doc = epoch_source("sft", smollm2_dir, init, tmp_path / "src", examples)
    doc["training"] |= {"batch_size": 1, "accumulation": 2}
    assert run_config(tmp_path / "src.toml", doc) == 0
    cap = Capture(doc, tmp_path / "src", 0)
    examples.unlink()
    assert run_config(tmp_path / "rep.toml", cap.replay_config(tmp_path / "rep")) == 0
    (row,) = metrics(tmp_path / "rep")
    for key in ("loss", "optimizer/logical_batch_sha256", "optimizer_batch/final_adapter_sha256"):
        assert row[key] == cap.row[key], key
    final = "final/adapter_model.safetensors"
    assert (
        sha(tmp_path / "rep" / final)
        == sha(tmp_path / "src" / final)
        != sha(init / "adapter_model.safetensors")
    )
    rc = run_cli(["evidence", str(tmp_path / "src"), str(tmp_path / "rep"), "--require", "B"])
    assert rc == 0
