"""`twinrun tune sft` end to end on the toy model, through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli

WALL_KEYS = {"wall_s"}


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_KEYS} for r in rows]


def test_same_seed_same_bytes_and_metrics(sft_runs: dict[str, Path]) -> None:
    a, b = sft_runs["a"], sft_runs["b"]
    for name in ("adapter_model.safetensors", "adapter_config.json", "diag.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert metrics(a) == metrics(b)
    assert len(metrics(a)) == 4  # 16 examples / batch 4 / accumulation 1, one epoch


def test_other_seed_other_bytes(sft_runs: dict[str, Path]) -> None:
    a, c = sft_runs["a"], sft_runs["c"]
    assert (a / "adapter_model.safetensors").read_bytes() != (
        c / "adapter_model.safetensors"
    ).read_bytes()
    assert metrics(a) != metrics(c)


def test_sidecar_records_every_number(sft_runs: dict[str, Path], toy_model_dir: Path) -> None:
    side = json.loads((sft_runs["a"] / "twinrun.json").read_text())
    assert side["format"] == "twinrun.run.v1"
    train = side["train"]
    expected = {
        "objective": "sft", "seed": 1, "epochs": 1, "batch_size": 4, "accumulation": 1,
        "learning_rate": 1e-2, "warmup_steps": 1,
        "lr_schedule": "cosine", "lora_rank": 4, "lora_alpha": 8.0,
        "precision": "f32", "chat_template": "on", "threads": 1, "device": "cpu",
        "strict": True, "weight_decay": 0.0, "adam_betas": [0.9, 0.999], "adam_eps": 1e-8,
    }  # fmt: skip
    assert {k: train[k] for k in expected} == expected
    from twinrun.core.digest import sha256_dir, sha256_file

    assert side["model"]["sha256"] == sha256_dir(toy_model_dir)
    assert side["adapter"]["sha256"] == sha256_file(sft_runs["a"] / "adapter_model.safetensors")
    assert len(side["data"]["sha256"]) == 64
    assert side["determinism"]["strict"] is True
    assert side["determinism"]["deterministic_algorithms"] is True
    for key in ("python", "torch", "transformers", "peft", "safetensors", "numpy"):
        assert side["runtime"][key], key
    assert side["metrics"]["steps"] == 4
    assert side["metrics"]["final_loss"] == metrics(sft_runs["a"])[-1]["loss"]


def test_metrics_rows_have_the_documented_fields(sft_runs: dict[str, Path]) -> None:
    rows = metrics(sft_runs["a"])
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert {"loss", "lr", "grad_norm", "tokens", "rows", "epoch", "padding_fraction"} <= set(r)
    assert rows[-1]["lr"] == 0.0  # cosine to exactly zero at the last step
    assert rows[0]["lr"] == 1e-2  # one warmup step reaches the base


def test_peft_loads_the_adapter_with_the_same_logits(
    sft_runs: dict[str, Path], toy_model_dir: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from twinrun.model.build import load_causal_lm
    from twinrun.model.lora import load_adapter

    ours = load_causal_lm(toy_model_dir)
    load_adapter(ours, sft_runs["a"])
    hf = AutoModelForCausalLM.from_pretrained(toy_model_dir, attn_implementation="eager")
    peft_model = PeftModel.from_pretrained(hf, str(sft_runs["a"])).eval()
    ids = torch.tensor([[256, 72, 105, 33, 10, 65, 66, 67]])
    with torch.no_grad():
        a = ours(ids)
        b = peft_model(input_ids=ids).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    base = load_causal_lm(toy_model_dir)
    with torch.no_grad():
        assert not torch.allclose(base(ids), a)  # the adapter changed something


def test_bf16_runs_and_is_recorded(tmp_path: Path, toy_model_dir: Path, sft_examples: Path) -> None:
    out = tmp_path / "bf16"
    args = sft_args(toy_model_dir, sft_examples, out, 1)
    args[args.index("f32")] = "bf16"
    assert run_cli(args) == 0
    assert json.loads((out / "twinrun.json").read_text())["train"]["precision"] == "bf16"


# -- bad inputs: one clear line, non-zero exit, nothing written --------------------------------


def bad(capsys: pytest.CaptureFixture[str], args: list[str], match: str, out: Path) -> None:
    before = sorted(out.parent.iterdir()) if out.parent.exists() else []
    rc = run_cli(args)
    err = capsys.readouterr().err
    assert rc != 0
    assert match in err, err
    assert err.startswith("twinrun: error:") and err.count("\n") == 1
    assert not out.exists() or sorted(out.parent.iterdir()) == before


def test_missing_flags_listed_together(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    bad(capsys, ["tune", "sft", "--output", str(out), "--seed", "1"], "--model", out)
    bad(capsys, ["tune", "sft", "--output", str(out)], "--epochs --batch-size", out)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (("--seed", "-1"), "--seed must be in [0, 2**63)"),
        (("--batch-size", "0"), "--batch-size must be >= 1"),
        (("--precision", "fp8"), "--precision must be f32 or bf16"),
        (("--inject", "bogus@1"), "unknown fault"),
    ],
)
def test_bad_numbers(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    change: tuple[str, str],
    match: str,
) -> None:
    out = tmp_path / "run"
    args = sft_args(toy_model_dir, sft_examples, out, 1)
    if change[0] in args:
        args[args.index(change[0]) + 1] = change[1]
    else:
        args += list(change)
    bad(capsys, args, match, out)


def test_model_dir_missing_or_not_a_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, sft_examples: Path
) -> None:
    out = tmp_path / "run"
    bad(capsys, sft_args(tmp_path / "nope", sft_examples, out, 1), "nope", out)
    notckpt = tmp_path / "empty"
    notckpt.mkdir()
    (notckpt / "readme.txt").write_text("hi")
    bad(capsys, sft_args(notckpt, sft_examples, out, 1), "config.json", out)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "examples file not found"),
        ("", "is empty"),
        ('{"prompt": "a", "completion": "b"}\n{oops\n', "ex.jsonl:2: not valid JSON"),
        ('{"prompt": "a"}\n', "needs 'prompt' and 'completion'"),
    ],
)
def test_bad_examples(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    toy_model_dir: Path,
    content: str | None,
    match: str,
) -> None:
    ex = tmp_path / "ex.jsonl"
    if content is not None:
        ex.write_text(content)
    out = tmp_path / "run"
    bad(capsys, sft_args(toy_model_dir, ex, out, 1), match, out)


def test_existing_output_refused_unless_overwrite(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    out = tmp_path / "run"
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1)) == 0
    sidecar = (out / "twinrun.json").read_bytes()
    rc = run_cli(sft_args(toy_model_dir, sft_examples, out, 1))
    assert rc != 0 and "--overwrite" in capsys.readouterr().err
    assert (out / "twinrun.json").read_bytes() == sidecar  # nothing lost
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--overwrite")) == 0
    assert (out / "adapter_model.safetensors").exists()


def test_subprocess_error_is_one_line_and_debug_gives_traceback(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "twinrun", "tune", "sft", "--output", str(tmp_path / "o")]
    env = {k: v for k, v in os.environ.items() if k != "TWINRUN_DEBUG"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert res.returncode == 2
    assert res.stderr.startswith("twinrun: error: missing required flags")
    assert "Traceback" not in res.stderr
    res = subprocess.run(cmd, capture_output=True, text=True, env=env | {"TWINRUN_DEBUG": "1"})
    assert res.returncode != 0 and "Traceback" in res.stderr


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys; from twinrun.cli.main import run_cli; run_cli(['--help']); "
        "assert 'torch' not in sys.modules"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "tune" in res.stdout


def test_unexpected_error_is_one_line_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import twinrun.train.recipes

    def boom(run: object, checked: bool = False) -> None:
        raise RuntimeError("something broke")

    monkeypatch.delenv("TWINRUN_DEBUG", raising=False)
    monkeypatch.setattr(twinrun.train.recipes, "train", boom)
    monkeypatch.setattr("twinrun.config.resolved.validate", lambda cfg: None)  # reach the trainer
    monkeypatch.setattr("twinrun.train.setup.preflight.preflight", lambda run: None)
    monkeypatch.setattr("twinrun.cli.tune.print_defaults_table", lambda run: None)
    assert run_cli(["tune", "sft"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("twinrun: internal error: RuntimeError: something broke")
    assert err.count("\n") == 1 and "TWINRUN_DEBUG=1" in err


def test_tool_fields_the_template_drops_are_said_once(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The toy's chat template renders role and content only: a row's `tools` and an assistant
    turn's `tool_calls` never reach the tokens, and the run says so in one warning line."""
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    row = {"messages": [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "2"},
    ], "tools": [{"type": "function", "function": {"name": "add"}}]}  # fmt: skip
    data = tmp_path / "tools.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for _ in range(8)))
    assert run_cli(sft_args(toy_model_dir, data, tmp_path / "out", 1)) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "ToolFieldsWarning" in ln]
    assert len(lines) == 1, err
    assert "the 'tools' of 8 row(s) or the assistant 'tool_calls' of 8 row(s)" in lines[0]
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
