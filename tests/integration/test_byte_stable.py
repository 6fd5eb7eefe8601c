"""Every file a command writes is the same bytes when the same command runs again.

Each command runs twice with the same arguments: it writes under `tmp/run/`, which is then
renamed to `tmp/first/` (then `tmp/second/`), so both runs record the same paths, and every file
under the two is compared byte for byte. A temporary name, the time, the process or an order that
changes from call to call shows up as a difference.

The only values allowed to differ are the documented measurements of the machine, and only
these are removed (from a parsed copy, whose key order is kept) before comparing:
- each `metrics.jsonl` row, and the copy of those rows in a checkpoint's `state.json`
  (`metrics`): the wall times in WALL_TIMES and `peak_memory_bytes`, the process's peak memory
  (docs/determinism.md, docs/capture.md);
- `twinrun.json`: `metrics.wall_s`;
- a checkpoint's `checksums.json`: the SHA256 of its `state.json` (which holds those times; the
  other files' digests stay).
Every other file, and every other field of those four, must be equal exactly.

Reruns in one process share its string hash seed (set order), so the last test runs extract,
steering, init-adapter and tune in two fresh processes with different PYTHONHASHSEED values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import tomli_w

from testkit.captures import epoch_source, shipped
from testkit.toy_runs import run_args, write_examples
from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples

ROOT = Path(__file__).resolve().parents[2]
WALL_TIMES = ("wall_s", "collect_s", "forward_s", "backward_s", "optimizer_s",
              "local_train_wall_s", "rollout_s", "update_s")  # fmt: skip
MEASURED = (*WALL_TIMES, "peak_memory_bytes")
ADAPTER = {"adapter_config.json", "adapter_model.safetensors"}
RUN = {"metrics.jsonl", "twinrun.json", "twinrun.inputs.json", "twinrun.files.jsonl"}


def _measured_removed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in MEASURED} for row in rows]


def comparable(name: str, data: bytes) -> bytes:
    """The bytes to compare: the file itself, or for the three files that carry measurements,
    their JSON with only those keys removed (key order kept)."""
    base = name.rsplit("/", 1)[-1]
    if base == "metrics.jsonl":
        rows = _measured_removed([json.loads(line) for line in data.decode().splitlines()])
        return "".join(json.dumps(r) + "\n" for r in rows).encode()
    if base == "twinrun.json":
        record = json.loads(data)
        record["metrics"].pop("wall_s")
        return json.dumps(record).encode()
    if base == "state.json" and "/checkpoints/" in f"/{name}":
        body = json.loads(data)
        body["metrics"] = _measured_removed(body["metrics"])
        return json.dumps(body).encode()
    if base == "checksums.json" and "/checkpoints/" in f"/{name}":
        listing = json.loads(data)
        listing["sha256"].pop("state.json")
        return json.dumps(listing).encode()
    return data


def written(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def rerun(tmp: Path, make_args: Callable[[Path], list[str]], rc: int = 0) -> dict[str, bytes]:
    """Run the command twice (see the module docstring), assert every file is the same, return
    the files of the first run."""
    got = []
    for label in ("first", "second"):
        run = tmp / "run"
        run.mkdir()
        assert run_cli(make_args(run)) == rc
        run.rename(tmp / label)
        got.append(written(tmp / label))
    return assert_same(*got)


def assert_same(first: dict[str, bytes], second: dict[str, bytes]) -> dict[str, bytes]:
    assert sorted(first) == sorted(second)
    differ = [n for n in first if comparable(n, first[n]) != comparable(n, second[n])]
    assert differ == [], f"rewritten with other bytes: {differ}"
    return first


def extract_args(model: Path, examples: Path, out: Path, *extra: str) -> list[str]:
    return [
        "extract", "--model", str(model), "--examples", str(examples), "--layer", "2",
        "--pool", "last", "--chat-template", "on", "--precision", "f32", "--batch-size", "4",
        "--output", str(out), "--threads", "1", "--quiet", *extra,
    ]  # fmt: skip


def test_extract_hidden_states(tmp_path: Path, toy_model_dir: Path) -> None:
    examples = shipped_examples("sft.jsonl")
    files = rerun(
        tmp_path, lambda run: extract_args(toy_model_dir, examples, run / "h.safetensors")
    )
    assert set(files) == {"h.safetensors", "h.json"}


def test_extract_steering_vector(tmp_path: Path, toy_model_dir: Path) -> None:
    pairs = shipped_examples("pairs.jsonl")
    files = rerun(
        tmp_path,
        lambda run: extract_args(toy_model_dir, pairs, run / "s.safetensors", "--steering"),
    )
    assert set(files) == {"s.safetensors", "s.json"}


def test_toy_model(tmp_path: Path) -> None:
    files = rerun(tmp_path, lambda run: ["toy-model", str(run / "toy"), "--seed", "0"])
    assert {"toy/model.safetensors", "toy/config.json", "toy/tokenizer.json"} <= set(files)


def test_init_adapter(tmp_path: Path, toy_model_dir: Path) -> None:
    files = rerun(tmp_path, lambda run: [
        "init-adapter", str(run / "init"), "--model", str(toy_model_dir), "--seed", "3",
        "--lora-rank", "4", "--lora-alpha", "8",
    ])  # fmt: skip
    assert set(files) == {f"init/{n}" for n in (*ADAPTER, "trainer_state.json")}


def test_tune_sft_with_diag_trace_and_checkpoints(tmp_path: Path, toy_model_dir: Path) -> None:
    examples = write_examples(tmp_path / "data")["sft"]
    extra = ("--diag", "--trace-step", "1", "--checkpoint-every", "1")
    files = rerun(tmp_path, lambda run: run_args("sft", toy_model_dir, examples, run / "a", *extra))
    ckpt = {f"checkpoints/step-000001/{n}" for n in ("state.json", "state.safetensors",
                                                      "checksums.json")}  # fmt: skip
    assert set(files) == {f"a/{n}" for n in (*ADAPTER, *RUN, "diag.jsonl", "trace.jsonl", *ckpt)}


def test_tune_reward_and_its_head(tmp_path: Path, toy_model_dir: Path) -> None:
    examples = write_examples(tmp_path / "data")["reward"]
    files = rerun(tmp_path, lambda run: run_args("reward", toy_model_dir, examples, run / "r"))
    assert set(files) == {f"r/{n}" for n in (*ADAPTER, *RUN, "reward_head.safetensors")}


def test_diff_report_png(tmp_path: Path, toy_model_dir: Path) -> None:
    examples = write_examples(tmp_path / "data")["sft"]
    a, b = tmp_path / "seed-1", tmp_path / "seed-2"
    assert run_cli(run_args("sft", toy_model_dir, examples, a, "--diag")) == 0
    assert run_cli([*run_args("sft", toy_model_dir, examples, b, "--diag"), "--seed", "2"]) == 0
    files = rerun(tmp_path, lambda run: ["diff", str(a), str(b), "--report", str(run / "d.png")],
                  rc=1)  # fmt: skip
    assert list(files) == ["d.png"] and files["d.png"][:8] == b"\x89PNG\r\n\x1a\n"


def test_capture_of_an_sft_step(tmp_path: Path, toy_model_dir: Path) -> None:
    init = tmp_path / "init"
    assert run_cli(["init-adapter", str(init), "--model", str(toy_model_dir), "--seed", "5",
                    "--lora-rank", "4", "--lora-alpha", "8"]) == 0  # fmt: skip
    (tmp_path / "data").mkdir()
    examples = shipped("sft.jsonl", tmp_path / "data")
    config = tmp_path / "capture.toml"
    doc = epoch_source("sft", toy_model_dir, init, tmp_path / "run" / "c", examples)
    config.write_text(tomli_w.dumps(doc))
    files = rerun(tmp_path, lambda run: ["run", str(config)])
    capture = {f"optimizer_batch_step_000000.{e}" for e in ("manifest.json", "safetensors")}
    final = {f"final/{n}" for n in ADAPTER}
    assert set(files) == {
        f"c/{n}" for n in (*ADAPTER, *RUN, *capture, *final, "resolved_config.json")
    }


def test_golden_write(tmp_path: Path) -> None:
    files = rerun(tmp_path, lambda run: ["golden", "write", str(run)])
    assert len(files) == 1 and next(iter(files)).startswith("golden-")


WRITERS = """
import sys
from pathlib import Path
from testkit.toy_runs import run_args
from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples
model, examples, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
base = ["--model", str(model), "--layer", "2", "--pool", "mean", "--chat-template", "on",
        "--precision", "f32", "--batch-size", "4", "--threads", "1", "--quiet"]
for args in (
    ["extract", *base, "--examples", str(examples), "--output", str(out / "h.safetensors")],
    ["extract", *base, "--examples", str(shipped_examples("pairs.jsonl")), "--steering",
     "--output", str(out / "s.safetensors")],
    ["init-adapter", str(out / "init"), "--model", str(model), "--seed", "3", "--lora-rank", "4",
     "--lora-alpha", "8"],
    run_args("sft", model, examples, out / "sft", "--diag", "--checkpoint-every", "1"),
):
    assert run_cli(args) == 0, args
"""


def test_fresh_processes_with_other_hash_seeds(tmp_path: Path, toy_model_dir: Path) -> None:
    """Both processes at once, each into its own folder (none of these writers records it)."""
    examples = write_examples(tmp_path / "data")["sft"]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    procs = {}
    for label, seed in (("first", "1"), ("second", "2")):
        (tmp_path / label).mkdir()
        argv = [
            sys.executable,
            "-c",
            WRITERS,
            *map(str, (toy_model_dir, examples, tmp_path / label)),
        ]
        procs[label] = subprocess.Popen(argv, cwd=ROOT, env=env | {"PYTHONHASHSEED": seed},
                                        stderr=subprocess.PIPE, text=True)  # fmt: skip
    for proc in procs.values():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    first = assert_same(written(tmp_path / "first"), written(tmp_path / "second"))
    assert len(first) == 17, sorted(first)  # 2 + 2 extract, 3 init-adapter, 10 tune
