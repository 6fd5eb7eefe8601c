"""Sharded loading (`--shard-base`): each process reads exactly its own rows of every weight
(an instrumented reader, against `torch.chunk` of each tensor's rows, on 2 and 3 processes, a
tied-embeddings checkpoint at f32 and bf16) and the run writes the bytes of 1 process; a base
whose f32 weights exceed a per-process cap (RLIMIT_DATA) trains sharded on 2 processes under that
cap, writing the bytes of the uncapped 1-process run, while 1 process under the same cap is
refused up front in one line."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from testkit.toy_runs import run_args, write_examples
from tests.distributed.launch import launch_env, torchrun
from tests.distributed.runs import with_flags
from twinrun.cli.main import run_cli
from twinrun.core.safetensors_io import tensor_spans

READER = Path(__file__).with_name("read_log.py")
ADAPTER = "adapter_model.safetensors"


def tied_checkpoint(toy: Path, out: Path) -> Path:
    """The toy checkpoint with its output head tied to the embeddings (and no lm_head tensor)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(toy, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    tensors = load_file(out / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def expected_reads(model: Path, rank: int, world: int) -> Counter[tuple[str, int, int]]:
    """The byte ranges rank `rank` of `world` owns: for every tensor, the bytes of its chunk of
    rows as `torch.chunk` cuts them (what FSDP2 keeps), none for an empty chunk."""
    out: Counter[tuple[str, int, int]] = Counter()
    path = model / "model.safetensors"
    for span in tensor_spans(path, "weights", "").values():
        rows = span.shape[0]
        chunks = torch.chunk(torch.arange(rows), world)
        if rank >= len(chunks) or len(chunks[rank]) == 0:
            continue
        row = span.length // rows
        first = int(chunks[rank][0])
        out[(str(path), span.offset + first * row, len(chunks[rank]) * row)] += 1
    return out


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("tied")
    model = tied_checkpoint(toy_model_dir, root / "model")
    examples = write_examples(root / "data")["sft"]
    runs = {}
    for precision in ("f32", "bf16"):
        args = with_flags(
            run_args("sft", model, examples, root / "one" / precision), precision=precision
        )
        assert run_cli(args) == 0
        runs[precision] = args
    return model, {"root": root, "runs": runs}


@pytest.mark.parametrize("world", [2, 3])
def test_each_process_reads_only_its_own_rows_and_writes_the_bytes_of_one(
    tied: tuple[Path, dict], world: int
) -> None:
    model, setup = tied
    root: Path = setup["root"]
    logs = root / f"reads-{world}"
    outs = {p: root / f"sharded-{world}" / p for p in setup["runs"]}
    many = [
        [*with_flags(args, output=str(outs[p])), "--shard-base"]
        for p, args in setup["runs"].items()
    ]
    spec = root / f"runs-{world}.json"
    spec.write_text(json.dumps(many))
    job = torchrun(world, [str(READER), str(spec)], env={"READ_LOG_DIR": str(logs)})
    assert job.returncode == 0, job.stderr[-3000:]
    for precision, out in outs.items():
        one = root / "one" / precision / ADAPTER
        assert (out / ADAPTER).read_bytes() == one.read_bytes(), precision
        one_sha = json.loads((one.parent / "twinrun.json").read_text())["model"]["sha256"]
        assert json.loads((out / "twinrun.json").read_text())["model"]["sha256"] == one_sha
    covered: Counter[tuple[str, int, int]] = Counter()
    for rank in range(world):
        reads = Counter(tuple(r) for r in json.loads((logs / f"rank{rank}.json").read_text()))
        # exactly its own rows of every tensor, once per run (2 runs), nothing else
        owned = expected_reads(model, rank, world)
        assert reads == Counter({k: 2 * n for k, n in owned.items()}), rank
        covered += owned
    # between them the processes read every byte of every tensor exactly once per run
    spans = tensor_spans(model / "model.safetensors", "weights", "").values()
    assert sum(length for (_, _, length) in covered) == sum(s.length for s in spans)


# ------------------------------------------------------------------ a base that does not fit


def big_checkpoint(toy: Path, out: Path) -> int:
    """A Llama checkpoint written by transformers' own classes (25 layers, hidden 768: about
    708 MB of f32 weights, 28 MB a unit of FSDP) with the toy's tokenizer; returns the bytes of
    its weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    toy_config = json.loads((toy / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=toy_config["vocab_size"], hidden_size=768, intermediate_size=2048,
        num_hidden_layers=25, num_attention_heads=12, num_key_value_heads=12,
        max_position_embeddings=256, bos_token_id=toy_config.get("bos_token_id"),
        eos_token_id=toy_config.get("eos_token_id"), tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out)
    for name in toy.iterdir():
        if name.name not in ("config.json", "model.safetensors") and name.is_file():
            shutil.copy(name, out / name.name)
    return sum(p.numel() * 4 for p in model.parameters())


def probe_data_bytes() -> int:
    """VmData of a fresh process that imported what a twinrun run imports."""
    code = (
        "import torch, transformers, twinrun.cli.main, twinrun.train.setup.session\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmData')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env=os.environ | {"OMP_NUM_THREADS": "1"}, preexec_fn=capped(None),
    )  # fmt: skip
    return int(done.stdout) * 1024


STACK = 2**20  # each thread's stack, reserved whole and counted whole in RLIMIT_DATA


def capped(limit: int | None) -> Callable[[], None]:
    """The cap, set in the child before it runs: RLIMIT_DATA `limit` (none: only the stacks),
    and 1 MiB thread stacks (glibc reserves RLIMIT_STACK, 8 MiB, for each thread, untouched
    but counted: torchrun's processes run more threads than one process)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (STACK, STACK))
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    return apply


def test_a_base_larger_than_the_cap_trains_sharded_and_one_process_is_refused(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    model = tmp_path / "big"
    weights = big_checkpoint(toy_model_dir, model)
    examples = tmp_path / "short.jsonl"  # short rows: the activations stay small beside the base
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a, b in ((1, 2), (3, 4), (5, 6))]
    examples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    # what a twinrun process maps once it imported everything, plus the weights less 64 MiB:
    # the whole base cannot fit one process (which maps about 70 MiB more before it loads: the
    # tokenizer, the data), by ~130 MiB; each of 2 sharded processes peaks about 210 MiB above
    # half of it (a process group's threads, a few units all-gathered at a time, short rows'
    # activations), ~70 MiB under the cap — margins on both sides that machine-to-machine
    # differences in what a process maps do not close
    limit = probe_data_bytes() + weights - 64 * 2**20
    uncapped = with_flags(
        run_args("sft", model, examples, tmp_path / "one"), batch_size="1", chat_template="off"
    )
    assert run_cli(uncapped) == 0

    refused = subprocess.run(
        [sys.executable, "-m", "twinrun", *with_flags(uncapped, output=str(tmp_path / "capped"))],
        capture_output=True, text=True, preexec_fn=capped(limit), timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-2000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert "the base needs 0.71 GB; this process may use" in line, line
    assert "shard it with --shard-base under torchrun" in line
    assert not (tmp_path / "capped" / ADAPTER).exists()

    sharded = [*with_flags(uncapped, output=str(tmp_path / "sharded")), "--shard-base"]
    cmd, env = launch_env(2, ["-m", "twinrun", *sharded])
    job = subprocess.run(
        cmd, env=env, capture_output=True, text=True, preexec_fn=capped(limit), timeout=300
    )
    # the workers' own last words come before torchrun's summary: show both
    assert job.returncode == 0, job.stderr[-6000:]
    one = (tmp_path / "one" / ADAPTER).read_bytes()
    assert (tmp_path / "sharded" / ADAPTER).read_bytes() == one
