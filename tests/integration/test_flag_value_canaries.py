"""A value typed on the command line is never repeated in a usage error (issue 26, item 12): it
may be a secret. For every kind of flag — an integer, a float, a choice (click's and twinrun's
own), a path, a tuple, an unknown flag given `=value`, a flag that takes no value, an extra
argument, an unknown command — the error is one line naming the flag (or the closest real
flag or command) and what it needs, exit status 2, and the canary appears nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.toy_runs import run_args
from twinrun.cli.main import run_cli

CANARY = "sk-live-7f3a9c"  # a short plain word: the old choice errors showed those


def cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(kind, argv, what the line must say)."""
    a_file = tmp / CANARY
    a_file.write_text("a file, where a directory is needed\n")
    sft = run_args("sft", tmp / "model", tmp / "ex.jsonl", tmp / "out")
    return [
        ("int", ["tune", "sft", "--seed", CANARY], "'--seed': needs an integer"),
        ("int", ["toy-model", str(tmp / "t"), "--seed", CANARY], "'--seed': needs an integer"),
        ("int range", ["demo", "--threads", CANARY], "'--threads': needs an integer >= 1"),
        ("float", ["tune", "sft", "--learning-rate", CANARY], "'--learning-rate': not a number"),
        ("float", ["toy-model", "t", "--seed", "1", "--init-std", CANARY],
         "'--init-std': needs a number"),
        ("float", ["diff", "a", "b", "--rel-tol", CANARY], "'--rel-tol': not a number"),
        ("choice", ["evidence", "src", "--require", CANARY], "'--require': needs one of A, B"),
        ("choice", [*sft, "--precision", CANARY], "--precision must be f32 or bf16"),
        ("choice", [*sft, "--lr-schedule", CANARY], "--lr-schedule must be one of"),
        ("choice", [*sft, "--cpu-kernels", CANARY], "--cpu-kernels must be portable or native"),
        ("path", ["init-adapter", str(a_file), "--seed", "1"],
         "'DIRECTORY': needs a directory path, not a file"),
        ("tuple", ["evidence", "src", "--repeat", CANARY, "c.toml"],
         "'--repeat': needs 2 values: an integer, then a file path"),
        ("unknown flag=value", ["tune", "sft", f"--tokn={CANARY}"], "No such option '--tokn'"),
        ("mistyped flag=value", ["tune", "sft", f"--seeed={CANARY}"],
         "No such option '--seeed'. Did you mean '--seed'?"),
        ("short flag", ["tune", "sft", f"-x{CANARY}"], "No such option '-x'"),
        ("flag without value", ["tune", "sft", f"--quiet={CANARY}"],
         "Option '--quiet' does not take a value"),
        ("extra argument", ["generate", CANARY], "got an unexpected extra argument"),
        ("extra argument", ["toy-model", "d", CANARY, "--seed", "1"],
         "got an unexpected extra argument"),
        ("unknown command", [CANARY], "no such command — see 'twinrun --help'"),
        ("unknown command", ["tune", CANARY], "no such command — see 'twinrun tune --help'"),
        ("mistyped command", ["tnue"], "no such command (did you mean 'tune'?)"),
    ]  # fmt: skip


def test_no_flag_value_is_echoed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kinds = set()
    for kind, argv, says in cases(tmp_path):
        capsys.readouterr()
        rc = run_cli(argv)
        got = capsys.readouterr()
        line = got.err.strip()
        assert rc == 2, (kind, argv, line)
        assert CANARY not in got.out + got.err, (kind, argv, line)
        assert "\n" not in line and line.startswith("twinrun: error: "), (kind, line)
        assert says in line, (kind, line)
        kinds.add(kind)
    assert {"int", "float", "choice", "path", "unknown flag=value", "extra argument"} <= kinds
