"""Checkpoints, bit-exact resume after SIGKILL, prefetch, spike reruns (issue 6)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli
from twinrun.core.ledger import LEDGER, read_listed
from twinrun.data.examples import shipped_examples


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows]


def assert_same_run(a: Path, b: Path) -> None:
    for name in ("adapter_model.safetensors", "adapter_config.json", "diag.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert metrics(a) == metrics(b)


def cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "twinrun", *args], capture_output=True,
                          text=True, env=(os.environ | (env or {})))  # fmt: skip


def test_sigkill_after_second_checkpoint_then_resume(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    extra = ("--diag", "--checkpoint-every", "1", "--epochs", "3")
    ref, run = tmp_path / "ref", tmp_path / "killed"
    args = sft_args(toy_model_dir, sft_examples, ref, 1, *extra)
    assert run_cli(args) == 0
    args = sft_args(toy_model_dir, sft_examples, run, 1, *extra)
    proc = subprocess.Popen([sys.executable, "-m", "twinrun", *args[:]])
    deadline = time.monotonic() + 600  # a hang: far from the seconds two steps take
    while not (run / "checkpoints" / "step-000002").is_dir():
        assert proc.poll() is None, "the run ended before its second checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "twinrun.json").exists()  # it really was interrupted
    legacy = run.parent / "legacy"  # the same killed run, as a twinrun without the list left it
    shutil.copytree(run, legacy)
    (legacy / LEDGER).unlink()
    assert run_cli([*args, "--resume"]) == 0
    assert_same_run(ref, run)
    assert read_listed(run) == read_listed(ref)  # the resume went on listing what it wrote
    legacy_args = sft_args(toy_model_dir, sft_examples, legacy, 1, *extra)
    assert run_cli([*legacy_args, "--resume"]) == 0
    assert_same_run(ref, legacy)
    assert {"twinrun.inputs.json", "checkpoints", "diag.jsonl"} <= (read_listed(legacy) or set())
    for done in (run, legacy):  # either is now a run --overwrite may replace
        assert run_cli([*sft_args(toy_model_dir, sft_examples, done, 1), "--overwrite"]) == 0


def test_kill_during_checkpoint_write_is_never_taken(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    extra = ("--diag", "--checkpoint-every", "1")
    ref, run = tmp_path / "ref", tmp_path / "killed"
    assert run_cli(sft_args(toy_model_dir, sft_examples, ref, 1, *extra)) == 0
    args = sft_args(toy_model_dir, sft_examples, run, 1, *extra)
    res = cli(args, {"TWINRUN_CRASH_AT": "checkpoint-mid-write:2"})
    assert res.returncode == -signal.SIGKILL
    leftovers = [p.name for p in (run / "checkpoints").iterdir()]
    assert "step-000001" in leftovers and "step-000002" not in leftovers
    assert any(name.startswith(".tmp-step-000002") for name in leftovers)  # the torn write
    from twinrun.train.outputs.checkpoint import newest_checkpoint

    assert newest_checkpoint(run).steps_done == 1  # type: ignore[union-attr]
    assert run_cli([*args, "--resume"]) == 0
    assert_same_run(ref, run)


@pytest.mark.parametrize("objective", ["dpo", "reward", "grpo"])
def test_resume_other_objectives(tmp_path: Path, toy_model_dir: Path, objective: str) -> None:
    from tests.integration.test_grpo_cli import grpo_args
    from tests.integration.test_pairs_cli import pair_args

    if objective == "grpo":
        ex = shipped_examples("arith.jsonl")
        extra = ("--env", "arithmetic", "--replay", "per", "--replay-capacity", "8",
                 "--replay-alpha", "0.6", "--replay-beta", "0.4", "--replay-fraction", "0.5",
                 "--checkpoint-every", "1")  # fmt: skip

        def make(out: Path) -> list[str]:
            return grpo_args(toy_model_dir, ex, out, 1, *extra)
    else:
        ex = tmp_path / "pairs.jsonl"
        ex.write_text("\n".join(shipped_examples("pairs.jsonl").read_text().splitlines()[:6]))

        def make(out: Path) -> list[str]:
            return pair_args(objective, toy_model_dir, ex, out, 1, 2, "--checkpoint-every", "1")

    ref, run = tmp_path / "ref", tmp_path / "killed"
    assert run_cli(make(ref)) == 0
    res = cli(make(run), {"TWINRUN_CRASH_AT": "checkpoint-mid-write:2"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert run_cli([*make(run), "--resume"]) == 0
    assert_same_run(ref, run)


def test_resume_refuses_changed_flags_and_missing_checkpoints(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = sft_args(toy_model_dir, sft_examples, run, 1, "--checkpoint-every", "1")
    assert run_cli(args) == 0
    changed = [*args, "--resume"]
    changed[changed.index("--learning-rate") + 1] = "0.5"
    assert run_cli(changed) == 2
    err = capsys.readouterr().err
    assert "learning_rate" in err and "--resume" in err
    assert run_cli([*sft_args(toy_model_dir, sft_examples, tmp_path / "new", 1), "--resume"]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_prefetch_changes_no_byte(tmp_path: Path, toy_model_dir: Path, sft_examples: Path) -> None:
    a, b = tmp_path / "p0", tmp_path / "p4"
    assert run_cli(sft_args(toy_model_dir, sft_examples, a, 1, "--diag", "--prefetch", "0")) == 0
    assert run_cli(sft_args(toy_model_dir, sft_examples, b, 1, "--diag", "--prefetch", "4")) == 0
    assert_same_run(a, b)
    from tests.integration.test_pairs_cli import pair_args

    ex = shipped_examples("pairs.jsonl")
    for name, depth in (("d0", "0"), ("d4", "4")):
        assert run_cli(pair_args("dpo", toy_model_dir, ex, tmp_path / name, 1, 4,
                                 "--prefetch", depth)) == 0  # fmt: skip
    assert_same_run(tmp_path / "d0", tmp_path / "d4")


@pytest.fixture(scope="module")
def spiky(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """15 identical easy rows and one of noise; a seed that puts the noise at step >= 5."""
    from twinrun.data.batching import plan_steps

    rows = [{"prompt": "say a", "completion": "a" * 24} for _ in range(15)]
    rows.append({"prompt": "say a", "completion": "q7#Zk!2vP@9xL&4m^Rw0$Ty"})
    p = tmp_path_factory.mktemp("spike") / "spiky.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for seed in range(100):
        step = next(s.step for s in plan_steps(16, 1, 1, 1, seed) if 15 in s.indices)
        if step >= 6:
            return p, seed, step
    raise AssertionError("no seed puts the noisy row late")


def spike_args(model: Path, ex: Path, out: Path, seed: int, *extra: str) -> list[str]:
    args = sft_args(model, ex, out, seed, "--spike-factor", "1.2", "--spike-window", "3", *extra)
    args[args.index("--batch-size") + 1] = "1"
    args[args.index("--learning-rate") + 1] = "5e-2"
    return args


def test_planted_spike_is_intrinsic_and_rng_glitch_transient(
    tmp_path: Path, toy_model_dir: Path, spiky: tuple[Path, int, int]
) -> None:
    ex, seed, step = spiky
    assert run_cli(spike_args(toy_model_dir, ex, tmp_path / "a", seed)) == 0
    side = json.loads((tmp_path / "a" / "twinrun.json").read_text())
    spikes = {s["step"]: s for s in side["metrics"]["spikes"]}
    assert spikes[step]["kind"] == "intrinsic"
    assert spikes[step]["rerun_loss"] == spikes[step]["loss"]
    assert metrics(tmp_path / "a")[step]["spike"] == "intrinsic"
    assert run_cli(spike_args(toy_model_dir, ex, tmp_path / "b", seed, "--inject",
                              f"rng@{step}")) == 0  # fmt: skip
    side = json.loads((tmp_path / "b" / "twinrun.json").read_text())
    spikes = {s["step"]: s for s in side["metrics"]["spikes"]}
    assert spikes[step]["kind"] == "transient"


def test_diag_rows_are_on_disk_before_each_checkpoint(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """diag rows are written as each step ends; a checkpoint of N steps finds N rows written."""
    import twinrun.train.hooks.checkpoint as checkpoint_hook

    out, seen = tmp_path / "run", []
    write = checkpoint_hook.write_checkpoint

    def checked(run: Path, steps_done: int, *args: object, **kwargs: object) -> Path:
        seen.append(((run / "diag.jsonl").read_text().count("\n"), steps_done))
        return write(run, steps_done, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint_hook, "write_checkpoint", checked)
    assert (
        run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--diag", "--checkpoint-every", "2"))
        == 0
    )
    assert seen and all(rows == steps for rows, steps in seen)
