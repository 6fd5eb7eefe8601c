"""`tune sft --defaults trl` is TRL's run, number by number: the same adapter bytes as every one
of those numbers given as a flag, printed once and recorded with where each came from; `twinrun
init` writes a config `twinrun run` runs to the same bytes; `--warmup-ratio` makes the warm-up
steps transformers makes; `twinrun reproduce` re-runs both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli

ADAPTER = "adapter_model.safetensors"
# TRL 1.16's SFTConfig and PEFT's LoraConfig defaults as flags (16 examples / 8: 6 steps)
TRL_SFT_FLAGS = [
    "--seed", "42", "--epochs", "3", "--batch-size", "8", "--accumulation", "1",
    "--learning-rate", "2e-5", "--warmup-steps", "0", "--lr-schedule", "linear",
    "--max-grad-norm", "1.0", "--precision", "bf16", "--chat-template", "on", "--lora-rank", "8",
    "--lora-alpha", "8", "--max-length", "1024", "--messages-loss", "all",
    "--lora-targets", "q_proj,v_proj",
]  # fmt: skip


def paths(model: Path, examples: Path, out: Path) -> list[str]:
    """The run's files, and the portable kernels (the thread count is then not a number)."""
    return ["tune", "sft", "--model", str(model), "--examples", str(examples), "--output", str(out),
            "--cpu-kernels", "portable"]  # fmt: skip


def test_defaults_trl_is_every_trl_number_given(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken, given = tmp_path / "taken", tmp_path / "given"
    capsys.readouterr()
    assert run_cli([*paths(toy_model_dir, sft_examples, taken), "--defaults", "trl"]) == 0
    err = capsys.readouterr().err
    assert "16 numbers taken from TRL 1.16.0's SFTConfig and PEFT 0.21.2's LoraConfig" in err
    assert err.count("numbers taken from TRL") == 1  # printed once
    assert any(line.split()[:3] == ["--learning-rate", "2e-05", "SFTConfig.learning_rate"]
               for line in err.splitlines())  # fmt: skip
    assert run_cli([*paths(toy_model_dir, sft_examples, given), *TRL_SFT_FLAGS, "--quiet"]) == 0
    assert (taken / ADAPTER).read_bytes() == (given / ADAPTER).read_bytes()
    record = json.loads((taken / "twinrun.json").read_text())
    plain = json.loads((given / "twinrun.json").read_text())
    assert record["train"] == plain["train"]  # the numbers, recorded as any given number is
    assert record["metrics"]["steps"] == 6
    defaults = record["defaults"]
    assert (defaults["from"], defaults["config"]) == ("trl", "SFTConfig")
    assert defaults["taken"]["learning_rate"] == {
        "value": 2e-5, "source": "SFTConfig.learning_rate"
    }  # fmt: skip
    assert defaults["taken"]["lora_targets"]["value"] == ["q_proj", "v_proj"]
    assert defaults["taken"]["lora_dropout"] == {
        "value": None, "source": "LoraConfig.lora_dropout = 0.0"
    }  # fmt: skip
    assert len(defaults["taken"]) == 16 and "defaults" not in plain
    assert run_cli(["reproduce", str(taken), "--output", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "twinrun.json").read_text())
    assert again["defaults"] == defaults


def test_init_writes_a_config_run_runs_to_trls_bytes(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    config, out = tmp_path / "sft.toml", tmp_path / "from-toml"
    init = ["init", "sft", "--to", str(config), "--defaults", "trl", "--model", str(toy_model_dir),
            "--examples", str(sft_examples), "--output", str(out)]  # fmt: skip
    assert run_cli(init) == 0
    text = config.read_text()
    assert "learning_rate = 2e-05  # SFTConfig.learning_rate" in text
    assert 'messages_loss = "all"  # SFTConfig.assistant_only_loss = False' in text
    assert run_cli(["run", str(config), "--quiet"]) == 0
    flags = tmp_path / "from-flags"
    assert (
        run_cli([*paths(toy_model_dir, sft_examples, flags), "--defaults", "trl", "--quiet"]) == 0
    )
    assert (out / ADAPTER).read_bytes() == (flags / ADAPTER).read_bytes()
    before = config.read_bytes()
    assert run_cli(init) == 2  # an existing file is not replaced without --overwrite
    assert config.read_bytes() == before


def test_init_without_defaults_leaves_the_numbers_to_the_user(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = tmp_path / "sft.toml", tmp_path / "run"
    assert run_cli(["init", "sft", "--to", str(config), "--model", str(toy_model_dir),
                    "--examples", str(sft_examples), "--output", str(out)]) == 0  # fmt: skip
    assert "# learning_rate =  # required: Peak learning rate (AdamW)." in config.read_text()
    capsys.readouterr()
    assert run_cli(["run", str(config)]) == 2
    err = capsys.readouterr().err
    assert "missing training.seed" in err and "missing training.learning_rate" in err
    assert not out.exists()


def test_warmup_ratio_makes_the_steps_transformers_makes(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    """16 examples / 4 a step, 2 epochs: 8 steps; ratio 0.3 is ceil(2.4) = 3 warm-up steps."""
    ratio, steps = tmp_path / "ratio", tmp_path / "steps"

    def args(out: Path, *warmup: str) -> list[str]:
        base = sft_args(toy_model_dir, sft_examples, out, 1, "--epochs", "2")
        i = base.index("--warmup-steps")
        return [*base[:i], *warmup, *base[i + 2 :]]

    assert run_cli(args(ratio, "--warmup-ratio", "0.3")) == 0
    assert run_cli(args(steps, "--warmup-steps", "3")) == 0
    assert (ratio / ADAPTER).read_bytes() == (steps / ADAPTER).read_bytes()
    train = json.loads((ratio / "twinrun.json").read_text())["train"]
    assert (train["warmup_steps"], train["warmup_ratio"]) == (3, 0.3)
    assert "warmup_ratio" not in json.loads((steps / "twinrun.json").read_text())["train"]
    lrs = [json.loads(line)["lr"] for line in (ratio / "metrics.jsonl").read_text().splitlines()]
    assert lrs[:3] == [1e-2 / 3, 1e-2 * 2 / 3, 1e-2]
    assert run_cli(["reproduce", str(ratio), "--output", str(tmp_path / "again")]) == 0
    assert run_cli(args(tmp_path / "both", "--warmup-steps", "2", "--warmup-ratio", "0.3")) == 2
    assert not (tmp_path / "both").exists()


def test_messages_loss_all_trains_more_tokens(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    """The shipped rows mix {messages} and prompt-completion rows: every token of the former
    trained moves the adapter; the run records the switch."""
    assistant, every = tmp_path / "assistant", tmp_path / "all"
    assert run_cli(sft_args(toy_model_dir, sft_examples, assistant, 1)) == 0
    assert run_cli(sft_args(toy_model_dir, sft_examples, every, 1, "--messages-loss", "all")) == 0
    assert (assistant / ADAPTER).read_bytes() != (every / ADAPTER).read_bytes()
    assert json.loads((every / "twinrun.json").read_text())["train"]["messages_loss"] == "all"
    assert "messages_loss" not in json.loads((assistant / "twinrun.json").read_text())["train"]
