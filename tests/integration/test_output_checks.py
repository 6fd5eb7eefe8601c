"""Outputs are checked before the work (issue 26, item 5): an output that is a symbolic link
(to a finished run, or dangling), under a regular file, in a directory this process cannot
write, or a foreign directory given to `--overwrite`, is refused in one line with exit status 2
before any model is loaded, any input read or hashed, or any run started — and nothing existing
changes. Every command that writes files is covered: tune sft/grpo, run (TOML), tune evaluate,
extract, init-adapter, toy-model, check --keep, reproduce."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# Modules that bind an EXPENSIVE function by name when first imported (`from twinrun.model.loading
# import model_sha256`, `... import load_rows`): imported here, before a test patches it, so none
# of them keeps the patched function for later tests.
import twinrun.capture.hashing  # noqa: F401
import twinrun.dispatch.reproduce  # noqa: F401
import twinrun.infer.inputs  # noqa: F401
import twinrun.model.build  # noqa: F401
import twinrun.train.outputs.resume_check  # noqa: F401
import twinrun.train.setup.preflight  # noqa: F401
import twinrun.train.setup.session  # noqa: F401
from testkit.captures import write_toml
from testkit.toy_runs import run_args, write_examples
from tests.integration.test_overwrite_safety import snapshot
from twinrun.cli.main import run_cli

CASES = ("symlink", "dangling", "under-file", "unwritable", "foreign")
EXPENSIVE = (  # what must not run before the output is checked
    "twinrun.model.build.build_model",
    "twinrun.model.loading.read_model_config",
    "twinrun.model.loading.model_sha256",
    "twinrun.model.tokens.load_tokenizer",
    "twinrun.data.examples.load_rows",
    "twinrun.train.setup.run_data.load_rows",
    "twinrun.train.setup.preflight.read_model_config",
    "twinrun.dispatch.reproduce.model_sha256",
    "twinrun.harness._run_plan",
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> dict[str, Path]:
    """Examples, a TOML run config, and a finished run (the target of links, the run that
    `reproduce` re-runs)."""
    folder = tmp_path_factory.mktemp("inputs")
    files = write_examples(folder)
    done = folder / "finished"
    assert run_cli(run_args("sft", toy_model_dir, files["sft"], done)) == 0
    toml = write_toml(folder / "sft.toml", {
        "training": {"trainer": "sft", "seed": 1, "epochs": 1, "batch_size": 4,
                     "accumulation": 1, "learning_rate": 0.01, "warmup_steps": 0,
                     "lr_schedule": "constant", "precision": "f32"},
        "model": {"path": str(toy_model_dir), "chat_template": "on", "lora_rank": 4,
                  "lora_alpha": 8},
        "data": {"examples": str(files["sft"])},
        "backend": {"devices": "cpu", "options": {"threads": 1}},
        "logging": {"dir": str(folder / "unused")},
    })  # fmt: skip
    return {**files, "finished": done, "toml": toml}


def argv(command: str, model: Path, inputs: dict[str, Path], out: Path) -> list[str]:
    """The command writing to `out` (a directory, or the file a report/extract writes)."""
    common = ["--model", str(model), "--chat-template", "on", "--precision", "f32",
              "--threads", "1", "--batch-size", "2"]  # fmt: skip
    if command in ("sft", "grpo"):
        return run_args(command, model, inputs[command], out, "--overwrite")
    if command == "run":
        return ["run", str(inputs["toml"]), "--output", str(out), "--quiet"]
    if command == "evaluate":
        return ["tune", "evaluate", *common, "--examples", str(inputs["sft"]),
                "--output", str(out), "--quiet"]  # fmt: skip
    if command == "extract":
        return ["extract", *common, "--examples", str(inputs["sft"]), "--layer", "1",
                "--pool", "last", "--output", str(out), "--quiet"]  # fmt: skip
    if command == "init-adapter":
        return ["init-adapter", str(out), "--model", str(model), "--seed", "1",
                "--lora-rank", "4", "--lora-alpha", "8"]  # fmt: skip
    if command == "toy-model":
        return ["toy-model", str(out), "--seed", "3", "--overwrite"]
    if command == "check":
        return ["check", "--keep", str(out), "--", "twinrun", "tune", "sft", "--seed",
                "{seed}", "--output", "{out}"]  # fmt: skip
    if command == "export":
        return ["export", str(inputs["finished"]), "--output", str(out), "--overwrite"]
    if command == "plot":
        return ["plot", str(inputs["finished"]), "--output", str(out)]
    assert command == "reproduce"
    return ["reproduce", str(inputs["finished"]), "--output", str(out), "--overwrite"]


FILE_OUTPUTS = {"evaluate": "report.json", "extract": "hidden.safetensors", "plot": "curves.png"}
COMMANDS = ("sft", "grpo", "run", "evaluate", "extract", "init-adapter", "toy-model", "check",
            "reproduce", "export", "plot")  # fmt: skip
EXPECTED = {
    "symlink": "is a symbolic link (to ",
    "dangling": "is a symbolic link (to ",
    "under-file": "which is a file and not a directory",
    "unwritable": "is not writable by this process",
}


def make_case(case: str, root: Path, name: str, finished: Path) -> Path:
    """The hostile output for `case` under `root`, named `name` (`unwritable`: a 0o500
    directory, which root can still write: there the test answers os.access as for a user)."""
    if case == "symlink":
        (root / name).symlink_to(finished)  # a finished run: --overwrite must not touch it
    elif case == "dangling":
        (root / name).symlink_to(root / "nowhere" / "deep")
    elif case == "under-file":
        (root / "a-file").write_text("a regular file\n")
        return root / "a-file" / name
    elif case == "unwritable":
        locked = root / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        return locked / name
    else:  # foreign: someone's directory with a twinrun-looking name in it
        (root / name).mkdir()
        (root / name / "notes.txt").write_text("mine\n")
        (root / name / "metrics.jsonl").write_text('{"step": 0}\n')
    return root / name


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_output_is_refused_before_the_work(
    tmp_path: Path,
    toy_model_dir: Path,
    inputs: dict[str, Path],
    command: str,
    case: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if case == "foreign" and command in ("check", "toy-model"):
        pytest.skip("check --keep adds its runs beside foreign files; toy-model is in test_toy")
    root = tmp_path / "root"
    root.mkdir()
    name = FILE_OUTPUTS.get(command, "out")
    out = make_case(case, root, name, inputs["finished"])
    before, kept = snapshot(root), snapshot(inputs["finished"])
    for target in EXPENSIVE:
        monkeypatch.setattr(target, refuse(target))
    if case == "unwritable" and os.geteuid() == 0:  # root writes into a 0o500 directory:
        monkeypatch.setattr(os, "access", not_for(root / "locked"))  # the kernel's answer
    capsys.readouterr()
    try:
        rc = run_cli(argv(command, toy_model_dir, inputs, out))
    finally:
        if case == "unwritable":
            (root / "locked").chmod(0o700)
    got = capsys.readouterr()
    lines = (got.out + got.err).strip()
    assert rc == 2, lines
    assert "\n" not in lines and "internal error" not in lines, lines
    if case in EXPECTED:
        assert EXPECTED[case] in lines, lines
    elif command in FILE_OUTPUTS:  # a foreign directory where a report file goes
        assert "is a directory, not a file" in lines or "exists" in lines, lines
    else:
        assert any(
            says in lines
            for says in ("which twinrun did not write", "is not empty", "not an export twinrun")
        ), lines
    assert snapshot(root) == before and snapshot(inputs["finished"]) == kept


def refuse(target: str) -> Callable[..., None]:
    def called(*_: object, **__: object) -> None:
        raise AssertionError(f"{target} ran before the output was checked")

    return called


def not_for(locked: Path) -> Callable[..., bool]:
    """os.access as an unprivileged user sees it: `locked` (mode 0o500) is not writable."""
    real = os.access

    def access(path: object, mode: int, *args: object, **kwargs: object) -> bool:
        if Path(str(path)) == locked and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)  # type: ignore[arg-type]

    return access
