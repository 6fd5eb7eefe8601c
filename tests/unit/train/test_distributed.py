"""The data-parallel helpers without a process group: global order from round-robin parts,
the gradient byte packing, the timeout setting and the device of a process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinrun.core.errors import ConfigError
from twinrun.train.parallel import distributed
from twinrun.train.parallel.gather import gather_gradients, pack, unpack

LAUNCH = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}


def test_interleave_puts_round_robin_parts_in_global_order() -> None:
    # 5 forwards on 2 processes: rank 0 ran 0, 2, 4 and rank 1 ran 1, 3
    assert distributed.interleave([["f0", "f2", "f4"], ["f1", "f3"]]) == [
        "f0", "f1", "f2", "f3", "f4",
    ]  # fmt: skip
    # 2 forwards on 3 processes: rank 2 had none
    assert distributed.interleave([[10], [11], []]) == [10, 11]
    assert distributed.interleave([[], [], []]) == []


def test_without_a_process_group_one_process_does_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    assert not distributed.launched() and not distributed.active()
    assert distributed.world() == distributed.World(0, 1, 0) and distributed.is_root()
    assert list(distributed.mine(3)) == [0, 1, 2]
    assert distributed.in_global_order([3.0, 1.0]) == [3.0, 1.0]
    assert distributed.setup("cpu") == "cpu" and not distributed.active()
    assert distributed.runtime_record() == {}
    distributed.barrier("nothing to wait for")  # no group: returns at once


def test_process_device_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    assert distributed.process_device("cuda:0") == "cuda:0"  # without torchrun: as given
    for name, value in LAUNCH.items():
        monkeypatch.setenv(name, value)
    assert distributed.process_device("cuda") == "cuda:1"
    assert distributed.process_device("cuda:0") == "cuda:1"
    assert distributed.process_device("cpu") == "cpu"


def test_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
    assert distributed.timeout_s() == 300.0
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "12.5")
    assert distributed.timeout_s() == 12.5
    for bad in ("abc", "0", "-3", "nan"):
        monkeypatch.setenv(distributed.TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match="TWINRUN_DIST_TIMEOUT_S"):
            distributed.timeout_s()


def test_pack_unpack_keeps_every_bit_and_every_none() -> None:
    a = torch.nn.Parameter(torch.zeros(2, 3))
    b = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    c = torch.nn.Parameter(torch.zeros(1, 2))
    params = [("a", a), ("b", b), ("c", c)]
    grads = [
        torch.tensor([[1.5, -0.0, float("nan")], [3e-45, -1e38, 0.1]]),
        None,
        torch.tensor([[float("-inf"), 7.0]]),
    ]
    row = pack(params, grads)
    assert row.dtype == torch.uint8 and row.numel() == 6 * 4 + 4 * 2 + 2 * 4 + 3
    back = unpack(params, row)
    assert back[1] is None
    for got, want in ((back[0], grads[0]), (back[2], grads[2])):
        assert got is not None and want is not None
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # NaN, -0.0 kept
    bf = torch.tensor([1.0, -2.5, 0.0, 3.0], dtype=torch.bfloat16)
    back = unpack(params, pack(params, [None, bf, None]))
    assert back[0] is None and back[2] is None and torch.equal(back[1], bf)


def test_gather_without_a_group_returns_the_forwards_as_they_are() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    per_forward = [[[torch.ones(2)]], [[None]]]
    out, sent = gather_gradients([("p", p)], per_forward)
    assert out is per_forward and sent == 0


def test_shard_base_without_torchrun_is_a_clear_error_and_writes_nothing(
    toy_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from testkit.toy_runs import run_args, write_examples
    from twinrun.cli.main import run_cli

    examples = write_examples(tmp_path / "data")["sft"]
    out = tmp_path / "run"
    assert run_cli([*run_args("sft", toy_model_dir, examples, out), "--shard-base"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "twinrun: error: --shard-base shards the base across torchrun's processes, and this "
        "process was not started by torchrun — run it as torchrun --nproc-per-node N -m twinrun "
        "..., or leave --shard-base out"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("world_size", "extra", "line"),
    [
        ("0", ("--shard-base", "--batch-invariant"),
         "--shard-base does not run with --batch-invariant (its packed forwards call the layers "
         "one by one, outside FSDP's units) — leave one of them out"),
        ("2", ("--trace-step", "0"),
         "--trace-step traces the forwards of one process; under torchrun each process runs only "
         "some of the step's forwards — trace the step in a run without torchrun (its bytes are "
         "the same)"),
    ],
)  # fmt: skip
def test_what_a_run_asks_of_torchruns_processes_is_checked_first(
    toy_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, world_size: str, extra: tuple[str, ...], line: str,
) -> None:  # fmt: skip
    """Under torchrun (its variables set, no process group joined), `--shard-base` with
    `--batch-invariant` and `--trace-step` on more than one process are refused by the input
    checks: one line, nothing written, no process group."""
    from testkit.toy_runs import run_args, write_examples
    from twinrun.cli.main import run_cli

    for name in distributed.LAUNCH_ENV:
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("WORLD_SIZE", world_size)
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "5")  # a check moved after the group: it fails
    examples = write_examples(tmp_path / "data")["sft"]
    out = tmp_path / "run"
    assert run_cli([*run_args("sft", toy_model_dir, examples, out), *extra]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"twinrun: error: {line}"]
    assert not out.exists() and not distributed.active()


def test_several_processes_are_read_from_torchruns_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun with one process (`--nproc-per-node 1`) is one process: the step's forwards are
    all its own (`--trace-step` is not refused there)."""
    for name in distributed.LAUNCH_ENV:
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.launched() and not distributed.several_processes()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.several_processes()
    monkeypatch.delenv("RANK")
    assert not distributed.several_processes()  # not started by torchrun


def test_forward_slots_pad_every_process_to_the_most_forwards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3 processes, 5 forwards: ranks 0, 1 run 2 each, rank 2 runs forward 2 and a padding
    repeat of it; unsharded, rank 2 runs forward 2 alone. 2 forwards: rank 2 repeats forward 0."""
    from types import SimpleNamespace

    from twinrun.train.parallel import sharding

    sharded, plain = SimpleNamespace(sharded=True), SimpleNamespace(sharded=False)
    slots = {}
    for rank in range(3):
        monkeypatch.setattr(distributed, "world", lambda r=rank: distributed.World(r, 3, r))
        slots[rank] = (
            sharding.forward_slots(5, sharded), sharding.forward_slots(5, plain),
            sharding.forward_slots(2, sharded),
        )  # fmt: skip
    assert slots[0] == ([(0, False), (3, False)], [(0, False), (3, False)], [(0, False)])
    assert slots[1][0] == [(1, False), (4, False)]
    assert slots[2] == ([(2, False), (2, True)], [(2, False)], [(0, True)])


def test_disagreement_names_the_first_rank_and_its_settings() -> None:
    same = {"seed": 1, "diag": True, "model sha256": "ab" * 32}
    assert distributed.disagreement([same, dict(same), dict(same)]) is None
    line = distributed.disagreement([same, same, same | {"seed": 2}, same | {"diag": False}])
    assert line == (
        "rank 2 of 4 was started with other settings or inputs than rank 0: "
        "seed (rank 2: 2, rank 0: 1)"
    )
    only_there = distributed.disagreement([same, same | {"eval sha256": "cd" * 32}])
    assert only_there is not None
    assert "eval sha256 (rank 1: cdcdcdcdcdcdcdcdcdcdc..., rank 0: (not set))" in only_there
    distributed.agree("no group", {"seed": 1})  # one process: nothing to agree with


def test_agreement_record_leaves_paths_out_and_hides_env_arg_values() -> None:
    from twinrun.config.run import RunConfig, shaping_numbers
    from twinrun.train.parallel.agreement import agreement_record

    def record(**kw: object) -> dict:
        cfg = RunConfig(objective="grpo", seed=1, env="m:f", device="cuda:1", **kw)  # type: ignore[arg-type]
        return agreement_record(cfg, {"train": shaping_numbers(cfg), "model_sha256": "x"})

    a, b = record(env_args={"key": "SECRET"}), record(env_args={"key": "OTHER"})
    assert a["device"] == "cuda" and a["model sha256"] == "x" and "model" not in a
    assert a["env_args"] != b["env_args"] and "SECRET" not in json.dumps(a)


def test_a_collective_that_runs_out_of_memory_here_says_so_and_blames_no_other_process() -> None:
    full = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                        "28317696 bytes. Error code 12 (Cannot allocate memory)")  # fmt: skip
    with pytest.raises(RuntimeError) as caught, distributed.collective("a step"):
        raise full
    assert caught.value is full  # the CLI's memory line says it
    with pytest.raises(distributed.DistributedError, match="another process stopped"):
        with distributed.collective("a step"):
            raise RuntimeError("Connection closed by peer")
