"""What each process of a sharded base proves it read, on one process: rank 0's one pass gives
the 1-process model SHA256 and the digest of every piece (the header, each process's rows of each
tensor: they tile the file); a process that reads other bytes at its path is named in one line;
the agreement compares each process's own outline (files beside the weights, the headers) and
the CPU kernels."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from twinrun.core.errors import ConfigError
from twinrun.core.safetensors_io import tensor_spans
from twinrun.model import shard_digests, shards
from twinrun.model.loading import model_sha256
from twinrun.train.parallel import distributed

WEIGHTS = "model.safetensors"


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_rank_0s_pass_is_the_model_sha256_and_its_pieces_tile_the_file(
    toy_model_dir: Path, world: int
) -> None:
    base = shard_digests.base_digests(toy_model_dir, world)
    assert base.sha256 == model_sha256(toy_model_dir)  # what the sidecar records, unchanged
    data = (toy_model_dir / WEIGHTS).read_bytes()
    table = base.pieces[WEIGHTS]
    position = 0
    for offset in sorted(table):
        length, digest, _label = table[offset]
        assert offset == position
        assert digest == hashlib.sha256(data[offset : offset + length]).hexdigest()
        position += length
    assert position == len(data)
    if world > 1:
        _, _, label = table[tensor_spans(toy_model_dir / WEIGHTS, "w", "")["lm_head.weight"].offset]
        assert label.startswith("lm_head.weight rows 0..")


def filled(model: Path, expected: shard_digests.BaseDigests) -> shard_digests.ReadCheck:
    """The toy's weights read (whole, as one process reads them) through a ReadCheck."""
    hf = shards.skeleton(model, torch.float32, "eager")
    hf.to_empty(device="cpu")
    hf.requires_grad_(False)  # the base, as the model builder leaves it
    check = shard_digests.ReadCheck(expected, model)
    shards.fill_shards(hf, model, 0, 1, check)
    return check


def test_a_process_reading_other_bytes_at_its_path_is_named_in_one_line(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    expected = shard_digests.base_digests(toy_model_dir, 2)  # rank 0's view
    same = filled(toy_model_dir, expected)
    assert same.problem is None
    assert same.bytes_checked == (toy_model_dir / WEIGHTS).stat().st_size  # header and rows
    distributed.first_problem("checking", same.problem, "hint")  # nothing to say
    # another process's view of the path: one byte of rank 1's rows of a layer's weight
    other = tmp_path / "model"
    shutil.copytree(toy_model_dir, other)
    span = tensor_spans(other / WEIGHTS, "w", "")["model.layers.1.mlp.up_proj.weight"]
    start, _ = shards.owned_span(span, 1, 2)
    flip_byte(other / WEIGHTS, start + 5)
    check = filled(other, expected)
    assert check.problem is not None
    with pytest.raises(ConfigError) as err:
        distributed.first_problem("checking", check.problem, "use the same bytes")
    line = err.value.one_line()
    assert "\n" not in line
    rows = shards.owned_rows(span.shape[0], 1, 2)
    assert line.startswith(
        "this process read other bytes of the base than rank 0 hashed (model.safetensors, "
        f"model.layers.1.mlp.up_proj.weight rows {rows[0]}..{rows[1]}): Expected sha256 "
        f"{expected.pieces[WEIGHTS][start][1]}  Got "
    )


def test_the_sharded_agreement_compares_each_processs_outline_and_the_kernels(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    from twinrun.config.run import RunConfig, shaping_numbers
    from twinrun.train.parallel.agreement import agreement_record

    outline = shard_digests.outline_sha256(toy_model_dir)
    copy = tmp_path / "copy"
    shutil.copytree(toy_model_dir, copy)
    assert shard_digests.outline_sha256(copy) == outline  # the same bytes elsewhere
    flip_byte(copy / WEIGHTS, (copy / WEIGHTS).stat().st_size - 1)
    assert shard_digests.outline_sha256(copy) == outline  # data: checked as each reads its rows
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | {"rms_norm_eps": 1e-5}))
    assert shard_digests.outline_sha256(copy) != outline

    def record(kernels: str, model_outline: str) -> dict[str, Any]:
        cfg = RunConfig(objective="sft", seed=1, shard_base=True, cpu_kernels=kernels, threads=1)
        inputs = {"train": shaping_numbers(cfg), "model_sha256": "rank 0's, broadcast"}
        return agreement_record(cfg, inputs, model_outline)

    ours = record("portable", outline)
    assert ours["model sha256"] == outline
    line = distributed.disagreement([ours, record("native", shard_digests.outline_sha256(copy))])
    assert line is not None
    assert "cpu_kernels (rank 1: native, rank 0: portable)" in line
    assert f"model sha256 (rank 1: {shard_digests.outline_sha256(copy)[:21]}..." in line
