"""Processes agree before they train: a rank started with another seed, another examples file
and without --diag stops every process, with one line naming the rank and each setting, before
anything is written; so does a sharded rank given another model, or seeing other bytes at the
same path (the rows it reads are checked against rank 0's hash)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import run_args, write_examples
from tests.distributed.launch import FAULT_ENV, FAULT_TIMEOUT_S, Job, torchrun

PER_RANK = Path(__file__).with_name("per_rank.py")
OTHER_BYTES = Path(__file__).with_name("other_bytes.py")


def torch_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dist_agree")
    examples = write_examples(folder)
    rows = examples["sft"].read_text().splitlines()
    other = folder / "sft-other.jsonl"  # same rows, the last one changed
    last = json.loads(rows[-1])
    if "messages" in last:
        last["messages"][-1]["content"] += " (edited)"
    else:
        last["completion"] += " (edited)"
    other.write_text("\n".join([*rows[:-1], json.dumps(last)]) + "\n")
    return folder


def change(args: list[str], flag: str, value: str | None) -> list[str]:
    """`args` with `flag`'s value replaced (a boolean flag removed when value is None)."""
    i = args.index(flag)
    if value is None:
        return args[:i] + args[i + 1 :]
    return [*args[: i + 1], value, *args[i + 2 :]]


# rank 1's changes, each named in the one line (the line names up to three settings)
CHANGES = [
    ("--seed", "2", "seed (rank 1: 2, rank 0: 1)"),
    ("--examples", "sft-other.jsonl", "examples/corpus sha256"),
    ("--diag", None, "diag (rank 1: False, rank 0: True)"),
]


def test_a_rank_with_other_settings_stops_every_process(data: Path, toy_model_dir: Path) -> None:
    """One job (a torchrun start costs ~20 s on 2 cores): rank 1 differs from rank 0 in its seed,
    its examples file and --diag, and each difference is named."""
    out = data / "out"
    args = run_args("sft", toy_model_dir, data / "sft8.jsonl", out, "--diag")
    other = args
    for flag, value, _ in CHANGES:
        other = change(other, flag, str(data / value) if flag == "--examples" else value)
    spec = data / "ranks.json"
    spec.write_text(json.dumps([args, other]))
    job = torchrun(2, [str(PER_RANK), str(spec)], paths=(data,), env=FAULT_ENV,
                   timeout=FAULT_TIMEOUT_S + 120)  # fmt: skip
    assert job.returncode != 0
    assert job.seconds < FAULT_TIMEOUT_S  # every rank stopped at the check, none waited
    ours = [line for line in job.stderr.splitlines() if line.startswith("twinrun: ")]
    assert len(ours) == 2, job.stderr[-2000:]
    for line in ours:  # each rank's one line, the same on every rank
        assert line.startswith("twinrun: error: rank 1 of 2 was started with other settings")
        for _, _, named in CHANGES:
            assert named in line, line
        assert " more" not in line  # exactly these three
    assert ours[0] == ours[1]
    assert "internal error" not in job.stderr
    written = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert written == []


def every_rank_refused_other_bytes(job: Job, out: Path, where: str) -> str:
    """Both processes stopped in the same one line (rank 1 read other bytes than rank 0 hashed,
    at `where`), nothing written; returns the line."""
    assert job.returncode != 0
    ours = [line for line in job.stderr.splitlines() if line.startswith("twinrun: ")]
    assert len(ours) == 2 and ours[0] == ours[1], job.stderr[-2000:]
    assert ours[0].startswith(
        "twinrun: error: rank 1 of 2 read other bytes of the base than rank 0 hashed "
        f"(model.safetensors, {where}"
    ), ours[0]
    assert "internal error" not in job.stderr  # (torchrun's own summary is a traceback)
    assert not out.exists() or sorted(out.iterdir()) == []
    return ours[0]


def test_a_sharded_rank_given_another_model_stops_every_process(
    data: Path, toy_model_dir: Path
) -> None:
    """--shard-base: rank 1 is given another checkpoint with the same config, tokenizer and
    header (a toy of another seed), so only the weights' bytes differ; the rows it reads are
    not the bytes rank 0 hashed, and every process stops in the same one line before anything
    is written (tests/unit/model/test_shard_digests.py: other bytes at the same path, the
    pieces)."""
    from twinrun.model.toy import write_toy_checkpoint

    other_model = data / "toy-seed-1"
    write_toy_checkpoint(other_model, seed=1)
    out = data / "sharded-out"
    args = run_args("sft", toy_model_dir, data / "sft8.jsonl", out, "--shard-base")
    spec = data / "ranks-model.json"
    spec.write_text(json.dumps([args, change(args, "--model", str(other_model))]))
    job = torchrun(2, [str(PER_RANK), str(spec)], paths=(data,))
    line = every_rank_refused_other_bytes(job, out, "model.embed_tokens.weight rows ")
    assert "Expected sha256 " in line and "  Got " in line


def test_a_sharded_rank_seeing_other_bytes_at_the_same_path_stops_every_process(
    data: Path, toy_model_dir: Path
) -> None:
    """--shard-base, the same command on both ranks, but rank 1 reads other bytes at the model's
    path (tests/distributed/other_bytes.py flips a byte of each range it reads): its first
    piece is not the bytes rank 0 hashed, and every process stops in the same one line before
    anything is written."""
    out = data / "same-path-out"
    args = run_args("sft", toy_model_dir, data / "sft8.jsonl", out, "--shard-base")
    spec = data / "runs-same-path.json"
    spec.write_text(json.dumps([args]))
    job = torchrun(2, [str(OTHER_BYTES), str(spec)], paths=(data,))
    every_rank_refused_other_bytes(job, out, "")


@pytest.mark.skipif(torch_has_cuda(), reason="this machine has CUDA: --device cuda would run")
def test_device_cuda_without_cuda_is_one_line_under_torchrun(
    data: Path, toy_model_dir: Path
) -> None:
    """Under torchrun each process is given cuda:LOCAL_RANK; where there is no CUDA, each says so
    in the one line a single process says (a rank torchrun ends first prints nothing), before any
    process group or file exists."""
    out = data / "cuda-out"
    args = run_args("sft", toy_model_dir, data / "sft8.jsonl", out, "--device", "cuda")
    job = torchrun(2, ["-m", "twinrun", *args])
    assert job.returncode != 0
    ours = [line for line in job.stderr.splitlines() if line.startswith("twinrun: ")]
    # each rank that printed before torchrun ended the others (the first to fail ends them)
    assert 1 <= len(ours) <= 2, job.stderr[-2000:]
    expected = {
        f"twinrun: error: --device cuda:{rank} asked for but no CUDA device is available — "
        "use --device cpu"
        for rank in (0, 1)
    }
    assert set(ours) <= expected, ours
    assert "internal error" not in job.stderr and "_cuda_setDevice" not in job.stderr
    assert not out.exists()
