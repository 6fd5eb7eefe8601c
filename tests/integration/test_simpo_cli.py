"""`twinrun tune simpo` end to end on the toy model: its first and a later step's loss recomputed
independently with transformers + PEFT from per-token log-probs (no reference model), the same
bytes twice and other bytes than IPO's on the same pairs, its settings where the loss declares
them, and `--defaults trl` taking TRL's CPOConfig numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from twinrun.cli.main import run_cli
from twinrun.data.examples import load_rows, shipped_examples
from twinrun.data.pairs import encode_pairs
from twinrun.model.tokens import load_tokenizer

BETA, GAMMA = 2.0, 0.5


def args(model: Path, examples: Path, out: Path, objective: str, epochs: int) -> list[str]:
    margin = ["--gamma", str(GAMMA)] if objective == "simpo" else []
    return [
        "tune", objective, "--model", str(model), "--examples", str(examples), "--output",
        str(out), "--seed", "3", "--epochs", str(epochs), "--batch-size", "4",
        "--accumulation", "1", "--learning-rate", "5e-2", "--warmup-steps", "0",
        "--lr-schedule", "constant", "--lora-rank", "4", "--lora-alpha", "8",
        "--precision", "f32", "--chat-template", "on", "--beta", str(BETA), *margin,
        "--quiet", "--threads", "1",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("simpo")
    examples = root / "pairs4.jsonl"
    lines = shipped_examples("pairs.jsonl").read_text().splitlines()[:4]
    examples.write_text("\n".join(lines) + "\n")
    out = {"examples": examples}
    for name, objective, epochs in (
        ("one", "simpo", 1), ("again", "simpo", 1), ("two", "simpo", 2), ("ipo", "ipo", 1),
    ):  # fmt: skip
        assert run_cli(args(toy_model_dir, examples, root / name, objective, epochs)) == 0
        out[name] = root / name
    return out


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def simpo_by_hand(model: torch.nn.Module, pairs: list) -> float:
    """The mean over the pairs of -logsigmoid(beta * (pc - pr) - gamma), pc and pr each side's
    mean completion-token log-prob under `model`, in float64."""

    def per_token(ids: tuple[int, ...], mask: tuple[int, ...]) -> float:
        x = torch.tensor([ids])
        logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].double(), -1)
        picked = logp.gather(1, x[0, 1:, None])[:, 0]
        m = torch.tensor(mask[1:], dtype=torch.float64)
        return float((picked * m).sum() / m.sum())

    out = []
    with torch.no_grad():
        for p in pairs:
            pc = per_token(p.chosen.input_ids, p.chosen.loss_mask)
            pr = per_token(p.rejected.input_ids, p.rejected.loss_mask)
            out.append(math.log1p(math.exp(-(BETA * (pc - pr) - GAMMA))))
    return sum(out) / len(out)


def test_the_first_and_a_later_step_are_simpo_recomputed_with_peft(
    runs: dict[str, Path], toy_model_dir: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(toy_model_dir)
    pairs = encode_pairs(tok, load_rows(runs["examples"]), True, 10_000)
    base = AutoModelForCausalLM.from_pretrained(toy_model_dir, torch_dtype=torch.float32).eval()
    first, second = losses(runs["two"])
    assert first == losses(runs["one"])[0]
    # LoRA's B starts at zero: the first step's policy is the base model
    assert first == pytest.approx(simpo_by_hand(base, pairs), rel=1e-5)
    # the one-step run's adapter is the two-step run's after step 0 (constant lr, same seed)
    policy = PeftModel.from_pretrained(base, str(runs["one"])).eval()
    assert second != first  # the update moved the log-probs
    assert second == pytest.approx(simpo_by_hand(policy, pairs), rel=1e-4)


def test_same_bytes_twice_and_not_ipos(runs: dict[str, Path]) -> None:
    name = "adapter_model.safetensors"
    assert (runs["one"] / name).read_bytes() == (runs["again"] / name).read_bytes()
    assert (runs["one"] / name).read_bytes() != (runs["ipo"] / name).read_bytes()
    train = json.loads((runs["one"] / "twinrun.json").read_text())["train"]
    assert (train["objective"], train["beta"], train["gamma"]) == ("simpo", BETA, GAMMA)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["tune", "simpo", "--beta", "2"], "missing required flags:"),
        (["tune", "dpo", "--gamma", "0.5"], "'--gamma': a flag of twinrun tune simpo, not of "
         "tune dpo."),
    ],
)  # fmt: skip
def test_gamma_is_simpos_alone(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    if argv[1] == "simpo":
        assert "--gamma" in err


def test_a_negative_margin_is_refused(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = args(toy_model_dir, tmp_path / "e.jsonl", tmp_path / "o", "simpo", 1)
    argv[argv.index("--gamma") + 1] = "-1"
    capsys.readouterr()
    assert run_cli(argv) == 2
    assert "--gamma must be >= 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_defaults_trl_takes_cpo_configs_numbers(tmp_path: Path, toy_model_dir: Path) -> None:
    lines = shipped_examples("pairs.jsonl").read_text().splitlines()[:8]
    examples = tmp_path / "pairs8.jsonl"
    examples.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    argv = ["tune", "simpo", "--model", str(toy_model_dir), "--examples", str(examples),
            "--output", str(out), "--defaults", "trl", "--stop-after", "1", "--quiet",
            "--cpu-kernels", "portable"]  # fmt: skip
    assert run_cli(argv) == 0
    record = json.loads((out / "twinrun.json").read_text())
    assert (record["train"]["beta"], record["train"]["gamma"]) == (0.1, 0.5)
    assert record["train"]["learning_rate"] == 1e-6
    assert record["defaults"]["config"] == "CPOConfig"
    assert record["defaults"]["taken"]["gamma"]["source"] == "CPOConfig.simpo_gamma"
