"""`reproduce` and `export` check the run directory's adapter before they trust it: the bytes the
sidecar records, readable, float32, finite, and the adapter_config.json that describes them.
Each refusal is one line naming the file, exit 2, and nothing is written to --output."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.toy_runs import sha256_of
from twinrun.cli.main import run_cli

ADAPTER = "adapter_model.safetensors"


def copy_run(run: Path, dest: Path, change: Callable[[Path], None], repin: bool = False) -> Path:
    """A copy of `run` changed by `change`; `repin` writes the changed adapter's SHA256 into the
    sidecar (a forger who updates the record too)."""
    shutil.copytree(run, dest)
    change(dest)
    if repin:
        side = json.loads((dest / "twinrun.json").read_text())
        side["adapter"]["sha256"] = sha256_of(dest / ADAPTER)
        (dest / "twinrun.json").write_text(json.dumps(side))
    return dest


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    text = (captured.out + captured.err).strip()
    assert "Traceback" not in text, text
    return text


def rewrite_adapter(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(run: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(run / ADAPTER))
        edit(tensors)
        save_file(tensors, str(run / ADAPTER))

    return change


def nan_first(tensors: dict) -> None:
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")


def f16_lora_a(tensors: dict) -> None:
    name = next(n for n in sorted(tensors) if "lora_A" in n)
    tensors[name] = tensors[name].half()


def truncate(run: Path) -> None:
    data = (run / ADAPTER).read_bytes()
    (run / ADAPTER).write_bytes(data[:100])


def empty(run: Path) -> None:
    (run / ADAPTER).write_bytes(b"")


def huge_header(run: Path) -> None:
    (run / ADAPTER).write_bytes(struct.pack("<Q", 1 << 40) + b"{}")


def alpha_800(run: Path) -> None:
    cfg = json.loads((run / "adapter_config.json").read_text())
    cfg["lora_alpha"] = 800
    (run / "adapter_config.json").write_text(json.dumps(cfg))


def rank_8(run: Path) -> None:
    cfg = json.loads((run / "adapter_config.json").read_text())
    cfg["r"] = 8
    (run / "adapter_config.json").write_text(json.dumps(cfg))


def broken_config(run: Path) -> None:
    (run / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4')


def reproduce(run: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    rc = run_cli(["reproduce", str(run), "--output", str(out)])
    return rc, one_line(capsys)


def test_reproduce_refuses_a_swapped_adapter(
    sft_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = sft_runs["c"] / ADAPTER  # another seed's adapter

    def swap(run: Path) -> None:
        shutil.copyfile(other, run / ADAPTER)

    run = copy_run(sft_runs["a"], tmp_path / "run", swap)
    rc, text = reproduce(run, tmp_path / "again", capsys)
    assert rc == 2 and "could not run" in text and ADAPTER in text, text
    assert "REPRODUCED" not in text and not (tmp_path / "again").exists()


def test_reproduce_refuses_a_truncated_adapter(
    sft_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(sft_runs["a"], tmp_path / "run", truncate)
    rc, text = reproduce(run, tmp_path / "again", capsys)
    assert rc == 2 and ADAPTER in text and "REPRODUCED" not in text, text
    assert len(text.splitlines()) == 1


def test_reproduce_refuses_a_sidecar_whose_seed_and_sha_were_forged_together(
    sft_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = json.loads((sft_runs["c"] / "twinrun.json").read_text())

    def forge(run: Path) -> None:
        side = json.loads((run / "twinrun.json").read_text())
        side["train"]["seed"] = c["train"]["seed"]
        side["adapter"]["sha256"] = c["adapter"]["sha256"]
        (run / "twinrun.json").write_text(json.dumps(side))

    run = copy_run(sft_runs["a"], tmp_path / "run", forge)
    rc, text = reproduce(run, tmp_path / "again", capsys)
    assert rc == 2 and ADAPTER in text and c["adapter"]["sha256"] in text, text


def test_reproduce_of_an_untouched_copy_still_reproduces(
    sft_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(sft_runs["a"], tmp_path / "run", lambda run: None)
    rc, text = reproduce(run, tmp_path / "again", capsys)
    assert rc == 0 and "REPRODUCED" in text, text


EXPORT_CASES = {
    "another run's adapter": (
        lambda run, runs: shutil.copyfile(runs["c"] / ADAPTER, run / ADAPTER),
        False,
        "Expected sha256",
    ),
    "NaN": (lambda run, runs: rewrite_adapter(nan_first)(run), True, "not finite"),
    "lora_A as f16": (lambda run, runs: rewrite_adapter(f16_lora_a)(run), True, "float16"),
    "truncated": (lambda run, runs: truncate(run), True, "not a readable safetensors"),
    "empty": (lambda run, runs: empty(run), True, "not a readable safetensors"),
    "huge header": (lambda run, runs: huge_header(run), True, "not a readable safetensors"),
    "lora_alpha 8 -> 800": (lambda run, runs: alpha_800(run), False, "lora_alpha"),
    "r 4 -> 8": (lambda run, runs: rank_8(run), False, "adapter_config.json"),
    "broken config": (lambda run, runs: broken_config(run), False, "adapter_config.json"),
}


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_export_refuses_an_adapter_it_cannot_trust(
    sft_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    change, repin, needle = EXPORT_CASES[case]
    run = copy_run(sft_runs["a"], tmp_path / "run", lambda run: change(run, sft_runs), repin)
    out = tmp_path / "merged"
    capsys.readouterr()
    rc = run_cli(["export", str(run), "--output", str(out)])
    text = one_line(capsys)
    assert rc == 2, text
    assert needle in text, text
    assert len(text.splitlines()) == 1, text
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".merged")]


HUGE_ENV = '''
class Huge:
    """Rewards of +-1e308 (or 2e9): finite floats whose spread overflows the group's std."""

    def __init__(self, value):
        self.value = float(value)
        self.calls = 0

    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        self.calls += 1
        return self.value if self.calls % 2 else -self.value


def make(value="1e308"):
    return Huge(value)
'''


@pytest.mark.parametrize("value", ["1e308", "2e9"])
def test_grpo_rewards_past_the_bound_stop_the_step_in_one_line(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str], value: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from testkit.toy_runs import run_args, write_examples

    data = write_examples(tmp_path / "data")
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "twinrun_huge_env.py").write_text(HUGE_ENV)
    monkeypatch.syspath_prepend(str(tmp_path / "plug"))
    out = tmp_path / "run"
    args = run_args("grpo", toy_model_dir, data["grpo"], out)
    args[args.index("--env") + 1] = "twinrun_huge_env:make"
    capsys.readouterr()
    rc = run_cli([*args, "--env-arg", f"value={value}"])
    text = one_line(capsys)
    assert rc == 2, text
    assert "twinrun_huge_env" in text and f"{float(value)!r}" in text, text
    assert len(text.splitlines()) == 1, text
    assert not (out / ADAPTER).exists()


@pytest.fixture(scope="module")
def reward_runs(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> dict[str, Path]:
    """Two one-epoch reward runs of the toy (seeds 0 and 1): their heads have the same shape."""
    from dataclasses import replace

    from twinrun.golden.suite import common, run_settings, write_inputs
    from twinrun.train.recipes import train

    root = tmp_path_factory.mktemp("reward")
    settings = run_settings(write_inputs(root), "cpu")["reward"]
    runs = {}
    for name, seed in (("a", 0), ("b", 1)):
        train(replace(common(toy_model_dir, root / name, "reward", **settings), seed=seed))
        runs[name] = root / name
    return runs


HEAD = "reward_head.safetensors"


def test_the_sidecar_pins_the_reward_head(reward_runs: dict[str, Path]) -> None:
    side = json.loads((reward_runs["a"] / "twinrun.json").read_text())
    assert side["reward_head"]["sha256"] == sha256_of(reward_runs["a"] / HEAD)


@pytest.mark.parametrize("command", ["reproduce", "export"])
def test_a_swapped_reward_head_is_refused(
    reward_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    def swap(run: Path) -> None:
        shutil.copyfile(reward_runs["b"] / HEAD, run / HEAD)

    run = copy_run(reward_runs["a"], tmp_path / "run", swap)
    out = tmp_path / "out"
    capsys.readouterr()
    rc = run_cli([command, str(run), "--output", str(out)])
    text = one_line(capsys)
    assert rc == 2 and HEAD in text and "Expected sha256" in text, text
    assert len(text.splitlines()) == 1 and not out.exists()
