"""Hostile inputs to training and resume: what is hashed is what is loaded, damaged safetensors
and checkpoints are one line (never a traceback, never a silent run), checkpoints verify
themselves. Every case asserts the line, the exit code and that nothing existing changed."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from tests.integration.test_resume import assert_same_run, cli
from tests.integration.test_resume_inputs import snapshot
from twinrun.cli.main import run_cli

EXTRA = ("--diag", "--checkpoint-every", "1")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("twinrun: error: ") and "internal error" not in err, err
    return err


def copy_model(toy_model_dir: Path, where: Path) -> Path:
    shutil.copytree(toy_model_dir, where)
    return where


def killed(model: Path, examples: Path, run: Path, at: int = 2) -> list[str]:
    """A run SIGKILLed while writing checkpoint `at` (so `at - 1` complete checkpoints)."""
    args = sft_args(model, examples, run, 1, *EXTRA)
    res = cli(args, {"TWINRUN_CRASH_AT": f"checkpoint-mid-write:{at}"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    return args


# --- item 6: the model hash is what is loaded ---------------------------------------------


def test_index_pointing_outside_the_model_dir_is_refused(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors import safe_open

    model = copy_model(toy_model_dir, tmp_path / "model")
    with safe_open(str(model / "model.safetensors"), framework="pt") as fh:
        names = list(fh.keys())
    shutil.move(model / "model.safetensors", tmp_path / "outside.safetensors")
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "../outside.safetensors")}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    before = snapshot(tmp_path)
    out = tmp_path / "run"
    assert run_cli(sft_args(model, sft_examples, out, 1)) == 2
    err = one_line(capsys)
    assert "names a shard outside" in err and "../outside.safetensors" in err
    assert not out.exists() and snapshot(tmp_path) == before


def test_swapped_shard_is_caught_on_resume(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from twinrun.model.toy import write_toy_checkpoint

    model = copy_model(toy_model_dir, tmp_path / "model")
    run = tmp_path / "run"
    args = killed(model, sft_examples, run)
    write_toy_checkpoint(tmp_path / "other", seed=1)
    shutil.copy(tmp_path / "other" / "model.safetensors", model / "model.safetensors")
    before = snapshot(run)
    assert run_cli([*args, "--resume"]) == 2
    assert "model sha256" in one_line(capsys)
    assert snapshot(run) == before


def test_byte_identical_copy_elsewhere_resumes_bit_exactly(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    first = copy_model(toy_model_dir, tmp_path / "a" / "model")
    moved = copy_model(toy_model_dir, tmp_path / "b" / "elsewhere")
    (moved / ".DS_Store").write_bytes(b"never read by the loader")
    ref = tmp_path / "ref"
    assert run_cli(sft_args(moved, sft_examples, ref, 1, *EXTRA)) == 0
    run = tmp_path / "run"
    args = killed(first, sft_examples, run)
    args[args.index("--model") + 1] = str(moved)
    assert run_cli([*args, "--resume"]) == 0
    assert_same_run(ref, run)  # adapter_config.json names the model path: the one resumed on


# --- items 7 and 10: damaged safetensors and checkpoints are one line ----------------------


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def huge_header(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes((1 << 40).to_bytes(8, "little") + data[8:])


@pytest.mark.parametrize(
    "damage",
    [lambda p: truncate(p), lambda p: truncate(p, 0.0005), lambda p: flip_byte(p, 9), huge_header],
    ids=["truncated", "truncated-header", "bit-flipped-header", "huge-header"],
)
def test_damaged_base_weights_are_one_line(
    tmp_path: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    capsys: pytest.CaptureFixture[str],
    damage: object,
) -> None:
    model = copy_model(toy_model_dir, tmp_path / "model")
    damage(model / "model.safetensors")  # type: ignore[operator]
    before = snapshot(tmp_path)
    assert run_cli(sft_args(model, sft_examples, tmp_path / "run", 1)) == 2
    err = one_line(capsys)
    assert "model.safetensors is not a readable safetensors file (model weights" in err
    assert "re-download or re-save the checkpoint" in err
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("run")} == before


@pytest.fixture(scope="module")
def two_checkpoints(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path
) -> tuple[Path, list[str]]:
    """A run killed while writing checkpoint 3: step-000001 and step-000002 are complete."""
    run = tmp_path_factory.mktemp("two") / "run"
    return run, killed(toy_model_dir, sft_examples, run, at=3)


def damaged_copy(two_checkpoints: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, list[str]]:
    src, args = two_checkpoints
    run = tmp_path / "run"
    shutil.copytree(src, run)
    args = list(args)
    args[args.index("--output") + 1] = str(run)
    return run, args


def rewrite_state(ckpt: Path, change: object) -> None:
    """Change state.safetensors and list the new checksums, so only validation can catch it."""
    from safetensors.torch import load_file, save_file

    from twinrun.train.outputs.checkpoint_check import CHECKSUMS, write_checksums

    tensors = load_file(str(ckpt / "state.safetensors"))
    change(tensors)  # type: ignore[operator]
    save_file(
        tensors, str(ckpt / "state.safetensors"), metadata={"format": "twinrun.checkpoint.v1"}
    )
    (ckpt / CHECKSUMS).unlink()
    write_checksums(ckpt)


def _nan_moment(t: dict) -> None:
    t["optim.0.exp_avg"][0] = float("nan")


def _drop_moment(t: dict) -> None:
    del t["optim.0.exp_avg"]


def _f64_moment(t: dict) -> None:
    t["optim.0.exp_avg_sq"] = t["optim.0.exp_avg_sq"].double()


def _short_moment(t: dict) -> None:
    t["optim.1.exp_avg"] = t["optim.1.exp_avg"][:-1].clone()


def _inf_param(t: dict) -> None:
    key = next(k for k in sorted(t) if k.startswith("param."))
    t[key].view(-1)[0] = float("inf")


def _edit_steps_done(ckpt: Path) -> None:
    state = json.loads((ckpt / "state.json").read_text())
    state["steps_done"] = 3
    (ckpt / "state.json").write_text(json.dumps(state) + "\n")


CHECKPOINT_DAMAGE = {
    "bit-flipped tensors": (lambda c: flip_byte(c / "state.safetensors", -3), "Expected sha256"),
    "truncated tensors": (lambda c: truncate(c / "state.safetensors"), "Expected sha256"),
    "edited steps_done": (_edit_steps_done, "state.json: Expected sha256"),
    "no checksums": (lambda c: (c / "checksums.json").unlink(), "has no checksums.json"),
    "extra file": (lambda c: (c / "notes.txt").write_text("x"), "files not listed ['notes.txt']"),
    "NaN moment": (lambda c: rewrite_state(c, _nan_moment), "optim.0.exp_avg holds a value"),
    "missing moment": (lambda c: rewrite_state(c, _drop_moment), "lacks ['optim.0.exp_avg']"),
    "f64 moment": (lambda c: rewrite_state(c, _f64_moment), "optim.0.exp_avg_sq is torch.float64"),
    "short moment": (lambda c: rewrite_state(c, _short_moment), "optim.1.exp_avg is torch.float32"),
    "inf parameter": (lambda c: rewrite_state(c, _inf_param), "is not finite"),
    "huge header": (
        lambda c: rewrite_state(c, lambda t: None) or huge_header(c / "state.safetensors"),
        "Expected sha256",
    ),
}


@pytest.mark.parametrize("case", sorted(CHECKPOINT_DAMAGE))
def test_corrupt_checkpoint_refuses_resume_and_names_the_one_before(
    tmp_path: Path,
    two_checkpoints: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    run, args = damaged_copy(two_checkpoints, tmp_path)
    damage, expected = CHECKPOINT_DAMAGE[case]
    damage(run / "checkpoints" / "step-000002")
    before = snapshot(run)
    assert run_cli([*args, "--resume"]) == 2
    err = one_line(capsys)
    assert "checkpoint step-000002 is corrupt (" in err and expected in err, err
    assert "to resume from step-000001" in err
    assert snapshot(run) == before


def test_huge_header_with_matching_checksum_is_corrupt(
    tmp_path: Path, two_checkpoints: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    from twinrun.train.outputs.checkpoint_check import CHECKSUMS, write_checksums

    run, args = damaged_copy(two_checkpoints, tmp_path)
    ckpt = run / "checkpoints" / "step-000002"
    huge_header(ckpt / "state.safetensors")
    (ckpt / CHECKSUMS).unlink()
    write_checksums(ckpt)
    before = snapshot(run)
    assert run_cli([*args, "--resume"]) == 2
    err = one_line(capsys)
    assert "is corrupt (" in err and "is not a readable safetensors file (checkpoint state" in err
    assert snapshot(run) == before


def test_only_checkpoint_corrupt_says_restart(
    tmp_path: Path, two_checkpoints: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    run, args = damaged_copy(two_checkpoints, tmp_path)
    shutil.rmtree(run / "checkpoints" / "step-000002")
    flip_byte(run / "checkpoints" / "step-000001" / "state.safetensors", -3)
    before = snapshot(run)
    assert run_cli([*args, "--resume"]) == 2
    err = one_line(capsys)
    assert "checkpoint step-000001 is corrupt" in err and "restart the run with --overwrite" in err
    assert snapshot(run) == before


def test_deleting_the_corrupt_checkpoint_resumes_bit_exactly(
    tmp_path: Path,
    two_checkpoints: tuple[Path, list[str]],
    toy_model_dir: Path,
    sft_examples: Path,
) -> None:
    run, args = damaged_copy(two_checkpoints, tmp_path)
    flip_byte(run / "checkpoints" / "step-000002" / "state.safetensors", -3)
    assert run_cli([*args, "--resume"]) == 2
    shutil.rmtree(run / "checkpoints" / "step-000002")  # what the hint says to do
    assert run_cli([*args, "--resume"]) == 0
    ref = tmp_path / "ref"
    assert run_cli(sft_args(toy_model_dir, sft_examples, ref, 1, *EXTRA)) == 0
    assert_same_run(ref, run)


def test_garbage_lock_is_one_line(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    (tmp_path / ".run.twinrun-lock").write_text("99999999999\n")
    before = snapshot(tmp_path)
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1)) == 2
    assert "holds '99999999999\\n', not a process id" in one_line(capsys)
    assert snapshot(tmp_path) == before


def test_safetensors_disk_full_is_the_disk_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors import SafetensorError

    from twinrun.cli import main

    def full(*_args: object, **_kwargs: object) -> None:
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")  # fmt: skip

    monkeypatch.setattr(main.cli, "main", full)
    assert run_cli(["tune", "sft"]) == 2
    err = one_line(capsys)
    assert "No space left on device — free some space and rerun" in err


@pytest.fixture(scope="module")
def adapter_run(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path
) -> Path:
    run = tmp_path_factory.mktemp("adapter") / "run"
    assert run_cli(sft_args(toy_model_dir, sft_examples, run, 1)) == 0
    return run


@pytest.mark.parametrize(
    "damage",
    [lambda p: truncate(p), lambda p: flip_byte(p, 9), huge_header],
    ids=["truncated", "bit-flipped-header", "huge-header"],
)
def test_damaged_adapter_is_one_line(
    tmp_path: Path,
    adapter_run: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    capsys: pytest.CaptureFixture[str],
    damage: object,
) -> None:
    from tests.integration.test_evaluate_generate_cli import eval_args

    adapter = tmp_path / "adapter"
    shutil.copytree(adapter_run, adapter)
    damage(adapter / "adapter_model.safetensors")  # type: ignore[operator]
    before = snapshot(tmp_path)
    out = tmp_path / "report.json"
    assert run_cli(eval_args(toy_model_dir, sft_examples, out, 4, "--adapter", str(adapter))) == 2
    err = one_line(capsys)
    assert "adapter_model.safetensors is not a readable safetensors file (adapter weights" in err
    assert not out.exists() and snapshot(tmp_path) == before


def integer_dtype_in_header(path: Path) -> None:
    """Relabel the first F32 tensor as I32: the same size, so only the dtype is wrong."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    path.write_bytes(data[:8] + data[8 : 8 + n].replace(b'"F32"', b'"I32"', 1) + data[8 + n :])


def test_integer_base_weights_are_refused(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = copy_model(toy_model_dir, tmp_path / "model")
    integer_dtype_in_header(model / "model.safetensors")
    before = snapshot(tmp_path)
    assert run_cli(sft_args(model, sft_examples, tmp_path / "run", 1)) == 2
    err = one_line(capsys)
    assert "model.safetensors: model weights" in err and "is I32, not floating point" in err
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("run")} == before


def _nan_adapter(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    next(iter(tensors.values())).view(-1)[0] = float("nan")
    save_file(tensors, str(path))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [(integer_dtype_in_header, "is not finite floating point (torch.int32)"),
     (_nan_adapter, "is not finite floating point (torch.float32)")],
    ids=["integer", "nan"],
)  # fmt: skip
def test_adapter_with_bad_values_is_one_line(
    tmp_path: Path,
    adapter_run: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    capsys: pytest.CaptureFixture[str],
    damage: object,
    expected: str,
) -> None:
    from tests.integration.test_evaluate_generate_cli import eval_args

    adapter = tmp_path / "adapter"
    shutil.copytree(adapter_run, adapter)
    damage(adapter / "adapter_model.safetensors")  # type: ignore[operator]
    before = snapshot(tmp_path)
    out = tmp_path / "report.json"
    assert run_cli(eval_args(toy_model_dir, sft_examples, out, 4, "--adapter", str(adapter))) == 2
    assert expected in one_line(capsys)
    assert not out.exists() and snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("head", "expected"),
    [("truncated", "reward_head.safetensors is not a readable safetensors file (reward head"),
     ("two rows", "not a reward head (no finite [1, hidden] score.weight)"),
     ("nan", "not a reward head (no finite [1, hidden] score.weight)")],
)  # fmt: skip
def test_damaged_reward_head_is_one_line(
    tmp_path: Path,
    adapter_run: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    capsys: pytest.CaptureFixture[str],
    head: str,
    expected: str,
) -> None:
    import torch
    from safetensors.torch import save_file

    from tests.integration.test_evaluate_generate_cli import eval_args

    adapter = tmp_path / "adapter"
    shutil.copytree(adapter_run, adapter)
    weight = torch.zeros(2 if head == "two rows" else 1, 64)
    weight[0, 0] = float("nan") if head == "nan" else 0.0
    path = adapter / "reward_head.safetensors"
    save_file({"score.weight": weight}, str(path))
    if head == "truncated":
        truncate(path)
    before = snapshot(tmp_path)
    out = tmp_path / "report.json"
    assert run_cli(eval_args(toy_model_dir, sft_examples, out, 4, "--adapter", str(adapter))) == 2
    assert expected in one_line(capsys)
    assert not out.exists() and snapshot(tmp_path) == before
