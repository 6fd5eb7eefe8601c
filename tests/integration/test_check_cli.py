"""`twinrun check` end to end: real subprocesses (`python -m twinrun tune sft` on the toy model,
and tiny stand-in trainers), the report, --keep, --json and the exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.fake_trainer import fake
from twinrun.cli.main import run_cli
from twinrun.core import pinning, portable


def sft_cmd(model: Path, examples: Path, *extra: str) -> list[str]:
    """`sft_args` (conftest) with the {seed} and {out} placeholders, as a subprocess argv."""
    return [
        sys.executable, "-m", "twinrun", "tune", "sft", "--model", str(model),
        "--examples", str(examples), "--output", "{out}", "--seed", "{seed}", "--epochs", "1",
        "--batch-size", "4", "--accumulation", "1", "--learning-rate", "1e-2",
        "--warmup-steps", "1",
        "--lr-schedule", "cosine", "--lora-rank", "4", "--lora-alpha", "8", "--precision", "f32",
        "--chat-template", "on", "--quiet", "--threads", "1", "--diag", *extra,
    ]  # fmt: skip


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = run_cli(["check", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.slow  # three real SFT runs
def test_unseeded_sampler_fails_and_is_localised(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = tmp_path / "keep"
    cmd = sft_cmd(toy_model_dir, sft_examples, "--inject", "sampler@2")
    rc, out, err = check(capsys, "--keep", str(keep), "--", *cmd)
    lines = out.splitlines()
    assert rc == 1, out + err
    assert lines[0].startswith("step-0 bit-exact: yes (loss ")
    assert lines[1].startswith("same-seed max divergence: ") and "(> tol 0.01)" in lines[1]
    assert "step 2" in lines[1] and "not bit-exact" in lines[1]
    fd = [ln for ln in lines if ln.startswith("FIRST_DIVERGENCE")]
    assert len(fd) == 1 and fd[0].startswith("FIRST_DIVERGENCE: step=2 leaf=batch.sample_indices ")
    # the runs parted although their sidecars agree: no recorded setting or environment explains it
    assert lines[2].startswith("sidecars: the same-seed runs' twinrun.json agree")
    assert lines[-2].startswith("verdict: FAIL (seeds 0,1) — same-seed divergence")
    # the line is the one `twinrun diff` prints for the kept runs
    assert run_cli(["diff", str(keep / "seed-0-a"), str(keep / "seed-0-b")]) == 1
    assert capsys.readouterr().out.splitlines()[0] == fd[0]


def test_failing_command_is_exit_2(
    toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = check(capsys, "--", *sft_cmd(toy_model_dir, sft_examples, "--no-such-flag"))
    assert rc == 2 and out == ""
    assert "seed-0-a (seed 0) exited with status 2" in err
    assert "--no-such-flag" in err  # the last lines of its stderr are shown
    assert "run 2/3" not in err  # nothing more is run after a failure
    rc, _, err = check(capsys, "--", *fake("fail"))
    assert rc == 2 and "exited with status 3" in err and "| RuntimeError: planted failure" in err
    rc, _, err = check(capsys, "--", "no-such-program-twinrun", "{seed}", "{out}")
    assert rc == 2 and "cannot start" in err


def test_a_run_s_own_one_line_error_stays_one_line(
    toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = check(capsys, "--", *sft_cmd(toy_model_dir, sft_examples, "--max-length", "4"))
    assert rc == 2 and out == ""
    (line,) = [ln for ln in err.splitlines() if not ln.startswith("check: run ")]  # progress
    assert line.startswith("twinrun: error: seed-0-a (seed 0) exited with status 2: ")
    assert "row limit of 4" in line and "raise --max-length" in line


def test_keep_on_a_full_disk_is_one_line(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.tiny_disk import tiny_disk

    with tiny_disk(tmp_path / "disk", "64k") as disk:
        keep = disk / "keep"
        rc, out, err = check(capsys, "--quick", "--keep", str(keep), "--",
                             *sft_cmd(toy_model_dir, sft_examples))  # fmt: skip
        assert rc == 2
        (line,) = [ln for ln in err.splitlines() if not ln.startswith("check: run ")]
        assert line.startswith("twinrun: error: seed-0-")
        assert "(seed 0) stopped: no space left on the disk" in line
        assert line.endswith("free some space, or give --keep a directory on another disk")


def test_command_writing_nothing_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = check(capsys, "--", sys.executable, "-c", "pass", "{seed}", "{out}")
    assert rc == 2 and out == "" and "wrote no metrics.jsonl" in err
    rc, _, err = check(capsys, "--", *fake("nothing"))
    assert rc == 2 and "seed-0-a (seed 0)" in err and "no metrics.jsonl" in err


def test_placeholders_and_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = check(capsys, "--", sys.executable, "-c", "pass", "{seed}")
    assert rc == 2 and "no {out} placeholder" in err
    rc, _, err = check(capsys, "--", sys.executable, "-c", "pass", "--output", "{out}")
    assert rc == 2 and "no {seed} placeholder" in err
    rc, _, err = check(capsys)
    assert rc == 2 and "no command" in err
    rc, _, err = check(capsys, "--seeds", "3,3", "--", *fake())
    assert rc == 2 and "equal" in err


def test_stand_in_trainer_json_and_seedless(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = check(capsys, "--json", "--seeds", "5,9", "--", *fake())
    assert rc == 0 and err == ""
    d = json.loads(out)
    assert d["passed"] and d["exit_code"] == 0 and d["fully_bit_exact"]  # wall_s is ignored
    assert d["seeds"] == [5, 9] and d["cross_seed"]["divergence"] == 1.0
    assert [r["label"] for r in d["runs"]] == ["seed-5-a", "seed-5-b", "seed-9"]
    assert not Path(d["runs"][0]["out"]).exists()  # the temporary directory is gone
    # a seed that changes nothing is a failure
    rc, out, _ = check(capsys, "--", *fake("seedless"))
    assert rc == 1
    assert "cross-seed divergence: 0 (<= tol 0.01: the seed changes nothing" in out
    assert out.splitlines()[-1].startswith("verdict: FAIL")
    rc, out, _ = check(capsys, "--json", "--", *fake("fail"))
    d = json.loads(out)
    assert rc == 2 and d["exit_code"] == 2 and "RuntimeError: planted failure" in d["stderr_tail"]


@pytest.mark.slow  # three real SFT runs and one in this process
def test_deterministic_sft_passes_quick_on_its_first_three_steps(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deterministic command passes (`--quick`: its first 3 steps, the full run's own steps),
    its runs kept where --keep says, with their logs; a second --keep there is refused. The full
    check's path is the failing test above."""
    keep = tmp_path / "keep"
    cmd = sft_cmd(toy_model_dir, sft_examples, "--epochs", "2")  # 8 steps planned
    rc, out, err = check(capsys, "--quick", "--keep", str(keep), "--", *cmd)
    assert rc == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "quick: the first 3 steps of each run (--stop-after)"
    assert lines[1].startswith("step-0 bit-exact: yes (loss ")
    loss0 = float(lines[1].removeprefix("step-0 bit-exact: yes (loss ").rstrip(")"))
    assert lines[2].startswith("same-seed max divergence: 0 (<= tol 0.01) — fully bit-exact")
    assert "diag digests at 3 steps" in lines[2]
    assert lines[3].startswith("cross-seed divergence: ") and "distinct trajectory" in lines[3]
    assert not any(ln.startswith("FIRST_DIVERGENCE") for ln in lines)
    assert not any(ln.startswith("sidecars:") for ln in lines)  # they agree; nothing parted
    assert any(ln.startswith("verdict: PASS (seeds 0,1) — bit-exact") for ln in lines)
    assert "run 3/3: seed-1" in err  # progress goes to stderr
    for name in ("seed-0-a", "seed-0-b", "seed-1"):
        assert (keep / name / "metrics.jsonl").is_file() and (keep / name / "diag.jsonl").is_file()
        assert (keep / "logs" / f"{name}.stderr.log").is_file()
    quick_rows = [
        json.loads(x) for x in (keep / "seed-0-a" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in quick_rows] == [0, 1, 2] and quick_rows[0]["loss"] == loss0
    side = json.loads((keep / "seed-0-a" / "twinrun.json").read_text())  # a real run
    assert side["train"]["stop_after"] == 3
    # a portable command's runs pin the portable kernels themselves (the check passes no pin)
    kernels = side["determinism"]["cpu_kernels"]
    assert (kernels["mode"], kernels["aten_capability"]) == ("portable", "AVX2")
    assert (side["metrics"]["steps"], side["metrics"]["planned_steps"]) == (3, 8)
    # the quick steps are the full run's steps: same lr (8-step schedule) and loss bits
    full = tmp_path / "full"
    argv = [a.replace("{seed}", "0").replace("{out}", str(full)) for a in cmd[3:]]
    assert run_cli(argv) == 0
    full_rows = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    for q, f in zip(quick_rows, full_rows[:3], strict=True):
        assert (q["lr"], q["loss"], q["grad_norm"]) == (f["lr"], f["loss"], f["grad_norm"])
    # --keep refuses to run over old runs (before it starts one)
    rc, _, err = check(capsys, "--quick", "--keep", str(keep), "--", *cmd)
    assert rc == 2 and "already exists" in err


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (fake(), "twinrun: error: --quick needs a twinrun training command"),
        (["twinrun", "tune", "sft", "--output", "{out}", "--seed", "{seed}", "--stop-after", "2"],
         "twinrun: error: --quick sets --stop-after itself"),
    ],
)  # fmt: skip
def test_quick_refuses_what_it_cannot_budget(
    capsys: pytest.CaptureFixture[str], cmd: list[str], message: str
) -> None:
    rc, out, err = check(capsys, "--quick", "--", *cmd)
    assert rc == 2 and err.startswith(message) and len(err.strip().splitlines()) == 1


PIN = "ATEN_CPU_CAPABILITY"


def as_the_cli_starts(monkeypatch: pytest.MonkeyPatch, user_set: str | None) -> None:
    """This process as `twinrun check` is at start-up: the user's ATEN_CPU_CAPABILITY (None:
    unset), then the portable pin (`pin_environment`), which keeps a value the user set."""
    monkeypatch.setattr(pinning, "_pinned_here", {})
    monkeypatch.setenv(PIN, user_set or "")  # restored after the test, whatever the pin sets
    if user_set is None:
        monkeypatch.delenv(PIN)
    portable.pin_environment()
    assert os.environ[PIN] == (user_set or "avx2")


@pytest.mark.parametrize("user_set", [None, "avx2", "default"])
def test_check_s_runs_get_the_user_s_environment_not_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    user_set: str | None,
) -> None:  # fmt: skip
    """The portable pin `twinrun check` set at its start-up is not the user's setting: its runs
    are started without it (a native command then runs the machine's kernels, a portable one
    pins them itself); a value the user set reaches every run unchanged."""
    as_the_cli_starts(monkeypatch, user_set)
    rc, out, err = check(capsys, "--keep", str(tmp_path / "keep"), "--", *fake())
    assert rc == 0, out + err
    for name in ("seed-0-a", "seed-0-b", "seed-1"):
        seen = json.loads((tmp_path / "keep" / name / "env.json").read_text())
        assert seen == {PIN: user_set}, name
    assert os.environ[PIN] == (user_set or "avx2")  # this process keeps its own pin


@pytest.mark.slow  # three real SFT runs and one direct run
def test_check_s_native_runs_run_what_the_command_runs_directly(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`check --quick` of a native command: each run records the kernels and writes the adapter
    bytes the same command writes run directly from the user's shell (on an AVX-512 machine the
    pin inherited as the user's setting gave AVX2 kernels and other bytes; on an AVX2-only one
    the kernels agree either way, and the environment test above holds the difference)."""
    as_the_cli_starts(monkeypatch, None)
    cmd = sft_cmd(toy_model_dir, sft_examples, "--cpu-kernels", "native", "--epochs", "2")
    keep = tmp_path / "keep"
    rc, out, err = check(capsys, "--quick", "--keep", str(keep), "--", *cmd)
    assert rc == 0, out + err
    direct = tmp_path / "direct"
    argv = [a.replace("{seed}", "0").replace("{out}", str(direct)) for a in cmd]
    shell = {k: v for k, v in os.environ.items() if k != PIN}  # the user's: no pin
    done = subprocess.run([*argv, "--stop-after", "3"], env=shell, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]

    def ran(run: Path) -> tuple[str, str, str]:
        side = json.loads((run / "twinrun.json").read_text())
        kernels = side["determinism"]["cpu_kernels"]
        return kernels["mode"], kernels["aten_capability"], side["adapter"]["sha256"]

    mode, capability, adapter = ran(direct)
    assert mode == "native" and capability == kernels_of_a_fresh_process(shell)
    assert ran(keep / "seed-0-a") == ran(keep / "seed-0-b") == (mode, capability, adapter)
    assert ran(keep / "seed-1")[:2] == (mode, capability)


def kernels_of_a_fresh_process(env: dict[str, str]) -> str:
    """The CPU capability torch chooses in a fresh process started with `env`."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout.strip()
