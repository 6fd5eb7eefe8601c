"""`--init-adapter` is checked as `reproduce` and `export` check a run's adapter
(`model.adapter_check`): readable safetensors, float32, finite, and an
adapter_config.json that parses and has the tensors' rank; and it must be of the run's rank and
alpha. Each refusal is one line naming the file, exit 2, before training and with nothing
written; all but the finite check (which reads the tensors) before torch is imported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli

ADAPTER = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
HINT = "write it again with `twinrun init-adapter`, or give an adapter a run wrote"


@pytest.fixture(scope="module")
def init_dir(toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initial adapter of rank 4, alpha 8, written by `twinrun init-adapter`."""
    init = tmp_path_factory.mktemp("init") / "init"
    assert run_cli(["init-adapter", str(init), "--model", str(toy_model_dir), "--seed", "7",
                    "--lora-rank", "4", "--lora-alpha", "8"]) == 0  # fmt: skip
    return init


def rewrite(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(init: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(init / ADAPTER))
        edit(tensors)
        save_file(tensors, str(init / ADAPTER))

    return change


def first_a(tensors: dict) -> str:
    return next(n for n in sorted(tensors) if "lora_A" in n)


def set_first(value: float) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        name = first_a(tensors)
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] = value

    return edit


def half(tensors: dict) -> None:
    tensors[first_a(tensors)] = tensors[first_a(tensors)].half()


def set_config(**changes: object) -> Callable[[Path], None]:
    def change(init: Path) -> None:
        cfg = json.loads((init / CONFIG).read_text())
        cfg.update(changes)
        (init / CONFIG).write_text(json.dumps(cfg))

    return change


def first_a_name(init: Path) -> str:
    from twinrun.core.safetensors_io import tensor_spans

    return next(n for n in sorted(tensor_spans(init / ADAPTER, "a", "h")) if "lora_A" in n)


def copy_init(init: Path, dest: Path, change: Callable[[Path], None]) -> Path:
    shutil.copytree(init, dest)
    change(dest)
    return dest


# the cases the headers and the config show: refused in the preflight, before torch loads
HEADER_CASES: dict[str, tuple[Callable[[Path], None], Callable[[Path], str]]] = {
    "truncated": (
        lambda d: (d / ADAPTER).write_bytes((d / ADAPTER).read_bytes()[:100]),
        lambda d: (
            f"{d / ADAPTER} is not a readable safetensors file (initial adapter weights: "
            "header length runs past the end of the file)"
        ),
    ),
    "empty": (
        lambda d: (d / ADAPTER).write_bytes(b""),
        lambda d: (
            f"{d / ADAPTER} is not a readable safetensors file (initial adapter weights: "
            "shorter than a safetensors header)"
        ),
    ),
    "not safetensors": (
        lambda d: (d / ADAPTER).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json"),
        lambda d: (
            f"{d / ADAPTER} is not a readable safetensors file (initial adapter weights: "
            "Expecting value: line 1 column 1 (char 0))"
        ),
    ),
    "lora_A as float16": (
        rewrite(half),
        lambda d: f"{d / ADAPTER}: {first_a_name(d)} is stored as float16, twinrun writes float32",
    ),
    "r 4 -> 8 in the config": (
        set_config(r=8),
        lambda d: f"{d / CONFIG}: r is 8 but {ADAPTER} holds {first_a_name(d)} of shape (4, 64)",
    ),
}

# the cases that need the tensors' values: refused in the session, before the model loads
SESSION_CASES: dict[str, tuple[Callable[[Path], None], Callable[[Path], str]]] = {
    "NaN": (
        rewrite(set_first(float("nan"))),
        lambda d: f"{d / ADAPTER}: {first_a_name(d)} holds a value that is not finite (NaN or Inf)",
    ),
    "Inf": (
        rewrite(set_first(float("inf"))),
        lambda d: f"{d / ADAPTER}: {first_a_name(d)} holds a value that is not finite (NaN or Inf)",
    ),
}


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    text = (captured.out + captured.err).strip()
    assert "Traceback" not in text, text
    assert len(text.splitlines()) == 1, text
    return text


@pytest.mark.parametrize("case", sorted(HEADER_CASES) + sorted(SESSION_CASES))
def test_a_damaged_init_adapter_is_refused_in_one_line_naming_the_file(
    init_dir: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    change, expected = (HEADER_CASES | SESSION_CASES)[case]
    init = copy_init(init_dir, tmp_path / "init", change)
    before = {p.name: p.read_bytes() for p in init.iterdir()}
    out = tmp_path / "out"
    capsys.readouterr()
    rc = run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--init-adapter", str(init)))
    text = one_line(capsys)
    assert rc == 2, text
    assert text == f"twinrun: error: {expected(init)} — {HINT}"
    assert not out.exists()
    assert {p.name: p.read_bytes() for p in init.iterdir()} == before  # nothing touched


def test_a_broken_config_is_refused_naming_it(
    init_dir: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    init = copy_init(
        init_dir, tmp_path / "init", lambda d: (d / CONFIG).write_text('{"peft_type": "LORA", "r"')
    )
    out = tmp_path / "out"
    capsys.readouterr()
    rc = run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--init-adapter", str(init)))
    text = one_line(capsys)
    assert rc == 2, text
    assert text.startswith(f"twinrun: error: cannot read {init / CONFIG}: "), text
    assert not out.exists()


def test_header_refusals_come_before_torch_loads(
    init_dir: Path, toy_model_dir: Path, sft_examples: Path, tmp_path: Path
) -> None:
    argvs, lines = [], []
    for i, case in enumerate(sorted(HEADER_CASES)):
        change, expected = HEADER_CASES[case]
        init = copy_init(init_dir, tmp_path / f"init{i}", change)
        argvs.append(
            sft_args(toy_model_dir, sft_examples, tmp_path / "out", 1, "--init-adapter", str(init))
        )
        lines.append(f"twinrun: error: {expected(init)} — {HINT}")
    code = (
        "import json, sys; from twinrun.cli.main import run_cli; "
        f"print(json.dumps([[run_cli(a), 'torch' in sys.modules] for a in {argvs!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) == [[2, False]] * len(argvs), done.stderr
    assert done.stderr.strip().splitlines() == lines
    assert not (tmp_path / "out").exists()


def test_flags_of_another_rank_or_alpha_are_refused_before_torch_loads(
    init_dir: Path, toy_model_dir: Path, sft_examples: Path, tmp_path: Path
) -> None:
    """The run's --lora-rank / --lora-alpha are compared with the adapter's config before torch
    loads; a broken config is refused there too."""
    broken = copy_init(
        init_dir, tmp_path / "broken", lambda d: (d / CONFIG).write_text('{"peft_type": "LORA"')
    )
    out = tmp_path / "out"

    def args(init: Path, rank: str, alpha: str) -> list[str]:
        argv = sft_args(toy_model_dir, sft_examples, out, 1, "--init-adapter", str(init))
        argv[argv.index("--lora-rank") + 1], argv[argv.index("--lora-alpha") + 1] = rank, alpha
        return argv

    argvs = [args(init_dir, "8", "8"), args(init_dir, "4", "16"), args(broken, "4", "8")]
    code = (
        "import json, sys; from twinrun.cli.main import run_cli; "
        f"print(json.dumps([[run_cli(a), 'torch' in sys.modules] for a in {argvs!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) == [[2, False]] * 3, done.stderr
    lines = done.stderr.strip().splitlines()
    flags = "— make the LoRA flags match the adapter"
    assert lines[:2] == [
        f"twinrun: error: adapter {init_dir} has rank 4 alpha 8, the run asks for rank 8 "
        f"alpha 8.0 {flags}",
        f"twinrun: error: adapter {init_dir} has rank 4 alpha 8, the run asks for rank 4 "
        f"alpha 16.0 {flags}",
    ]
    assert lines[2].startswith(f"twinrun: error: cannot read {broken / CONFIG}: "), lines[2]
    assert len(lines) == 3 and not out.exists()


def test_an_untouched_init_adapter_still_trains(
    init_dir: Path, toy_model_dir: Path, sft_examples: Path, tmp_path: Path
) -> None:
    init = copy_init(init_dir, tmp_path / "init", lambda d: None)
    out = tmp_path / "out"
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--init-adapter", str(init))) == 0
    assert (out / ADAPTER).is_file()


def test_resume_refuses_an_init_adapter_changed_since_the_run_started(
    init_dir: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A resume re-reads the init adapter: its SHA256 (the inputs record) refuses a changed one
    first, so a damaged adapter is never trained on, and nothing of the run is touched."""
    init = copy_init(init_dir, tmp_path / "init", lambda d: None)
    out = tmp_path / "out"
    args = sft_args(
        toy_model_dir, sft_examples, out, 1, "--init-adapter", str(init), "--checkpoint-every", "1"
    )
    assert run_cli(args) == 0
    rewrite(set_first(float("nan")))(init)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    capsys.readouterr()
    rc = run_cli([*args, "--resume"])
    text = one_line(capsys)
    assert rc == 2, text
    assert text.startswith("twinrun: error: --resume with inputs that differ from the recorded run")
    assert "init_adapter sha256" in text, text
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
