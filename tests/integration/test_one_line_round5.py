"""Issue 50, item 6: failures that were internal errors are one line, non-zero, with nothing
written or lost — a sidecar whose sections are lists, a file list nested 100,000 deep, a
file-size limit under `export` and `toy-model`, a full disk in `export` (the path named), a
memory limit (said to be memory, not a path), an MCP tool schema holding NaN."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from tests.tiny_disk import tiny_disk
from twinrun.cli.main import run_cli
from twinrun.core.ledger import LEDGER, read_listed
from twinrun.rl.tool_base import Guard, ToolEnvironmentError

SRC = str(Path(__file__).resolve().parents[2] / "src")


def one_line(err: str) -> str:
    err = err.strip()
    assert "\n" not in err and "internal error" not in err and "Traceback" not in err, err
    assert err.startswith("twinrun: error: "), err
    return err


def tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under `root` and its bytes (None for a folder)."""
    return {
        p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> Path:
    """A finished 1-step SFT run of 4 rows."""
    from twinrun.data.examples import shipped_examples

    root = tmp_path_factory.mktemp("round5")
    rows = root / "sft4.jsonl"
    rows.write_text("\n".join(shipped_examples("sft.jsonl").read_text().splitlines()[:4]) + "\n")
    out = root / "run"
    args = sft_args(toy_model_dir, rows, out, 1)
    args[args.index("--warmup-steps") + 1] = "0"
    assert run_cli(args) == 0
    return out


def copy_run(run: Path, dest: Path) -> Path:
    dest.mkdir()
    for p in run.iterdir():
        (dest / p.name).write_bytes(p.read_bytes())
    return dest


# -- a sidecar whose sections are not objects ---------------------------------------------------


@pytest.mark.parametrize("section", ["train", "inputs", "model", "determinism"])
@pytest.mark.parametrize("command", ["reproduce", "export"])
def test_a_sidecar_section_that_is_a_list_is_one_line(
    tmp_path: Path, finished_run: Path, capsys: pytest.CaptureFixture[str], section: str,
    command: str,
) -> None:  # fmt: skip
    run = copy_run(finished_run, tmp_path / "run")
    record = json.loads((run / "twinrun.json").read_text())
    record[section] = [1, 2]
    (run / "twinrun.json").write_text(json.dumps(record))
    before = tree(tmp_path)
    code = run_cli([command, str(run), "--output", str(tmp_path / "out")])
    assert code == 2
    said = capsys.readouterr()
    line = (said.out + said.err).strip()  # reproduce reports on stdout, export on stderr
    assert "\n" not in line and "internal error" not in line, line
    assert f"the sidecar's {section} section is a list, not an object" in line, line
    assert tree(tmp_path) == before  # nothing written, nothing lost


def test_diff_names_a_list_shaped_section_in_one_line(tmp_path: Path, finished_run: Path) -> None:
    from twinrun.core.errors import DataError
    from twinrun.diag.recorded import recorded_between

    run = copy_run(finished_run, tmp_path / "run")
    record = json.loads((run / "twinrun.json").read_text())
    record["train"] = ["a"]
    (run / "twinrun.json").write_text(json.dumps(record))
    with pytest.raises(DataError, match="the sidecar's train section is a list, not an object"):
        recorded_between(finished_run, run)


def test_resume_from_an_inputs_record_whose_train_is_a_list_is_one_line(
    tmp_path: Path, finished_run: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(finished_run, tmp_path / "run")
    (run / "twinrun.json").unlink()  # a run stopped before it finished: --resume reads its record
    record = json.loads((run / "twinrun.inputs.json").read_text())
    record["train"] = [1, "a"]
    (run / "twinrun.inputs.json").write_text(json.dumps(record))
    before = tree(tmp_path)
    args = sft_args(toy_model_dir, finished_run.parent / "sft4.jsonl", run, 1, "--resume")
    args[args.index("--warmup-steps") + 1] = "0"
    assert run_cli(args) == 2
    line = one_line(capsys.readouterr().err)
    assert "the inputs record's train section is a list, not an object" in line, line
    assert tree(tmp_path) == before


# -- a file list nested 100,000 deep ------------------------------------------------------------


def test_a_file_list_line_nested_100000_deep_is_one_line(
    tmp_path: Path, finished_run: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_run(finished_run, tmp_path / "run")
    with open(run / LEDGER, "a") as fh:
        fh.write("[" * 100_000 + "]" * 100_000 + "\n")
    assert read_listed(run) is None  # not a list twinrun wrote; no RecursionError
    args = sft_args(toy_model_dir, finished_run.parent / "sft4.jsonl", run, 1, "--overwrite")
    before = tree(tmp_path)
    args[args.index("--warmup-steps") + 1] = "0"
    assert run_cli(args) == 2
    line = one_line(capsys.readouterr().err)
    assert "--overwrite refused" in line and LEDGER in line, line
    assert tree(tmp_path) == before


# -- a file-size limit and a full disk -------------------------------------------------------


def limited(code: str, fsize: int) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh process whose files may not grow past `fsize` bytes."""
    head = f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))\n"
    env = os.environ | {"PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-c", head + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize("command", ["toy-model", "export"])
def test_a_file_size_limit_is_one_line_naming_the_output(
    tmp_path: Path, finished_run: Path, command: str
) -> None:
    out = tmp_path / "out"
    args = [command, str(out), "--seed", "0"] if command == "toy-model" else [
        "export", str(finished_run), "--output", str(out)]  # fmt: skip
    res = limited(f"from twinrun.cli.main import run_cli; raise SystemExit(run_cli({args!r}))",
                  200_000)  # fmt: skip
    assert res.returncode == 2, res.stderr
    line = one_line(res.stderr.splitlines()[-1])
    assert f"cannot write {out}: File too large" in line and "ulimit -f" in line, line
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    assert list(tmp_path.iterdir()) == []  # no output, no temporary folder


def test_a_full_disk_in_export_names_the_output(tmp_path: Path, finished_run: Path) -> None:
    with tiny_disk(tmp_path / "disk", "256k") as disk:
        out = disk / "merged"
        res = subprocess.run(
            [sys.executable, "-m", "twinrun", "export", str(finished_run), "--output", str(out)],
            env=os.environ | {"PYTHONPATH": SRC}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert res.returncode == 2, res.stderr
        line = one_line(res.stderr.splitlines()[-1])
        assert f"cannot write {out}: No space left on device" in line, line
        assert list(disk.iterdir()) == []


# -- a memory limit is said to be memory ----------------------------------------------------


@pytest.mark.parametrize(
    "raised",
    [
        MemoryError(),
        OSError(errno.ENOMEM, "Cannot allocate memory"),
        OSError("Cannot allocate memory (os error 12)"),  # a library's, without errno
        ImportError("libtorch_cpu.so: failed to map segment from shared object"),
        RuntimeError("can't start new thread"),
    ],
    ids=["MemoryError", "ENOMEM", "library-ENOMEM", "import", "thread"],
)
def test_a_memory_limit_is_blamed_on_memory_not_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    raised: BaseException,
) -> None:  # fmt: skip
    def fail(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr("twinrun.model.toy.write_toy_checkpoint", fail)
    assert run_cli(["toy-model", str(tmp_path / "m"), "--seed", "0"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("twinrun: error: out of memory ("), line
    assert "ulimit -v" in line and "path" not in line, line
    assert list(tmp_path.iterdir()) == []


# -- an MCP tool schema holding NaN ---------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1, 2}], ids=["nan", "inf", "set"])
def test_an_mcp_schema_that_is_not_plain_json_is_one_line(bad: object) -> None:
    from twinrun.rl.tool_plugins import McpEpisode

    class Server:
        def list_tools(self) -> list:
            schema = {"type": "object", "properties": {"k": {"type": "number", "maximum": bad}}}
            return [{"name": "look", "inputSchema": schema}]

    with pytest.raises(ToolEnvironmentError) as exc:
        McpEpisode(Guard("mypkg:Env", 5.0), Server(), {"prompt": "p"}, None)  # type: ignore[arg-type]
    line = exc.value.one_line()
    assert "\n" not in line
    assert (
        "list_tools schema of tool 'look' holds NaN, Infinity or a value that is not JSON" in line
    )


# -- a full disk while the file list is appended leaves nothing unlisted -------------------------


def test_a_full_disk_appending_the_list_leaves_no_unlisted_folder(
    tmp_path: Path, finished_run: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The disk fills up as the list gains the first checkpoint's line: the run stops in one
    line, no `checkpoints/` folder exists that the list does not name, and `--overwrite` then
    clears the run (it is all twinrun's) instead of blaming the user."""
    from twinrun.core import ledger
    from twinrun.core.errors import write_failed

    append = ledger._append

    def full(root: Path, record: dict[str, str]) -> None:
        if record.get("path", "").startswith("checkpoints/"):
            raise write_failed(root / LEDGER, OSError(errno.ENOSPC, "No space left on device"))
        append(root, record)

    monkeypatch.setattr(ledger, "_append", full)
    out = tmp_path / "run"
    args = sft_args(toy_model_dir, finished_run.parent / "sft4.jsonl", out, 1,
                    "--checkpoint-every", "1")  # fmt: skip
    args[args.index("--warmup-steps") + 1] = "0"
    args[args.index("--batch-size") + 1] = "2"  # 2 steps: a checkpoint after the first
    assert run_cli(args) == 2
    line = one_line(capsys.readouterr().err)
    assert f"cannot write {out / LEDGER}: No space left on device" in line, line
    assert not (out / "checkpoints").exists()
    listed = read_listed(out)
    assert listed is not None
    assert all(ledger.covered(p.relative_to(out).as_posix(), listed) for p in out.rglob("*"))
    monkeypatch.setattr(ledger, "_append", append)  # space again
    assert run_cli([*args, "--overwrite"]) == 0, capsys.readouterr().err
    assert (out / "checkpoints").is_dir() and (out / "twinrun.json").is_file()


# -- Ctrl-C that a library's __del__ swallows ----------------------------------------------------


def test_ctrl_c_swallowed_by_a_del_during_export_ends_interrupted(
    tmp_path: Path, finished_run: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The Ctrl-C lands in a library's `__del__` while the export is written: Python drops the
    KeyboardInterrupt there, and export used to finish with exit 0. Now the export stops before
    its output is placed: one line, exit 130, no output and no temporary folder."""
    import signal

    import twinrun.cli.main as cli_main
    from twinrun.core import interrupts
    from twinrun.model import export

    class Handle:
        def __del__(self) -> None:
            cli_main._note_sigint(signal.SIGINT, None)  # the CLI's handler, as Ctrl-C runs it

    write = export._write_export

    def write_then_collect(*args: object) -> object:
        info = write(*args)  # type: ignore[arg-type]
        Handle()  # dropped at once: its __del__ raises KeyboardInterrupt, which Python ignores
        return info

    monkeypatch.setattr(export, "_write_export", write_then_collect)
    monkeypatch.setattr(cli_main, "SIGINT_SEEN", [])
    monkeypatch.setattr(interrupts, "SEEN", [])
    out = tmp_path / "merged"
    assert run_cli(["export", str(finished_run), "--output", str(out)]) == 130
    err = capsys.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == cli_main.INTERRUPTED_LINE
    assert list(tmp_path.iterdir()) == []
