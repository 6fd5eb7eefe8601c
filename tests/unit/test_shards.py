"""Sharded loading's parts on one process: the rows a process owns are `torch.chunk`'s (what
FSDP2 keeps), the header-only span reader reads each tensor's exact bytes and refuses a damaged
header, or spans set onto another tensor's (as the library refuses them), in one line, the
up-front memory check refuses in one line naming both sizes (a cgroup's limit less what the
group holds beside its page cache), the allocator setting is what the sidecar records, and
`from_root` without a process group is the computation itself."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

from twinrun.core.errors import DataError, ModelError
from twinrun.core.safetensors_io import check_header, read_span, tensor_spans
from twinrun.model import shards
from twinrun.train import distributed, sharding


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_owned_rows_are_torch_chunks(world: int) -> None:
    for rows in range(0, 30):
        chunks = torch.chunk(torch.arange(rows), world) if rows else ()
        for rank in range(world):
            a, b = shards.owned_rows(rows, rank, world)
            want = chunks[rank].tolist() if rank < len(chunks) else []
            assert list(range(a, b)) == want, (rows, rank, world)


def test_spans_read_each_tensors_exact_bytes(toy_model_dir: Path) -> None:
    from safetensors.torch import load_file

    path = toy_model_dir / "model.safetensors"
    tensors = load_file(path)
    spans = tensor_spans(path, "weights", "hint")
    assert set(spans) == set(tensors)
    for name, span in spans.items():
        out = bytearray(span.length)
        read_span(path, span.offset, memoryview(out))
        assert bytes(out) == tensors[name].contiguous().view(torch.uint8).numpy().tobytes(), name
        assert span.shape == tuple(tensors[name].shape)


def test_a_cut_header_is_one_line(tmp_path: Path, toy_model_dir: Path) -> None:
    cut = tmp_path / "model.safetensors"
    cut.write_bytes((toy_model_dir / "model.safetensors").read_bytes()[:100])
    with pytest.raises(DataError) as err:
        tensor_spans(cut, "model weights", "re-save it")
    assert "is not a readable safetensors file" in err.value.one_line()
    assert "\n" not in err.value.one_line()


def test_a_base_larger_than_the_process_may_use_is_refused_up_front(
    toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spans = tensor_spans(toy_model_dir / "model.safetensors", "w", "").values()
    whole = sum(s.length for s in spans)
    monkeypatch.setattr(shards, "data_limit_bytes", lambda: (whole // 3, "RLIMIT_DATA"))
    with pytest.raises(ModelError) as err:
        shards.check_fits(toy_model_dir, torch.float32, 1)
    line = err.value.one_line()
    assert line.startswith("the base needs 0.00 GB; this process may use 0.00 GB (RLIMIT_DATA)")
    assert "shard it with --shard-base under torchrun" in line
    with pytest.raises(ModelError, match="a 1/2 shard of the base needs"):
        shards.check_fits(toy_model_dir, torch.float32, 2)
    shards.check_fits(toy_model_dir, torch.float32, 4)  # a quarter fits
    shards.check_fits(toy_model_dir, torch.bfloat16, 2)  # half of bf16 weights: a quarter
    monkeypatch.setattr(shards, "data_limit_bytes", lambda: None)
    shards.check_fits(toy_model_dir, torch.float32, 1)


def test_a_cgroup_limit_counts_what_the_group_holds_less_its_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import resource

    (tmp_path / "memory.max").write_text("1000000000\n")
    (tmp_path / "memory.current").write_text("600000000\n")
    (tmp_path / "memory.stat").write_text("anon 350000000\nfile 200000000\n")
    monkeypatch.setattr(shards, "_cgroup_dir", lambda: tmp_path)
    if resource.getrlimit(resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY:
        assert shards.data_limit_bytes() == (600000000, f"cgroup {tmp_path} memory.max")
    (tmp_path / "memory.max").write_text("max\n")
    monkeypatch.setattr(shards, "_cgroup_dir", lambda: tmp_path)
    if resource.getrlimit(resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY:
        assert shards.data_limit_bytes() is None


def test_the_base_bytes_at_a_precision(toy_model_dir: Path) -> None:
    spans = tensor_spans(toy_model_dir / "model.safetensors", "w", "").values()
    f32 = shards.base_bytes_at(spans, torch.float32)
    assert f32 == sum(s.length for s in spans)  # the toy is stored in f32
    assert shards.base_bytes_at(spans, torch.bfloat16) * 2 == f32


def test_the_allocator_setting_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sharding.MMAP_ENV, raising=False)
    assert sharding.bound_allocator() == {"malloc_mmap_threshold": 1 << 20}
    monkeypatch.setenv(sharding.MMAP_ENV, "4194304")
    assert sharding.bound_allocator() == {"malloc_mmap_threshold": 4194304}


def test_from_root_without_a_process_group_computes() -> None:
    assert distributed.from_root(lambda: "digest", "hashing") == "digest"


WEIGHTS = "model.safetensors"


def overlapping(toy: Path, out: Path) -> Path:
    """The toy's weights with layer 1's q_proj spans set onto layer 0's (same shape)."""
    raw = (toy / WEIGHTS).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    q0, q1 = (f"model.layers.{i}.self_attn.q_proj.weight" for i in (0, 1))
    header[q1]["data_offsets"] = header[q0]["data_offsets"]
    text = json.dumps(header).encode()
    out.mkdir()
    for path in toy.iterdir():
        if path.name != WEIGHTS:
            shutil.copy(path, out / path.name)
    (out / WEIGHTS).write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    return out


def test_spans_set_onto_another_tensors_are_refused_in_one_line(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    model = overlapping(toy_model_dir, tmp_path / "model")
    with pytest.raises(ModelError) as err:
        tensor_spans(model / WEIGHTS, "model weights", shards.HINT, ModelError)
    line = err.value.one_line()
    assert "\n" not in line
    assert "is not a readable safetensors file" in line
    assert "tensor byte spans leave a gap or overlap" in line
    with pytest.raises(ModelError):  # the one-process reader (the library) refuses it too
        check_header(model / WEIGHTS, "model weights", "h", ModelError)
    with pytest.raises(ModelError, match="gap or overlap"):  # as the memory check reads them
        shards.check_fits(model, torch.float32, 2)
