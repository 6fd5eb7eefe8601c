"""The input checks of a run are one list (`train.preflight.CHECKS`): a check added there refuses
a `tune` command, a `twinrun run` config and a library call of `train` alike, before anything is
written, fails `twinrun explain`'s inputs check, and runs once per run whichever way it came."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testkit.captures import write_toml
from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli
from twinrun.config.resolved import ValidRun
from twinrun.core.errors import ConfigError
from twinrun.train.setup import preflight


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A check added to the list: it records the runs it saw and refuses every one."""
    seen: list[str] = []

    def refuse(run: ValidRun) -> None:
        seen.append(run.output)
        raise ConfigError("the planted check refuses this run", "remove the planted check")

    monkeypatch.setattr(preflight, "CHECKS", [*preflight.CHECKS, refuse])
    return seen


def sft_toml(model: Path, examples: Path, out: Path) -> dict[str, Any]:
    """A one-epoch SFT config for `twinrun run`."""
    return {
        "training": {"trainer": "sft", "seed": 1, "epochs": 1, "batch_size": 4,
                     "accumulation": 1, "learning_rate": 1e-2, "warmup_steps": 1,
                     "lr_schedule": "cosine", "precision": "f32"},
        "model": {"path": str(model), "chat_template": "on", "lora_rank": 4, "lora_alpha": 8},
        "data": {"examples": str(examples)},
        "backend": {"devices": "cpu", "options": {"threads": 1}},
        "logging": {"dir": str(out)},
    }  # fmt: skip


def refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = capsys.readouterr().err
    assert err == (
        "twinrun: error: the planted check refuses this run — remove the planted check\n"
    ), err


def test_a_check_added_once_refuses_every_way_a_run_comes(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, planted: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    cli_out, toml_out, lib_out = tmp_path / "cli", tmp_path / "toml", tmp_path / "lib"
    capsys.readouterr()
    assert run_cli(sft_args(toy_model_dir, sft_examples, cli_out, 1)) == 2
    refused(capsys)
    config = write_toml(tmp_path / "sft.toml", sft_toml(toy_model_dir, sft_examples, toml_out))
    assert run_cli(["explain", str(config), "--json"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["inputs"]["status"] == "fail"
    assert checks["inputs"]["detail"] == (
        "the planted check refuses this run — remove the planted check"
    )
    assert checks["steps"]["status"] == "skip"  # made from rows the checks did not hand on
    assert run_cli(["run", str(config)]) == 2
    refused(capsys)
    from twinrun.config.resolved import validate
    from twinrun.config.run import RunConfig
    from twinrun.train.recipes import train

    cfg = RunConfig(objective="sft", model=str(toy_model_dir), examples=str(sft_examples),
                    output=str(lib_out), seed=1, epochs=1, batch_size=4, accumulation=1,
                    learning_rate=1e-2, warmup_steps=1, lr_schedule="cosine", lora_rank=4,
                    lora_alpha=8.0, precision="f32", chat_template="on", threads=1,
                    quiet=True)  # fmt: skip
    with pytest.raises(ConfigError, match="the planted check refuses this run"):
        train(validate(cfg))
    assert planted == [str(cli_out), str(toml_out), str(toml_out), str(lib_out)]  # explain, run
    for out in (cli_out, toml_out, lib_out):
        assert not out.exists() or not any(out.iterdir()), out


def test_a_command_runs_the_list_once(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    monkeypatch.setattr(preflight, "CHECKS", [*preflight.CHECKS, lambda run: seen.append("x")])
    assert run_cli(sft_args(toy_model_dir, sft_examples, tmp_path / "run", 1)) == 0
    assert seen == ["x"]  # before torch, not again in the session


def test_the_data_is_read_once_and_handed_on(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks read the examples and the evaluation examples (every row's shape checked) and
    the session trains and evaluates on what they read: whichever module asks, each file is read
    once per run."""
    import sys

    import twinrun.data.examples

    original = twinrun.data.examples.load_rows
    reads: list[str] = []

    def counted(path: Path | str, *more: object) -> object:
        reads.append(str(path))
        return original(path, *more)  # type: ignore[arg-type]

    importers = [m for m in list(sys.modules.values()) if getattr(m, "load_rows", None) is original]
    assert twinrun.data.examples in importers and len(importers) > 1
    for module in importers:  # the reader's module and every module that imports it
        monkeypatch.setattr(module, "load_rows", counted)
    held_out = tmp_path / "eval.jsonl"
    held_out.write_bytes(sft_examples.read_bytes())
    evaluated = ("--eval-examples", str(held_out), "--eval-every", "1")
    assert run_cli(sft_args(toy_model_dir, sft_examples, tmp_path / "cli", 1, *evaluated)) == 0
    assert sorted(reads) == sorted([str(sft_examples), str(held_out)])
    assert (tmp_path / "cli" / "twinrun.json").is_file()
    reads.clear()
    config = write_toml(
        tmp_path / "sft.toml", sft_toml(toy_model_dir, sft_examples, tmp_path / "toml")
    )
    assert run_cli(["run", str(config)]) == 0  # its steps are counted from the rows read, too
    assert reads == [str(sft_examples)]
    assert (tmp_path / "toml" / "twinrun.json").is_file()
    reads.clear()
    from twinrun.config.resolved import validate
    from twinrun.config.run import RunConfig
    from twinrun.train.recipes import train

    cfg = RunConfig(objective="sft", model=str(toy_model_dir), examples=str(sft_examples),
                    output=str(tmp_path / "lib"), seed=1, epochs=1, batch_size=4,
                    accumulation=1, learning_rate=1e-2, warmup_steps=1, lr_schedule="cosine",
                    lora_rank=4, lora_alpha=8.0, precision="f32", chat_template="on", threads=1,
                    quiet=True, eval_examples=str(held_out), eval_every=1)  # fmt: skip
    record = train(validate(cfg))  # a library call runs the checks itself, and hands data on
    assert (tmp_path / "lib" / "adapter_model.safetensors").is_file()
    assert sorted(reads) == sorted([str(sft_examples), str(held_out)])
    assert record["eval"]["examples"] == len(original(held_out))  # evaluated on what was read
