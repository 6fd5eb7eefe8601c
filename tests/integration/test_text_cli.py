"""`twinrun tune text`: raw-text continued pre-training reproduces its bytes, resumes bit-exactly,
trains on the windows the keyed draws name, and refuses bad inputs in one line, writing
nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from testkit.toy_runs import text_args, write_corpus
from tests.integration.test_resume import assert_same_run
from twinrun.cli.main import run_cli
from twinrun.core.rng import stream
from twinrun.diag.checksum import sumsq
from twinrun.model.tokens import load_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, corpus: list[Path]):
    out = tmp_path_factory.mktemp("text") / "ref"
    assert run_cli(text_args(toy_model_dir, corpus, out, "--diag", "--checkpoint-every", "1")) == 0
    return out


def test_a_text_run_reproduces_its_bytes(
    tmp_path: Path, toy_model_dir: Path, corpus: list[Path], text_run: Path
) -> None:
    again = tmp_path / "again"
    args = text_args(toy_model_dir, corpus, again, "--diag", "--prefetch", "2")
    assert run_cli(args) == 0
    for name in ("adapter_model.safetensors", "diag.jsonl"):
        assert (again / name).read_bytes() == (text_run / name).read_bytes(), name
    other = tmp_path / "other"
    assert run_cli(text_args(toy_model_dir, corpus, other, seed=4)) == 0
    assert (other / "adapter_model.safetensors").read_bytes() != (
        text_run / "adapter_model.safetensors"
    ).read_bytes()


def test_the_sidecar_records_the_corpus(text_run: Path, corpus: list[Path]) -> None:
    import hashlib

    side = json.loads((text_run / "twinrun.json").read_text())
    lines = "".join(hashlib.sha256(p.read_bytes()).hexdigest() + "\n" for p in corpus)
    assert side["data"]["sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    assert side["inputs"]["corpus"] == [str(p) for p in corpus]
    train = side["train"]
    assert (train["objective"], train["window"], train["windows_per_step"]) == ("text", 24, 3)
    assert train["steps"] == 4 and train["lr_schedule"] == "cosine"


def test_a_text_run_resumes_bit_exactly(tmp_path: Path, toy_model_dir: Path, text_run: Path):
    """A copy of the finished run cut back to its state after two steps (as a kill would leave
    it: the checkpoint of two steps done, diag rows past it), then resumed."""
    run = tmp_path / "cut"
    shutil.copytree(text_run, run)
    for name in ("twinrun.json", "adapter_model.safetensors", "adapter_config.json",
                 "metrics.jsonl"):  # fmt: skip
        (run / name).unlink()
    later = [p for p in (run / "checkpoints").iterdir() if p.name > "step-000002"]
    assert (run / "checkpoints" / "step-000002").is_dir() and later
    for p in later:
        shutil.rmtree(p)
    side = json.loads((text_run / "twinrun.json").read_text())
    corpus = [Path(p) for p in side["inputs"]["corpus"]]
    args = text_args(toy_model_dir, corpus, run, "--diag", "--checkpoint-every", "1")
    assert run_cli([*args, "--resume"]) == 0
    assert_same_run(text_run, run)


def test_the_windows_are_the_keyed_draws(
    text_run: Path, toy_model_dir: Path, corpus: list[Path]
) -> None:
    tok = load_tokenizer(toy_model_dir)
    ids: list[int] = []
    for p in corpus:  # each file: the tokenizer's plain rule, then eos
        doc = list(tok.hf(p.read_text(encoding="utf-8"), add_special_tokens=True)["input_ids"])
        ids += doc if doc[-1] == tok.eos_id else [*doc, tok.eos_id]
    side = json.loads((text_run / "twinrun.json").read_text())
    assert side["metrics"]["corpus_tokens"] == len(ids)
    rows = [json.loads(x) for x in (text_run / "diag.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        starts = [stream(3, "window", row["step"], i).integers(0, len(ids) - 24 + 1)
                  for i in range(3)]  # fmt: skip
        windows = torch.tensor([ids[a : a + 24] for a in starts])
        assert row["checksums"]["batch.sample_indices"] == sumsq(torch.tensor(starts))
        assert row["checksums"]["batch.tokens"] == sumsq(windows)
    metrics = [json.loads(x) for x in (text_run / "metrics.jsonl").read_text().splitlines()]
    assert {m["tokens"] for m in metrics} == {3 * 23}  # every token after a window's first


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "twinrun: error: corpus file {missing} does not exist"),
        ("empty", "twinrun: error: the corpus is empty (no text in any --corpus file)"),
        ("long", "twinrun: error: --window 5000 exceeds the model's 2048 positions"),
        ("short", "twinrun: error: --window 2000 is longer than the corpus (7 tokens)"),
        ("binary", "twinrun: error: corpus file {binary} is not UTF-8 text (byte 1)"),
    ],
)
def test_bad_inputs_are_one_line_errors_and_write_nothing(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str], case: str,
    message: str,
) -> None:  # fmt: skip
    files = {"missing": tmp_path / "missing.txt", "empty": tmp_path / "empty.txt",
             "short": tmp_path / "short.txt", "binary": tmp_path / "binary.bin"}  # fmt: skip
    files["empty"].write_text("  \n")
    files["short"].write_text("hello")  # the toy's byte tokenizer: bos, 5 bytes, eos
    files["binary"].write_bytes(b"a\xff\xfe")
    corpus = {"missing": [files["missing"]], "empty": [files["empty"]],
              "long": [files["short"]], "short": [files["short"], files["empty"]],
              "binary": [files["binary"]]}[case]  # fmt: skip
    window = {"long": "5000", "short": "2000"}.get(case, "24")
    out = tmp_path / "run"
    args = text_args(toy_model_dir, corpus, out)
    args[args.index("--window") + 1] = window
    capsys.readouterr()
    assert run_cli(args) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(message.format(**{k: str(v) for k, v in files.items()}))
    assert not out.exists()


def test_a_text_step_captured_from_a_toml_run_replays_bit_for_bit(
    tmp_path: Path, toy_model_dir: Path, corpus: list[Path]
) -> None:
    """`twinrun run` with trainer = "text" and capture_steps = [1]; the replay of step 1 (no
    corpus read) ends with the source's adapter after step 1, and the same loss."""
    from testkit.captures import Capture, metrics, run_config

    doc = {
        "training": {"trainer": "text", "seed": 3, "max_steps": 3, "learning_rate": 1e-2,
                     "warmup_steps": 1, "lr_schedule": "wsd", "decay_steps": 1,
                     "batch_size": 2, "precision": "f32"},
        "text": {"window": 24, "windows_per_step": 3},
        "model": {"path": str(toy_model_dir), "lora_rank": 4, "lora_alpha": 8},
        "data": {"corpus": [str(p) for p in corpus]},
        "backend": {"devices": "cpu", "options": {"threads": 1}},
        "logging": {"dir": str(tmp_path / "src")},
        "optimizer_batch": {"capture": True, "capture_steps": [1]},
    }  # fmt: skip
    assert run_config(tmp_path / "src.toml", doc) == 0
    side = json.loads((tmp_path / "src" / "twinrun.json").read_text())
    assert side["train"]["objective"] == "text" and side["train"]["lr_schedule"] == "wsd"
    cap = Capture(doc, tmp_path / "src", 1)
    state = tmp_path / "src" / "optimizer_batch_step_000001.state"
    replay = cap.replay_config(tmp_path / "rep", resume={"from": str(state)})
    replay.pop("data")
    assert run_config(tmp_path / "rep.toml", replay) == 0
    (row,) = metrics(tmp_path / "rep")
    for key in ("loss", "lr", "optimizer/logical_batch_sha256",
                "optimizer_batch/final_adapter_sha256"):  # fmt: skip
        assert row[key] == cap.row[key], key
