"""Bounds (issue 35, item 5): the thread count is capped wherever it is read (flags, TOML,
sidecars); a checkpoint file that is not a regular file ends a resume in one line instead of
blocking it; Parquet files are capped on rows and uncompressed bytes from their footer, before a
row is decoded; JSON arrays are parsed one element at a time up to the row cap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testkit.captures import grpo_source, write_toml
from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli
from twinrun.core.determinism import THREADS_FLOOR, machine_cores, threads_cap

SRC = str(Path(__file__).resolve().parents[2] / "src")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "internal error" not in err, err
    return err


def child(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Python `code` in a fresh process (a hang fails the test instead of blocking it)."""
    env = os.environ | {"PYTHONPATH": SRC}
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s")


# -- threads -----------------------------------------------------------------------------------


def test_the_thread_cap_is_stated() -> None:
    assert threads_cap() == max(THREADS_FLOOR, machine_cores()) >= 256


def test_threads_100000_on_the_command_line_is_one_line(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = sft_args(toy_model_dir, sft_examples, out, 1, "--threads", "100000")
    assert run_cli(args) == 2
    line = one_line(capsys)
    assert f"--threads 100000 is more than this machine's {machine_cores()} cores" in line, line
    assert f"the cap of {threads_cap()}" in line
    assert not out.exists()


def test_threads_100000_in_a_toml_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = grpo_source(tmp_path / "m", tmp_path / "e.jsonl", "arithmetic", None, tmp_path / "o")
    doc["optimizer_batch"]["capture"] = False
    doc["backend"]["options"]["threads"] = 100_000
    assert run_cli(["run", str(write_toml(tmp_path / "c.toml", doc))]) == 2
    line = one_line(capsys)
    assert "backend.options.threads 100000 is more than this machine's" in line, line


def test_establish_refuses_past_the_cap_before_torch_is_touched() -> None:
    import torch

    from twinrun.core.determinism import establish
    from twinrun.core.errors import ConfigError

    before = torch.get_num_threads()
    with pytest.raises(ConfigError, match="is more than this machine's"):
        establish(strict=False, threads=threads_cap() + 1)
    assert torch.get_num_threads() == before


def test_threads_100000_in_a_sidecar_is_refused_by_reproduce(
    tmp_path: Path, sft_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(sft_runs["a"], run)
    sidecar = json.loads((run / "twinrun.json").read_text())
    sidecar["train"]["threads"] = 100_000
    (run / "twinrun.json").write_text(json.dumps(sidecar))
    before = sorted((p.name, p.read_bytes()) for p in run.iterdir() if p.is_file())
    capsys.readouterr()
    code = run_cli(["reproduce", str(run), "--output", str(tmp_path / "again")])
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert code == 2, text
    assert "--threads 100000 is more than this machine's" in text, text
    assert "internal error" not in text and text.count("\n") == 0, text
    assert sorted((p.name, p.read_bytes()) for p in run.iterdir() if p.is_file()) == before


# -- files that are not regular files ----------------------------------------------------------


@pytest.fixture(scope="module")
def interrupted(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path
) -> tuple[Path, list[str]]:
    """A run killed while writing its second checkpoint: step-000001 is complete."""
    run = tmp_path_factory.mktemp("interrupted") / "run"
    args = sft_args(toy_model_dir, sft_examples, run, 1, "--checkpoint-every", "1")
    env = os.environ | {"PYTHONPATH": SRC, "TWINRUN_CRASH_AT": "checkpoint-mid-write:2"}
    subprocess.run([sys.executable, "-m", "twinrun", *args], env=env, capture_output=True,
                   timeout=120, check=False)  # fmt: skip
    assert (run / "checkpoints" / "step-000001" / "checksums.json").is_file()
    return run, args


@pytest.mark.parametrize(("kind", "says"), [("fifo", "a FIFO"), ("dev-zero", "a character device")])
def test_a_checkpoint_state_that_is_not_a_file_ends_resume_in_one_line(
    tmp_path: Path, interrupted: tuple[Path, list[str]], kind: str, says: str
) -> None:
    source, args = interrupted
    run = tmp_path / "run"
    shutil.copytree(source, run, symlinks=True)
    state = run / "checkpoints" / "step-000001" / "state.safetensors"
    state.unlink()
    if kind == "fifo":
        os.mkfifo(state)
    else:
        state.symlink_to("/dev/zero")
    argv = [a if a != str(source) else str(run) for a in args]
    env = os.environ | {"PYTHONPATH": SRC}
    try:
        res = subprocess.run([sys.executable, "-m", "twinrun", *argv, "--resume"], env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("--resume still running after 60 s: it waits on the special file")
    err = res.stderr.strip()
    assert res.returncode == 2, err
    assert "\n" not in err and "internal error" not in err, err
    assert f"checkpoint step-000001 is corrupt (state.safetensors is {says}, not a file)" in err
    assert not (run / "twinrun.json").exists()


def test_the_digest_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    from twinrun.core.digest import sha256_file, sha256_files
    from twinrun.core.errors import DataError

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")  # a link to a regular file is that file
    assert sha256_file(tmp_path / "link") == sha256_file(tmp_path / "real")
    for name, kind in (("fifo", "a FIFO"), ("zero", "a character device"), (".", "a directory")):
        with pytest.raises(DataError, match=f"is {kind}, not a file"):
            sha256_file(tmp_path / name)
    with pytest.raises(DataError, match="is a FIFO, not a file"):
        sha256_files([tmp_path / "real", tmp_path / "fifo"], tmp_path)
    with pytest.raises(FileNotFoundError):
        sha256_file(tmp_path / "missing")


# -- Parquet and JSON arrays -------------------------------------------------------------------

PEAK = """
    from pathlib import Path
    from twinrun.core.errors import DataError
    from twinrun.data.examples import load_rows
    try:
        load_rows({path!r})
        print("read")
    except DataError as exc:
        print(exc.one_line())
    # this process's own peak (VmHWM starts again at exec; ru_maxrss keeps the forked parent's)
    status = Path("/proc/self/status").read_text().splitlines()
    print(next(int(x.split()[1]) for x in status if x.startswith("VmHWM:")) // 1024)
"""


def peak_and_line(path: Path) -> tuple[str, int]:
    res = child(PEAK.format(path=str(path)))
    assert res.returncode == 0, res.stderr
    line, peak = res.stdout.strip().splitlines()
    return line, int(peak)


def test_a_parquet_file_of_many_rows_is_refused_from_its_footer(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("datasets")
    from twinrun.core.jsonlimits import EXAMPLES

    n = EXAMPLES.max_rows + 1  # type: ignore[operator]
    p = tmp_path / "rows.parquet"
    table = pa.table({"prompt": pa.array(["What is 2 + 2?"] * n), "completion": [" 4"] * n})
    pq.write_table(table, str(p), compression="zstd")
    assert p.stat().st_size < 100_000  # the file's own size is no bound
    line, peak = peak_and_line(p)
    assert line == f"{p}: {n} rows, over the limit of {EXAMPLES.max_rows} — split the data, " \
        "or give a subset", line  # fmt: skip
    assert peak < 500, f"peak RSS {peak} MB"  # the rows as Python objects would be far more


def test_a_parquet_value_bomb_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("datasets")

    p = tmp_path / "value.parquet"
    value = "4" * (128 << 20)
    pq.write_table(pa.table({"prompt": ["What is 2 + 2?"], "completion": [value]}), str(p),
                   compression="zstd")  # fmt: skip
    del value
    assert p.stat().st_size < 200_000
    line, peak = peak_and_line(p)
    assert "row group 0 holds" in line and "so a row over the limit of 8388608 bytes" in line
    assert peak < 400, f"peak RSS {peak} MB"  # decoding it would hold the 128 MB value 3+ times


def test_a_decoded_parquet_value_over_the_row_limit_is_refused(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("datasets")
    from twinrun.core.errors import DataError
    from twinrun.core.jsonlimits import EXAMPLES, Limits
    from twinrun.data.examples import load_rows

    p = tmp_path / "t.parquet"
    rows = ["x"] * 999 + ["y" * 5000]  # one long value among many short: the footer's average
    pq.write_table(pa.table({"prompt": rows, "completion": rows}), str(p))  # is not enough
    limits = Limits(**{**EXAMPLES.__dict__, "max_bytes": 1000})
    with pytest.raises(DataError, match="column 'prompt' holds a value of 5000 bytes"):
        load_rows(p, limits)


def test_a_json_array_is_read_one_element_at_a_time_up_to_the_row_cap(tmp_path: Path) -> None:
    from twinrun.core.errors import DataError
    from twinrun.core.jsonlimits import EXAMPLES, Limits
    from twinrun.data.examples import load_rows

    p = tmp_path / "a.json"
    row = json.dumps({"prompt": "What is 2 + 2?", "completion": " 4"})
    p.write_text("[" + ",".join([row] * 5000) + "]")
    limits = Limits(**{**EXAMPLES.__dict__, "max_rows": 1000})
    with pytest.raises(DataError) as err:
        load_rows(p, limits)
    assert err.value.one_line() == (
        f"{p}: more than 1000 rows, over the limit for an examples file — split the data, "
        "or give a subset"
    )
    assert len(load_rows(p)) == 5000  # under the default cap, the same rows as before
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(f"{row}\n" * 1001)
    with pytest.raises(DataError, match="more than 1000 rows"):
        load_rows(jsonl, limits)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[{"a": 1}, {"b"', "not valid JSON"),
        ('[{"a": 1} {"b": 2}]', "expected ',' or ']'"),
        ('[{"a": 1}] x', "extra data after the array"),
        ("[" + "[" * 100 + "]" * 100 + "]", "nesting deeper than 64 levels"),
        ('[{"a": "\\ud800"}]', "lone UTF-16 surrogate"),
        ("[" + "1" * 50 + "]", "more than 40 digits"),
        ("[]", "has no rows"),
    ],
)
def test_a_streamed_json_array_keeps_every_check(tmp_path: Path, text: str, says: str) -> None:
    from twinrun.core.errors import DataError
    from twinrun.data.examples import load_rows

    p = tmp_path / "a.json"
    p.write_text(text)
    with pytest.raises(DataError, match=says):
        load_rows(p)


def test_a_json_array_row_over_the_byte_limit_is_named(tmp_path: Path) -> None:
    from twinrun.core.errors import DataError
    from twinrun.core.jsonlimits import EXAMPLES, Limits
    from twinrun.data.examples import load_rows

    p = tmp_path / "a.json"
    p.write_text(json.dumps([{"prompt": "a", "completion": "b"}, {"prompt": "x" * 500}]))
    with pytest.raises(DataError) as err:
        load_rows(p, Limits(**{**EXAMPLES.__dict__, "max_bytes": 100}))
    assert err.value.one_line() == f"{p}[1]: a row over the limit of 100 bytes — shorten the row"


# -- a row's length, before the tokenizer (issue 50, item 5) -----------------------------------


def counted_tokenizer(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size (messages, or characters of plain text) of every conversation the tokenizer is
    asked to tokenize, from now on."""
    from twinrun.model.tokens import CheckpointTokenizer

    sizes: list[int] = []
    chat, plain = CheckpointTokenizer._chat_ids, CheckpointTokenizer._plain_ids

    def chat_ids(self: CheckpointTokenizer, messages: list, *args: object, **kw: object) -> list:
        sizes.append(len(messages))
        return chat(self, messages, *args, **kw)  # type: ignore[arg-type]

    def plain_ids(self: CheckpointTokenizer, text: str) -> list[int]:
        sizes.append(len(text))
        return plain(self, text)

    monkeypatch.setattr(CheckpointTokenizer, "_chat_ids", chat_ids)
    monkeypatch.setattr(CheckpointTokenizer, "_plain_ids", plain_ids)
    return sizes


def test_rows_of_10000_messages_are_refused_before_the_tokenizer(
    tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    turns = [{"role": ("user", "assistant")[i % 2], "content": f"hi {i}"} for i in range(10_000)]
    examples = tmp_path / "long.jsonl"
    examples.write_text(f"{json.dumps({'messages': turns})}\n" * 4)
    sizes = counted_tokenizer(monkeypatch)
    out = tmp_path / "out"
    args = sft_args(toy_model_dir, examples, out, 1)
    args[args.index("--warmup-steps") + 1] = "0"
    assert run_cli(args) == 2
    line = one_line(capsys)
    assert f"{examples}:1: at least " in line and "(10000 messages, " in line, line
    assert "over the row limit of 2048 (--max-length, else the model's positions)" in line
    assert max(sizes, default=0) <= 3  # only the tokenizer's 3-message probes, never a row
    assert not out.exists()


def test_a_row_of_many_characters_is_refused_before_the_tokenizer(
    tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    examples = tmp_path / "wide.jsonl"
    examples.write_text(json.dumps({"prompt": "a" * 200_000, "completion": "b"}) + "\n")
    sizes = counted_tokenizer(monkeypatch)
    out = tmp_path / "out"
    args = sft_args(toy_model_dir, examples, out, 1, "--batch-size", "1")
    args[args.index("--chat-template") + 1] = "off"
    args[args.index("--warmup-steps") + 1] = "0"
    assert run_cli(args) == 2
    assert "(2 messages, 200001 characters), over the row limit of 2048" in one_line(capsys)
    assert sizes == []
    assert not out.exists()


def test_the_token_floor_never_exceeds_the_tokens(toy_model_dir: Path) -> None:
    """The floor is a bound, not a guess: on every shipped row, with and without the template,
    it is at most the row's real token count (and the template's turn floor is not 0)."""
    from twinrun.data.examples import encode_sft_row, load_rows, sft_row_text, shipped_examples
    from twinrun.model.tokens import load_tokenizer

    tok = load_tokenizer(toy_model_dir)
    assert tok.turn_tokens_floor >= 1 and tok.longest_token_chars >= 1
    rows = load_rows(shipped_examples("sft.jsonl"))
    for row in rows:
        for templated in (True, False):
            conversation, _ = sft_row_text(row, templated)
            tokens = len(encode_sft_row(tok, row, templated).input_ids)
            assert 0 < tok.token_floor(conversation, templated) <= tokens, row.where


# -- evidence --repeat (issue 50, item 5) --------------------------------------------------------


@pytest.mark.parametrize("n", [101, 10**30])
def test_evidence_repeat_is_capped_before_any_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], n: int
) -> None:
    from twinrun.replay.repeat import MAX_REPEAT

    started: list[object] = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: started.append(a))
    before = sorted(tmp_path.rglob("*"))
    code = run_cli(["evidence", str(tmp_path / "source"), "--repeat", str(n),
                    str(tmp_path / "replay.toml")])  # fmt: skip
    assert code == 2
    line = one_line(capsys)
    assert f"is more than the cap of {MAX_REPEAT} replays" in line, line
    assert f"give N <= {MAX_REPEAT}" in line and len(line) < 200
    assert started == [] and sorted(tmp_path.rglob("*")) == before


# -- a JSON array is streamed (issue 50, item 5) --------------------------------------------------


ARRAY_TEXTS = [
    '[{"a": 1.5e10, "b": -0.25E-3, "c": 123456789}, {"d": "é😀\\u00e9 \\"q\\""}]',
    '\ufeff  [\n  {"x": [1, 2, {"y": null}]},\n\t{"z": true} , {"w": false}\n]\n  ',
    "[" + ",".join(f'{{"n": {i}, "s": "{"😀" * (i % 5)}"}}' for i in range(300)) + "]",
    "[]",
]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_a_streamed_json_array_reads_the_same_values_at_any_chunk_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Chunk ends fall inside numbers (1.5e|10), multi-byte characters, escapes and the BOM:
    every element is the one json.loads reads."""
    from twinrun.core import jsonarray
    from twinrun.core.jsonlimits import EXAMPLES

    monkeypatch.setattr(jsonarray, "CHUNK", chunk)
    for n, text in enumerate(ARRAY_TEXTS):
        p = tmp_path / f"a{n}.json"
        p.write_text(text, encoding="utf-8")
        got = [v for _, v in jsonarray.iter_json_array(p, "examples file", EXAMPLES)]
        assert got == json.loads(text.removeprefix("\ufeff")), (chunk, n)


@pytest.mark.parametrize("chunk", [3, 1 << 20])
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[{"a": 1},\n {"b": 2},\n {"c" 3}]', "not valid JSON (Expecting ':' delimiter at line 3"),
        ('[{"a": 1},\n {"b": 2}\n {"c": 3}]', "expected ',' or ']' at line 3"),
        ('[{"a": 1}] x', "extra data after the array"),
        ('[{"a": 1}', "not valid JSON"),
        (b'[{"a": "\xff"}]', "not UTF-8 text"),
        ('{"a": 1}', "not a JSON array"),
    ],
)
def test_a_streamed_json_array_says_where_it_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, text: str | bytes, says: str
) -> None:
    from twinrun.core import jsonarray
    from twinrun.core.errors import DataError
    from twinrun.core.jsonlimits import EXAMPLES

    monkeypatch.setattr(jsonarray, "CHUNK", chunk)
    p = tmp_path / "a.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DataError) as err:
        list(jsonarray.iter_json_array(p, "examples file", EXAMPLES))
    assert says in err.value.one_line(), err.value.one_line()


def test_a_json_array_holds_a_chunk_of_text_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: a 4 MB array (with a character outside Latin-1, which makes a
    Python string 4 bytes a character) is read holding at most two chunks and a row of text."""
    from twinrun.core import jsonarray
    from twinrun.data.examples import load_rows

    held: list[int] = []
    more = jsonarray._Text.more

    def counted(self: jsonarray._Text, keep: int) -> int:
        moved = more(self, keep)
        held.append(len(self.text))
        return moved

    monkeypatch.setattr(jsonarray, "CHUNK", 64 << 10)
    monkeypatch.setattr(jsonarray._Text, "more", counted)
    row = json.dumps({"prompt": "What is 2 + 2? 😀", "completion": " 4"})
    p = tmp_path / "big.json"
    p.write_text("[" + ",".join([row] * 80_000) + "]", encoding="utf-8")
    assert p.stat().st_size > 4_000_000
    rows = load_rows(p)
    assert len(rows) == 80_000 and rows[-1].data["completion"] == " 4"
    assert len(held) > 60  # read in chunks
    assert max(held) <= 2 * (64 << 10) + len(row) + jsonarray.LOOKAHEAD
