"""Sharded loading's parts on one process: the rows a process owns are `torch.chunk`'s (what
FSDP2 keeps), the header-only span reader reads each tensor's exact bytes and refuses a damaged
header, or spans set onto another tensor's (as the library refuses them), in one line, the
up-front memory check refuses in one line naming both sizes (a cgroup's limit less what the
group holds beside its page cache) and, in a run, from the headers alone before a byte of the
base is hashed or read (a toy base, and one whose header claims 60 GB), the allocator setting is
what the sidecar records, and `from_root` without a process group is the computation itself."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from twinrun.core.errors import DataError, ModelError
from twinrun.core.safetensors_io import check_header, read_span, tensor_spans
from twinrun.model import shards
from twinrun.train.parallel import distributed, sharding


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


# ------------------------------------------------------------- the memory refusal comes first


class Counted:
    """Bytes read through `core.digest.open_hashed` (every file hash) and `read_span`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, under: Path) -> None:
        import twinrun.core.digest as digest

        self.hashed = 0
        self.spans = 0
        opened = digest.open_hashed
        counter = self

        class Reader:
            def __init__(self, fh: Any, mine: bool) -> None:
                self.fh, self.mine = fh, mine

            def __enter__(self) -> Reader:
                return self

            def __exit__(self, *exc: object) -> None:
                self.fh.close()

            def fileno(self) -> int:
                return int(self.fh.fileno())

            def read(self, size: int = -1) -> bytes:
                chunk = self.fh.read(size)
                counter.hashed += len(chunk) if self.mine else 0
                return bytes(chunk)

        def counted_open(path: Any) -> Any:
            return Reader(opened(path), Path(path).is_relative_to(under))

        def counted_span(*_args: Any) -> None:
            self.spans += 1
            raise AssertionError("read_span before the memory refusal")

        monkeypatch.setattr(digest, "open_hashed", counted_open)
        monkeypatch.setattr(shards, "read_span", counted_span)


def sixty_gb_base(toy: Path, out: Path) -> int:
    """The toy checkpoint whose weights file is a sparse file with a header claiming one 60 GB
    tensor; returns the header's bytes (length prefix included)."""
    shutil.copytree(toy, out)
    count = 15 * 10**9  # f32: 60 GB
    header = json.dumps(
        {
            "model.embed_tokens.weight": {
                "dtype": "F32",
                "shape": [count // 64, 64],
                "data_offsets": [0, count * 4],
            }
        }  # fmt: skip
    ).encode()
    prefix = struct.pack("<Q", len(header)) + header
    with open(out / WEIGHTS, "wb") as fh:
        fh.write(prefix)
        fh.truncate(len(prefix) + count * 4)  # sparse: nothing written, nothing to read
    return len(prefix)


@pytest.mark.parametrize("base", ["toy", "60 GB"])
def test_the_memory_refusal_comes_before_a_byte_of_the_base_is_read(
    toy_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    base: str,
) -> None:
    from testkit.toy_runs import run_args, write_examples
    from twinrun.cli.main import run_cli

    model = tmp_path / "model"
    if base == "toy":
        shutil.copytree(toy_model_dir, model)
        limit, needs = 10_000, "the base needs 0.00 GB; this process may use 0.00 GB"
    else:
        sixty_gb_base(toy_model_dir, model)
        limit, needs = 2 * 10**9, "the base needs 60.00 GB; this process may use 2.00 GB"
    monkeypatch.setattr(shards, "data_limit_bytes", lambda: (limit, "RLIMIT_DATA"))
    counted = Counted(monkeypatch, model)
    examples = write_examples(tmp_path / "data")["sft"]
    out = tmp_path / "out"
    assert run_cli(run_args("sft", model, examples, out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"twinrun: error: {needs} (RLIMIT_DATA)"), err
    assert counted.hashed == 0  # the model's SHA256 comes after the refusal
    assert counted.spans == 0
    assert not (out / "twinrun.json").exists() and not (out / "twinrun.files.jsonl").exists()
