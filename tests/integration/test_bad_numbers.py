"""Every number of every training command, given a bad value (inf, nan, 1e309, out of range, wrong
type) on the command line or in a TOML config, stops the run with one line naming the flag or the
key, and nothing is written. `diff` and `check` refuse non-finite tolerances and timeouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testkit.captures import grpo_source, write_toml
from twinrun.cli.main import run_cli
from twinrun.config.run import SETTINGS
from twinrun.config.setting import Setting

VALID: dict[str, dict[str, str]] = {
    "common": {
        "--model": "m", "--examples": "e.jsonl", "--seed": "1", "--batch-size": "2",
        "--learning-rate": "0.01", "--warmup-steps": "0", "--lr-schedule": "cosine",
        "--lora-rank": "4",
        "--lora-alpha": "8", "--precision": "f32", "--chat-template": "off", "--threads": "1",
    },
    "epochs": {"--epochs": "1", "--accumulation": "1"},
    "grpo": {
        "--steps": "1", "--prompts-per-step": "2", "--group-size": "2", "--max-new-tokens": "2",
        "--temperature": "1.0", "--clip-eps": "0.2", "--advantage-clip": "5", "--token-cap": "2",
        "--env": "arithmetic",
    },
}  # fmt: skip


def valid_args(objective: str) -> dict[str, str]:
    args = dict(VALID["common"])
    args |= VALID["grpo"] if objective == "grpo" else VALID["epochs"]
    if objective == "dpo":
        args["--beta"] = "0.1"
    return args


def bad_values(s: Setting) -> list[str]:
    """Values outside what `s` declares, as the command line spells them."""
    if s.kind == "float":
        out = ["inf", "-inf", "nan", "1e309", "abc"]
        if s.low is not None:
            out.append(str(s.low) if s.low_open else str(s.low - 1))
        if s.high is not None:
            out.append(str(s.high) if s.high_open else str(s.high + 1))
        return out
    out = ["abc", "1.5", "99999999999999999999"]
    if s.low is not None:
        out.append(str(int(s.low) - 1))
    return out


def cases() -> list[tuple[str, str, str]]:
    out = []
    for objective in ("sft", "dpo", "reward", "grpo"):
        for s in SETTINGS.values():
            if s.flag and objective in s.objectives and s.kind in ("int", "float"):
                out += [(objective, s.option, v) for v in bad_values(s)]
    return out


@pytest.mark.parametrize(("objective", "flag", "value"), cases())
def test_each_bad_number_is_one_line_and_writes_nothing(
    objective: str, flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = valid_args(objective)
    args[flag] = value
    if flag in ("--spike-factor", "--spike-window"):  # they go together
        args.setdefault("--spike-factor", "2")
        args.setdefault("--spike-window", "2")
    if flag.startswith("--replay-"):
        args["--replay"] = "per"
        defaults = {"--replay-capacity": "4", "--replay-alpha": "0.5", "--replay-beta": "0.5",
                    "--replay-fraction": "0.5"}  # fmt: skip
        args = defaults | args
    out = tmp_path / "out"
    argv = ["tune", objective, "--output", str(out)] + [x for kv in args.items() for x in kv]
    code = run_cli(argv)
    err = capsys.readouterr().err
    assert code != 0
    assert err.startswith("twinrun: error:") and err.count("\n") == 1, err
    assert flag in err, err
    assert "internal error" not in err
    assert not out.exists()


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e309", "abc"])
@pytest.mark.parametrize("flag", ["--rel-tol", "--abs-tol"])
def test_diff_tolerances_must_be_finite(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["diff", str(tmp_path / "a"), str(tmp_path / "b"), flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinrun: error:") and flag in err and err.count("\n") == 1


@pytest.mark.parametrize(("flag", "value"), [("--timeout", "nan"), ("--timeout", "inf"),
                                             ("--timeout", "0"), ("--tol", "nan"),
                                             ("--tol", "-1e-3")])  # fmt: skip
def test_check_numbers_must_be_finite(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["check", flag, value, "--", "x", "{seed}", "{out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinrun: error:") and flag in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["generate", "--temperature", "inf"], "--temperature"),
        (["generate", "--temperature", "nan"], "--temperature"),
        (["generate", "--steer-scale", "1e309"], "--steer-scale"),
        (["init-adapter", "d", "--lora-alpha", "inf"], "--lora-alpha"),
    ],
)
def test_other_commands_refuse_non_finite(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinrun: error:") and flag in err and "finite" in err


def toml_cases() -> list[tuple[str, Any, str]]:
    """(TOML key, bad value, what the error says) for every number a GRPO config holds."""
    numbers = {
        "training.seed": -1, "training.learning_rate": 0.05, "training.warmup_steps": 0,
        "training.batch_size": 4, "model.lora_rank": 4, "model.lora_alpha": 8,
        "grpo.prompts_per_step": 2, "grpo.group_size": 4, "grpo.max_new_tokens": 4,
        "grpo.temperature": 1.0, "grpo.clip_eps": 0.2, "grpo.advantage_clip": 5.0,
        "grpo.token_cap": 3, "backend.options.threads": 1, "training.max_steps": 1,
        "model.lora_dropout": 0.1,
    }  # fmt: skip
    out: list[tuple[str, Any, str]] = []
    for key in numbers:
        out += [(key, "hf_SECRET", "(got a string)")]
        if key.split(".")[-1] in ("learning_rate", "lora_alpha", "temperature", "clip_eps",
                                  "advantage_clip", "lora_dropout"):  # fmt: skip
            out += [(key, float("inf"), "finite"), (key, float("nan"), "finite")]
            out += [(key, -1.5, "must be")]
        else:
            out += [(key, -1, "must be"), (key, 2**63, "must be"), (key, 1.5, "integer")]
        if key == "model.lora_dropout":
            out += [(key, 1.0, "must be in [0, 1), got 1.0")]
    return out


@pytest.mark.parametrize(("key", "value", "says"), toml_cases(), ids=str)
def test_toml_bad_numbers_name_the_key(
    key: str, value: Any, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    doc = grpo_source(tmp_path / "m", tmp_path / "e.jsonl", "arithmetic", None, out)
    doc["optimizer_batch"]["capture"] = False
    node = doc
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    assert run_cli(["run", str(write_toml(tmp_path / "c.toml", doc))]) != 0
    err = capsys.readouterr().err
    assert err.startswith("twinrun: error:") and err.count("\n") == 1, err
    assert f"{key} " in err and says in err, err
    assert "SECRET" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--lora-targets", "q_proj,,v_proj"], "--lora-targets must name at least one module"),
        (["--lora-targets", "all-linear,q_proj"], "--lora-targets: all-linear stands alone"),
        (["--lora-targets", "q_proj;rm -rf"], "--lora-targets must be module names"),
        (["--lora-targets", "q_proj,q_proj"], "--lora-targets names a module twice"),
        (["--attention", "flash"], "--attention must be one of eager, sdpa, blockwise"),
        (["--max-length", "0"], "--max-length must be >= 1, got 0"),
        (["--precision", "https://u:SECRET@h/"], "--precision must be f32 or bf16"),
    ],
)
def test_model_settings_are_checked(
    extra: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = valid_args("sft")
    argv = ["tune", "sft", "--output", str(tmp_path / "o"), *extra]
    assert run_cli(argv + [x for kv in args.items() if kv[0] not in extra for x in kv]) == 2
    err = capsys.readouterr().err
    assert says in err and "SECRET" not in err, err
    assert not (tmp_path / "o").exists()


def test_model_settings_in_toml(tmp_path: Path) -> None:
    from twinrun.config.toml import load_toml, resolved_tree

    doc = grpo_source(tmp_path / "m", tmp_path / "e.jsonl", "arithmetic", None, tmp_path / "o")
    doc["optimizer_batch"]["capture"] = False
    doc["model"] |= {"lora_targets": "all-linear", "attention": "sdpa"}
    doc["training"]["max_length"] = 64
    run = load_toml(write_toml(tmp_path / "c.toml", doc))
    assert run.cfg.lora_targets == ["all-linear"] and run.cfg.attention == "sdpa"
    assert run.cfg.max_length == 64
    tree = resolved_tree(run)
    assert tree["model"]["lora_targets"] == ["all-linear"] and tree["training"]["max_length"] == 64
    doc["model"]["lora_targets"] = ["q_proj", "v_proj"]
    del doc["model"]["attention"], doc["training"]["max_length"]
    run = load_toml(write_toml(tmp_path / "c.toml", doc))
    assert run.cfg.lora_targets == ["q_proj", "v_proj"] and run.cfg.attention == "eager"
    assert run.cfg.max_length is None


def test_a_wrong_type_is_named_not_echoed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = grpo_source(tmp_path / "m", tmp_path / "e.jsonl", "arithmetic", None, tmp_path / "o")
    doc["environment"]["args"] = "https://u:SECRET@h/?token=SECRET"
    doc["training"]["seed"] = "SECRET-seed"
    assert run_cli(["run", str(write_toml(tmp_path / "c.toml", doc))]) == 2
    err = capsys.readouterr().err
    assert "environment.args must be a table (got a string)" in err
    assert "training.seed must be an integer (got a string)" in err
    assert "SECRET" not in err and not (tmp_path / "o").exists()
