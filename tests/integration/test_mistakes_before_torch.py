"""Everyday mistakes, each refused in one line before torch loads.

A table of what a new user gets wrong on a first day — paths, kinds of file, the rows inside a
file, numbers out of range, flags and commands by another library's name, run directories that are
not runs, a --resume with nothing to resume — run as `twinrun` commands in a fresh process. Each
must exit 2 with one `twinrun: error:` line naming the problem, write nothing, and leave `torch`
out of `sys.modules`: a mistake costs a second, not the seconds torch, transformers and PEFT take
to import.

The cases run in one child process, in order; a case after which torch is loaded is reported as
such and the rest go on in a fresh process, so one regression names its own case.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from twinrun.data.examples import shipped_examples

COMMON = {
    "--seed": "1", "--learning-rate": "1e-3", "--warmup-steps": "0", "--lr-schedule": "constant",
    "--lora-rank": "4", "--lora-alpha": "8", "--precision": "f32", "--threads": "1",
    "--chat-template": "on",
}  # fmt: skip
EPOCHS = {"--epochs": "1", "--batch-size": "1", "--accumulation": "1"}
GRPO = {
    "--steps": "1", "--prompts-per-step": "1", "--group-size": "2", "--batch-size": "2",
    "--max-new-tokens": "2", "--temperature": "1.0", "--clip-eps": "0.2",
    "--advantage-clip": "5", "--token-cap": "2", "--env": "arithmetic",
}  # fmt: skip


def flags(*tables: dict[str, str], **changes: str | None) -> list[str]:
    """The flags of `tables`, `changes` applied (`learning_rate="0"`; None drops the flag)."""
    merged: dict[str, str | None] = {}
    for table in tables:
        merged.update(table)
    merged.update({"--" + k.replace("_", "-"): v for k, v in changes.items()})
    return [x for k, v in merged.items() if v is not None for x in (k, v)]


class Files:
    """The files a case names, made once in `root`."""

    def __init__(self, root: Path, toy: Path) -> None:
        self.root, self.toy = root, toy
        self.sft = self.write("sft.jsonl", shipped_examples("sft.jsonl").read_text())
        self.pairs = self.write("pairs.jsonl", shipped_examples("pairs.jsonl").read_text())
        self.arith = self.write("arith.jsonl", shipped_examples("arith.jsonl").read_text())
        self.afile = self.write("afile.txt", "x")
        self.empty = self.write("empty.jsonl", "")
        self.bad_json = self.write("bad.jsonl", '{"prompt": "a", "completion": \n')
        self.text_rows = self.write("text.jsonl", '{"text": "hello"}\n')
        self.wrong_keys = self.write("wrong.jsonl", '{"instruction": "a", "output": "b"}\n')
        self.no_role = self.write(
            "norole.jsonl",
            '{"messages": [{"content": "a"}, {"role": "assistant", "content": "b"}]}\n',
        )
        self.same_pair = self.write(
            "same.jsonl", '{"prompt": "p", "chosen": "a", "rejected": "a"}\n'
        )
        self.chat_prompt = self.write(
            "chat.jsonl",
            '{"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "answer": "2"}\n',
        )
        self.csv_header_only = self.write("rows.csv", "prompt,completion\n")
        self.yaml = self.write("run.yaml", "training:\n  trainer: sft\n")
        self.toml_typo = self.write("typo.toml", "[train]\nseed = 1\n")
        self.dir = root / "a-directory"
        self.dir.mkdir()
        self.foreign = root / "foreign"
        self.foreign.mkdir()
        (self.foreign / "mine.txt").write_text("keep")
        self.out = root / "out"
        self.corpus = self.write("corpus.txt", "Once upon a time\nthere was a model.\n")
        self.pickled = self.model_copy("pickled", "pytorch_model.bin")  # no safetensors
        self.untokenized = self.model_copy("untokenized", "model.safetensors")  # no tokenizer
        self.finished = root / "finished"  # a run's files, no checkpoint: nothing to resume
        self.finished.mkdir()
        for name in ("twinrun.json", "twinrun.inputs.json"):
            (self.finished / name).write_text("{}")

    def model_copy(self, name: str, weights: str) -> Path:
        """A checkpoint directory with the toy's config.json and `weights` (the tokenizer too,
        unless `weights` is model.safetensors)."""
        out = self.root / name
        out.mkdir()
        (out / "config.json").write_bytes((self.toy / "config.json").read_bytes())
        (out / weights).write_bytes(b"\0" * 8)
        if weights != "model.safetensors":
            for tok in self.toy.glob("tokenizer*"):
                (out / tok.name).write_bytes(tok.read_bytes())
        return out

    def write(self, name: str, text: str) -> Path:
        path = self.root / name
        path.write_text(text)
        return path

    def sft_args(self, examples: Path | None = None, **changes: str | None) -> list[str]:
        paths = {"--model": str(self.toy), "--examples": str(examples or self.sft),
                 "--output": str(self.out)}  # fmt: skip
        return ["tune", "sft", *flags(paths, COMMON, EPOCHS, **changes)]

    def pair_args(self, objective: str, examples: Path, **changes: str | None) -> list[str]:
        paths = {"--model": str(self.toy), "--examples": str(examples), "--output": str(self.out)}
        beta = {"--beta": "0.1"} if objective == "dpo" else {}
        return ["tune", objective, *flags(paths, COMMON, EPOCHS, beta, **changes)]

    def grpo_args(self, examples: Path, **changes: str | None) -> list[str]:
        paths = {"--model": str(self.toy), "--examples": str(examples), "--output": str(self.out)}
        return ["tune", "grpo", *flags(paths, COMMON, GRPO, **changes)]


def mistakes(f: Files) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, what the line must say)."""
    nowhere = f.root / "nowhere"
    return {
        # the model
        "model-missing": (
            f.sft_args(model=str(nowhere)),
            f"model directory {nowhere} does not exist",
        ),
        "model-is-a-file": (
            f.sft_args(model=str(f.afile)),
            "is a file, not a checkpoint directory",
        ),
        "model-without-config": (f.sft_args(model=str(f.dir)), "no config.json in"),
        "model-a-hub-id": (
            f.sft_args(model="HuggingFaceTB/SmolLM2-135M-Instruct"),
            "`hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir DIR`, then --model DIR",
        ),
        "model-pickle-weights-only": (
            f.sft_args(model=str(f.pickled)),
            "holds pickle weights only (pytorch_model.bin)",
        ),
        "model-without-tokenizer": (f.sft_args(model=str(f.untokenized)), "no tokenizer files in"),
        "init-adapter-missing": (
            f.sft_args(init_adapter=str(nowhere)),
            f"adapter directory {nowhere} does not exist",
        ),
        "resume-nothing-to-resume": (
            [*f.sft_args(output=str(f.dir)), "--resume"],
            "has no complete checkpoint and no record of a started run",
        ),
        "resume-a-finished-run": (
            [*f.sft_args(output=str(f.finished)), "--resume"],
            "holds a finished run (it has twinrun.json) and no checkpoint",
        ),
        # the examples file and its rows
        "examples-typo": (f.sft_args(nowhere), "check the --examples path"),
        "examples-a-directory": (f.sft_args(f.dir), "is a directory, not a file"),
        "examples-empty": (f.sft_args(f.empty), "the examples file is empty"),
        "examples-not-json": (f.sft_args(f.bad_json), "not valid JSON"),
        "examples-text-rows": (f.sft_args(f.text_rows), "twinrun tune text"),
        "examples-plain-text": (
            f.sft_args(f.corpus),
            f"is plain text, not JSONL (its first line is not JSON) — to train on raw text, run "
            f"`twinrun tune text --corpus {f.corpus}`",
        ),
        "examples-other-fields": (f.sft_args(f.wrong_keys), "found fields: instruction, output"),
        "examples-a-message-without-role": (f.sft_args(f.no_role), "needs string 'role'"),
        "sft-given-pairs": (f.sft_args(f.pairs), "found fields: chosen, prompt, rejected"),
        "dpo-given-sft-rows": (f.pair_args("dpo", f.sft), "a pair row needs"),
        "reward-same-answers": (f.pair_args("reward", f.same_pair), "are the same text"),
        "grpo-chat-prompt-untemplated": (
            f.grpo_args(f.chat_prompt, chat_template="off"),
            "needs the chat template",
        ),
        "csv-header-only": (f.sft_args(f.csv_header_only), "the examples file has no rows"),
        "eval-examples-typo": (
            f.sft_args(eval_examples=str(nowhere), eval_every="1"),
            "check the --eval-examples path",
        ),
        "eval-examples-pairs": (
            f.sft_args(eval_examples=str(f.pairs), eval_every="1"),
            "found fields: chosen",
        ),
        # the output
        "output-not-empty": (f.sft_args(output=str(f.foreign)), "exists and is not empty"),
        "output-a-file": (f.sft_args(output=str(f.afile)), "exists and is not a directory"),
        "output-inside-the-model": (f.sft_args(output=str(f.toy / "run")), "lies inside the model"),
        "output-is-the-examples": (f.sft_args(output=str(f.sft)), "--output"),
        # numbers
        "seed-negative": (f.sft_args(seed="-1"), "--seed must be in [0, 2**63)"),
        "learning-rate-zero": (f.sft_args(learning_rate="0"), "--learning-rate must be > 0"),
        "learning-rate-nan": (f.sft_args(learning_rate="nan"), "must be a finite number"),
        "batch-size-zero": (f.sft_args(batch_size="0"), "--batch-size must be >= 1"),
        "accumulation-zero": (f.sft_args(accumulation="0"), "--accumulation must be >= 1"),
        "epochs-zero": (f.sft_args(epochs="0"), "--epochs must be >= 1"),
        "warmup-negative": (f.sft_args(warmup_steps="-1"), "--warmup-steps must be >= 0"),
        "warmup-longer-than-the-run": (
            f.sft_args(warmup_steps="1000"),
            "leaves no step of the 64-step run to decay",
        ),
        "schedule-unknown": (f.sft_args(lr_schedule="step"), "--lr-schedule must be one of"),
        "wsd-without-decay": (
            f.sft_args(lr_schedule="wsd"),
            "--lr-schedule wsd needs --decay-steps",
        ),
        "lora-rank-zero": (f.sft_args(lora_rank="0"), "--lora-rank must be >= 1"),
        "lora-alpha-negative": (f.sft_args(lora_alpha="-1"), "--lora-alpha must be > 0"),
        "precision-unknown": (f.sft_args(precision="fp16"), "--precision must be"),
        "threads-zero": (f.sft_args(threads="0"), "--threads must be >= 1"),
        "threads-100000": (f.sft_args(threads="100000"), "--threads 100000 is more than"),
        "max-length-zero": (f.sft_args(max_length="0"), "--max-length must be >= 1"),
        "device-unknown": (f.sft_args(device="gpu"), "--device must be cpu, cuda or cuda:N"),
        "inject-not-fault-at-step": (f.sft_args(inject="sampler"), "is not FAULT@STEP"),
        "inject-a-fault-sft-does-not-take": (
            f.sft_args(inject="observation@0"),
            "fault 'observation' does not apply to sft",
        ),
        "shard-base-without-torchrun": (
            [*f.sft_args(), "--shard-base"],
            "--shard-base shards the base across torchrun's processes, and this process was not "
            "started by torchrun",
        ),
        "batch-larger-than-the-data": (  # the cause first, the warm-up it leaves no room for next
            f.sft_args(batch_size="500", warmup_steps="1"),
            "error: one step takes 500 examples (--batch-size 500 x --accumulation 1) and the "
            "data has 64: the run has 1 step(s), and --warmup-steps 1 leaves no step",
        ),
        "checkpointing-with-batch-invariant": (
            [*f.sft_args(), "--batch-invariant", "--gradient-checkpointing"],
            "--gradient-checkpointing does not run with --batch-invariant",
        ),
        "group-size-one": (f.grpo_args(f.arith, group_size="1"), "--group-size"),
        "missing-flags": (
            [
                "tune",
                "sft",
                "--model",
                str(f.toy),
                "--examples",
                str(f.sft),
                "--output",
                str(f.out),
            ],
            "missing required flags: --seed",
        ),  # fmt: skip
        # another library's flag names
        "trl-lr": (f.sft_args(lr="1e-3"), "twinrun's name for TRL's --lr: --learning-rate"),
        "trl-num-train-epochs": ([*f.sft_args(), "--num_train_epochs", "1"], "--epochs"),
        "beta-on-sft": (
            f.sft_args(beta="0.1"),
            "'--beta': a flag of twinrun tune dpo, ipo, simpo, not",
        ),
        "trl-beta-on-grpo": (f.grpo_args(f.arith, beta="0.1"), "TRL's --beta: --kl-beta"),
        "trl-max-steps-on-sft": (
            [*f.sft_args(), "--max_steps", "4"],
            "twinrun's name for TRL's --max_steps: --stop-after",
        ),
        "trl-max-steps-on-grpo": (
            [*f.grpo_args(f.arith), "--max-steps", "4"],
            "twinrun's name for TRL's --max-steps: --steps.",
        ),
        "trl-config-flag": (
            ["tune", "sft", "--config", str(f.yaml)],
            "TRL's --config: `twinrun run CONFIG.toml`",
        ),
        "command-sft": (
            ["sft", *f.sft_args()[2:]],
            "no such command; training is `twinrun tune sft`",
        ),
        "command-train-sft": (
            ["train", "sft", *f.sft_args()[2:]],
            "no such command; training is `twinrun tune sft`",
        ),
        # configs and run directories
        "config-missing": (["run", str(nowhere)], "config file not found"),
        "config-yaml": (["run", str(f.yaml)], "a YAML file"),
        "config-unknown-key": (["run", str(f.toml_typo)], "unknown key train.seed"),
        "corpus-missing": (
            [
                "tune",
                "text",
                "--model",
                str(f.toy),
                "--corpus",
                str(nowhere),
                "--output",
                str(f.out),
                "--steps",
                "1",
                "--window",
                "8",
                "--windows-per-step",
                "1",
                "--batch-size",
                "1",
                *flags(COMMON, chat_template=None),
            ],
            f"corpus file {nowhere} does not exist",
        ),  # fmt: skip
        "export-not-a-run": (["export", str(f.dir), "--output", str(f.out)], "is not a finished"),
        "plot-not-a-run": (
            ["plot", str(f.dir), "--output", str(f.root / "c.png")],
            "metrics.jsonl",
        ),
        "diff-not-a-run": (["diff", str(f.dir), str(f.foreign)], "no diag.jsonl"),
        "reproduce-not-a-run": (["reproduce", str(f.dir), "--output", str(f.out)], "twinrun.json"),
        "golden-check-missing": (["golden", "check", str(nowhere)], "does not exist"),
        "generate-model-missing": (
            [
                "generate",
                "--model",
                str(nowhere),
                "--prompt",
                "p",
                "--max-new-tokens",
                "1",
                "--temperature",
                "1",
                "--seed",
                "1",
                "--chat-template",
                "on",
                "--precision",
                "f32",
                "--threads",
                "1",
            ],
            f"model directory {nowhere} does not exist",
        ),  # fmt: skip
    }


CHILD = """
import contextlib, io, json, sys
from twinrun.cli.main import run_cli

out = []
for name, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        try:
            code = run_cli(argv)
        except SystemExit as exc:  # a refusal must come back as a code, but say what it was
            code = f"SystemExit({exc.code})"
    out.append([name, code, err.getvalue(), "torch" in sys.modules])
    if "torch" in sys.modules:
        break
print(json.dumps(out))
"""


def run_cases(cases: dict[str, tuple[list[str], str]]) -> dict[str, list[Any]]:
    """name -> [exit code, what was printed, torch loaded]; a fresh process after a case that
    loaded torch."""
    left = [[name, argv] for name, (argv, _) in cases.items()]
    results: dict[str, list[Any]] = {}
    while left:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(left)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        for name, *result in json.loads(done.stdout.splitlines()[-1]):
            results[name] = result
        left = [case for case in left if case[0] not in results]
    return results


@pytest.fixture(scope="module")
def refused(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path
) -> tuple[Files, dict[str, tuple[list[str], str]], dict[str, list[Any]]]:
    files = Files(tmp_path_factory.mktemp("mistakes"), toy_model_dir)
    cases = mistakes(files)
    before = sorted(p.relative_to(files.root) for p in files.root.rglob("*"))
    results = run_cases(cases)
    after = sorted(p.relative_to(files.root) for p in files.root.rglob("*"))
    assert after == before, "a refused command wrote something"
    return files, cases, results


def test_the_table_is_large(refused: Any) -> None:
    _, cases, _ = refused
    assert len(cases) >= 43


# the cases' names, for parametrize (the table needs its files; a test keeps the two equal)
NAMES = [
    "model-missing", "model-is-a-file", "model-without-config", "model-a-hub-id",
    "model-pickle-weights-only", "model-without-tokenizer", "init-adapter-missing",
    "resume-nothing-to-resume", "resume-a-finished-run", "examples-typo",
    "examples-a-directory", "examples-empty", "examples-not-json", "examples-text-rows",
    "examples-plain-text", "examples-other-fields", "examples-a-message-without-role",
    "sft-given-pairs",
    "dpo-given-sft-rows", "reward-same-answers", "grpo-chat-prompt-untemplated",
    "csv-header-only", "eval-examples-typo", "eval-examples-pairs", "output-not-empty",
    "output-a-file", "output-inside-the-model", "output-is-the-examples", "seed-negative",
    "learning-rate-zero", "learning-rate-nan", "batch-size-zero", "accumulation-zero",
    "epochs-zero", "warmup-negative", "warmup-longer-than-the-run", "schedule-unknown",
    "wsd-without-decay", "lora-rank-zero", "lora-alpha-negative", "precision-unknown",
    "threads-zero", "threads-100000", "max-length-zero", "device-unknown",
    "inject-not-fault-at-step", "inject-a-fault-sft-does-not-take", "shard-base-without-torchrun",
    "batch-larger-than-the-data", "checkpointing-with-batch-invariant",
    "group-size-one", "missing-flags", "trl-lr", "trl-num-train-epochs", "beta-on-sft",
    "trl-beta-on-grpo", "trl-max-steps-on-sft", "trl-max-steps-on-grpo", "trl-config-flag",
    "command-sft", "command-train-sft", "config-missing",
    "config-yaml", "config-unknown-key", "corpus-missing", "export-not-a-run", "plot-not-a-run",
    "diff-not-a-run", "reproduce-not-a-run", "golden-check-missing", "generate-model-missing",
]  # fmt: skip


def test_every_case_is_in_the_parametrised_list(refused: Any) -> None:
    _, cases, _ = refused
    assert list(cases) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_a_mistake_is_one_line_before_torch_loads(refused: Any, name: str) -> None:
    _, cases, results = refused
    code, printed, torch_loaded = results[name]
    expected = cases[name][1]
    lines = printed.strip().splitlines()
    assert code == 2, (name, code, printed)
    assert len(lines) == 1, (name, lines)
    assert lines[0].startswith(("twinrun: error: ", "reproduce: could not run")), lines[0]
    assert expected in lines[0], (expected, lines[0])
    assert not torch_loaded, f"{name}: torch was imported before the refusal"
