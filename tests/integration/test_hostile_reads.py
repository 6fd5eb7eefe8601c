"""Hostile reads end in one line, quickly: a FIFO, a device or a directory named as an input is
refused by kind before it is opened; TOML nested thousands of tables deep, a NUL byte in a path
and a 1 MB unknown key are one line each; a UTF-8 BOM opening a TOML file is accepted; redaction
and the did-you-mean run in linear time. Cases that hung or grew without bound before run in a
subprocess with a timeout, so a regression fails instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testkit.captures import grpo_source, write_toml
from twinrun.cli.main import run_cli
from twinrun.config.toml import load_toml

SRC = str(Path(__file__).resolve().parents[2] / "src")


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.lstat().st_mtime_ns) for p in root.rglob("*"))


def in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = run_cli(argv)
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "internal error" not in err, err
    return code, err


def bounded(args: list[str], cwd: Path, timeout: float = 120) -> tuple[int, str]:
    """`twinrun ARGS` in a subprocess killed after `timeout` seconds (a hang fails the test)."""
    env = os.environ | {"PYTHONPATH": SRC}
    try:
        res = subprocess.run([sys.executable, "-m", "twinrun", *args], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"twinrun {' '.join(args)} still running after {timeout} s")
    err = res.stderr.strip()
    assert "\n" not in err and "internal error" not in err, err
    return res.returncode, err


def timed(code: str, timeout: float = 120) -> float:
    """What the Python `code` prints (a float), run in a subprocess with a timeout."""
    env = os.environ | {"PYTHONPATH": SRC}
    try:
        res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                             capture_output=True, text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s: not linear")
    assert res.returncode == 0, res.stderr
    return float(res.stdout.strip())


# -- not a regular file ------------------------------------------------------------------------


def test_a_fifo_config_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "run.toml")
    before = tree(tmp_path)
    for command in ("run", "explain"):
        code, line = bounded([command, "run.toml"], tmp_path)
        assert code == 2
        assert line == (
            "twinrun: error: config file run.toml is a FIFO, not a file — check the path"
        ), line
    assert tree(tmp_path) == before


@pytest.mark.parametrize("command", ["run", "explain"])
def test_dev_zero_as_a_config_is_refused_by_kind(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(tmp_path)
    code, line = in_process([command, "/dev/zero"], capsys)
    assert code == 2
    assert line == (
        "twinrun: error: config file /dev/zero is a character device, not a file — check the path"
    )
    assert tree(tmp_path) == before


def test_a_directory_as_a_config_is_refused_by_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c.toml").mkdir()
    before = tree(tmp_path)
    code, line = in_process(["run", str(tmp_path / "c.toml")], capsys)
    assert code == 2 and "'CONFIG': needs a file path, not a directory" in line, line  # click's
    assert str(tmp_path) not in line  # a usage error never repeats the value (it may be a secret)
    assert tree(tmp_path) == before


def test_dev_zero_as_examples_is_refused_by_kind(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from testkit.toy_runs import sft_args

    out = tmp_path / "out"
    before = tree(tmp_path)
    code, line = in_process(sft_args(toy_model_dir, Path("/dev/zero"), out, 1), capsys)
    assert code == 2
    assert line == (
        "twinrun: error: examples file /dev/zero is a character device, not a file — "
        "check the --examples path"
    )
    assert tree(tmp_path) == before and not out.exists()


def test_a_fifo_of_examples_is_refused_not_waited_on(tmp_path: Path, toy_model_dir: Path) -> None:
    from testkit.toy_runs import sft_args

    os.mkfifo(tmp_path / "ex.jsonl")
    before = tree(tmp_path)
    code, line = bounded(sft_args(toy_model_dir, tmp_path / "ex.jsonl", tmp_path / "o", 1),
                         tmp_path)  # fmt: skip
    assert code == 2 and "ex.jsonl is a FIFO, not a file — check the --examples path" in line
    assert tree(tmp_path) == before


def test_a_fifo_diag_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text("")
    before = tree(tmp_path)
    code, line = bounded(["diff", "a.jsonl", "b.jsonl"], tmp_path)
    assert code == 2 and "a.jsonl is a FIFO, not a file" in line, line
    assert tree(tmp_path) == before


def test_dev_zero_diag_file_is_refused_quickly(tmp_path: Path) -> None:
    (tmp_path / "b.jsonl").write_text("")
    before = tree(tmp_path)
    code, line = bounded(["diff", "/dev/zero", "b.jsonl"], tmp_path, timeout=60)
    assert code == 2 and "/dev/zero is a character device, not a file" in line, line
    assert tree(tmp_path) == before


def test_a_diag_line_of_any_length_is_capped(tmp_path: Path) -> None:
    with open(tmp_path / "a.jsonl", "wb") as fh:  # 8 MiB without a newline: over the line cap
        fh.write(b"{" + b" " * (8 << 20))
    (tmp_path / "b.jsonl").write_text("")
    before = tree(tmp_path)
    code, line = bounded(["diff", "a.jsonl", "b.jsonl"], tmp_path, timeout=60)
    assert code == 2 and "a.jsonl:1: a line over the limit of" in line, line
    assert tree(tmp_path) == before


def test_a_fifo_corpus_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    from twinrun.core.errors import DataError
    from twinrun.data.corpus import read_corpus

    os.mkfifo(tmp_path / "c.txt")
    with pytest.raises(DataError) as err:  # non-blocking open: returns at once
        read_corpus([str(tmp_path / "c.txt")])
    assert err.value.one_line().endswith("c.txt is a FIFO, not a file — check the --corpus paths")


# -- TOML and paths ----------------------------------------------------------------------------


def valid_doc(tmp_path: Path) -> str:
    doc = grpo_source(tmp_path / "m", tmp_path / "e.jsonl", "arithmetic", tmp_path / "i",
                      tmp_path / "out")  # fmt: skip
    return write_toml(tmp_path / "valid.toml", doc).read_text(encoding="utf-8")


def test_a_utf8_bom_opening_a_toml_file_is_accepted(tmp_path: Path) -> None:
    text = valid_doc(tmp_path)
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    plain = load_toml(tmp_path / "valid.toml")
    with_bom = load_toml(tmp_path / "bom.toml")
    assert with_bom.cfg == plain.cfg and with_bom.given == plain.given


def test_tables_nested_3000_deep_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "deep.toml").write_text("[" + ".".join(["a"] * 3000) + "]\nx = 1\n")
    before = tree(tmp_path)
    code, line = in_process(["run", str(tmp_path / "deep.toml")], capsys)
    assert code == 2
    assert line.endswith("deep.toml: tables nested deeper than 32 levels — fix the config"), line
    assert tree(tmp_path) == before


def test_a_nul_byte_in_a_toml_path_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = valid_doc(tmp_path).replace(f'"{tmp_path / "m"}"', '"m\\u0000x"')
    assert "\\u0000" in text
    (tmp_path / "nul.toml").write_text(text)
    before = tree(tmp_path)
    code, line = in_process(["run", str(tmp_path / "nul.toml")], capsys)
    assert code == 2 and "1 problem: model.path contains a NUL byte" in line, line
    assert tree(tmp_path) == before


def test_a_nul_byte_in_an_argument_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(tmp_path)
    code, line = in_process(["run", str(tmp_path / "a\0b.toml")], capsys)
    assert code == 2
    assert line == "twinrun: error: argument 2 contains a NUL byte — remove it"
    assert tree(tmp_path) == before


def test_a_1mb_unknown_key_is_one_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "k.toml").write_text("[training]\n" + "k" * (1 << 20) + " = 1\n")
    before = tree(tmp_path)
    code, line = in_process(["run", str(tmp_path / "k.toml")], capsys)
    shown = ("training." + "k" * 200)[:200] + "..."
    assert code == 2 and f"unknown key {shown};" in line, line[:300]
    assert len(line) < 2000
    assert tree(tmp_path) == before


# -- linear time -------------------------------------------------------------------------------

RATIO = """
import time

def per_call(text, calls):
    # CPU seconds of this process, not wall time: a busy machine delays the process but adds
    # nothing to the work it does; the best of 3 rounds
    rounds = []
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(calls):
            f(text)
        rounds.append((time.process_time() - t0) / calls)
    return min(rounds)

small, big = make(1 << 10), make(BIG)
print(per_call(big, 1) / per_call(small, 100) / (len(big) / len(small)))
"""
# The work per byte on the big input over the work per byte on 1 KB, both in one process: about 1
# when linear (0.6 to 1.2 measured for redaction, idle and with 8 busy loops on 2 cores; fixed
# costs make the small input dearer per byte, so less); a quadratic pattern gives the size ratio,
# 10,000 (or the timeout). The bound is far from both.
MAX_PER_BYTE_RATIO = 100


def ratio(setup: str, big: int = 10 << 20) -> float:
    return timed(textwrap.dedent(setup) + f"BIG = {big}\n" + RATIO)


@pytest.mark.parametrize("shape", ["letters", "query", "scheme", "userinfo"])
def test_redaction_is_linear(shape: str) -> None:
    make = {
        "letters": "lambda n: 'a' * n + '@'",
        "query": "lambda n: '?' * n + '://'",
        "scheme": "lambda n: 'a:/' * (n // 3) + '@'",
        "userinfo": "lambda n: 'http://' + 'a' * n + ' @'",
    }[shape]
    # `a:/` repeated is a Python-level step per 3 bytes (~1.7 us a byte): 2 MB of it is enough,
    # a quadratic pattern would still give a ratio of ~2,000
    big = (2 << 20) if shape == "scheme" else (10 << 20)
    r = ratio(f"from twinrun.core.redact import redact_string as f\nmake = {make}\n", big)
    assert r < MAX_PER_BYTE_RATIO, r


def test_did_you_mean_of_a_10mb_key_is_linear() -> None:
    r = ratio("""
        from twinrun.config.toml import nearest, schema
        valid = sorted(schema())
        make = lambda n: "training." + "k" * n
        f = lambda key: nearest(key, valid)
    """)  # fmt: skip
    assert r < MAX_PER_BYTE_RATIO, r


def test_a_config_of_100k_unknown_keys_is_linear(tmp_path: Path) -> None:
    """100k unknown keys (3 MB, under the 4 MiB config limit): only the first few get a
    suggestion, the rest are counted."""
    path = str(tmp_path / "k.toml")
    r = ratio(f"""
        from pathlib import Path
        from twinrun.config.toml import load_toml
        from twinrun.core.errors import ConfigError
        make = lambda n: "[x]\\n" + "".join(f"k{{i:06d}} = 1\\n" for i in range(n // 12))
        def f(text):
            Path({path!r}).write_text(text)
            try:
                load_toml({path!r})
            except ConfigError as exc:
                assert "more unknown keys" in exc.message or len(text) < 5000
    """, big=1_200_000)  # fmt: skip
    assert r < MAX_PER_BYTE_RATIO, r


# -- chat templates ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{ 'x' * 3000000000 }}", "built a value of more than 4194304 characters"),
        ("{% include 'secret.txt' %}", "includes another template (secret.txt)"),
    ],
)
def test_a_hostile_chat_template_is_one_line_and_writes_nothing(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, template: str, says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import shutil

    from testkit.toy_runs import sft_args

    model = tmp_path / "model"
    shutil.copytree(toy_model_dir, model)
    (model / "chat_template.jinja").write_text(template)
    before = tree(tmp_path)
    code, line = in_process(sft_args(model, sft_examples, tmp_path / "out", 1), capsys)
    assert code == 2
    assert line == (
        f"twinrun: error: the chat template of {model} {says} — fix the chat template, or use "
        "--chat-template off"
    )
    assert tree(tmp_path) == before


def test_a_fifo_steering_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    from twinrun.core.errors import DataError
    from twinrun.infer.steering import read_steering

    os.mkfifo(tmp_path / "v.safetensors")
    with pytest.raises(DataError) as err:
        read_steering(tmp_path / "v.safetensors")
    assert err.value.message == f"steering file {tmp_path / 'v.safetensors'} is a FIFO, not a file"


def test_a_fifo_in_place_of_adapter_weights_is_refused(tmp_path: Path) -> None:
    import json

    from twinrun.core.errors import ModelError
    from twinrun.model.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, load_adapter

    (tmp_path / ADAPTER_CONFIG).write_text(json.dumps({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}))  # fmt: skip
    os.mkfifo(tmp_path / ADAPTER_WEIGHTS)
    with pytest.raises(ModelError) as err:
        load_adapter(None, tmp_path)  # type: ignore[arg-type]  # refused before the model is used
    assert err.value.message.endswith(f"{ADAPTER_WEIGHTS} is a FIFO, not a file")
