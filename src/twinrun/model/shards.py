"""A checkpoint read a shard at a time (`--shard-base`), and what a process may hold of it.

Sharded loading, in three parts (train/parallel/sharding.py calls them in this order):

1. `skeleton(dir, precision, attention)`: transformers' model built from config.json on the
   meta device — every parameter and buffer a shape without memory; nothing of the weights read.
   LoRA is applied to it as to a loaded model (its factors are real: `model/lora.py`).
2. FSDP2's `fully_shard` over the meta model, then every meta tensor given (uninitialised) memory
   on the device: FSDP keeps each process's chunk of dim 0 of every base weight
   (`torch.chunk` semantics: chunks of ceil(rows / W) rows, the last ones shorter or empty).
3. `fill_shards(hf, dir, rank, world)`: each process reads, for each weight, exactly the bytes of
   its own rows — a safetensors tensor is row-major, so rows [a, b) of a tensor whose data
   starts at byte s are the bytes [s + a·row, s + b·row) — straight into its shard
   (`core.safetensors_io.read_span`, the one read; a cast to bf16 reads into a buffer first),
   each read hashed as read against rank 0's digests of the same bytes (`model/shard_digests.py`).
   Tied weights (embeddings and output head) are one parameter, filled once from whichever name
   the checkpoint holds. Non-persistent buffers (the rotary frequencies) are computed as
   transformers computes them when it loads (`_init_weights` of their module).

What a process holds of the base while loading is its shards: 1/W of the weights, plus, at the
step, one unit's weights all-gathered at a time (train/parallel/sharding.py).

The up-front check (`check_fits`): the bytes the base needs at the run's precision (from the
safetensors headers, nothing else read), divided by the processes that share it, against what
this process may still allocate — the address-space budget the kernel enforces on its private
writable memory (RLIMIT_DATA, less what it maps already: VmData) and, where the process sits in
a cgroup v2 with a `memory.max`, that limit less its `memory.current` (the page cache left out:
the kernel reclaims it before it fails an allocation). A base that cannot fit is
refused in one line before a byte of it is read, instead of being killed by the kernel mid-load.
"""

from __future__ import annotations

import math
import os
import re
import resource
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from twinrun.core.errors import ModelError
from twinrun.core.safetensors_io import Header, TensorSpan, read_header, read_span

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64}  # fmt: skip
HINT = "re-download or re-save the checkpoint"
GB = 1e9


class ReadCheck(Protocol):
    """What checks each read against rank 0's digests (`model.shard_digests.ReadCheck`)."""

    def header(self, path: Path, prefix: bytes) -> None: ...

    def read(self, path: Path, offset: int, data: memoryview) -> None: ...


def weight_headers(model_dir: str | os.PathLike[str]) -> dict[Path, Header]:
    """The header of each of the checkpoint's safetensors files (read and checked alone)."""
    from twinrun.model.loading import shard_files

    return {
        path: read_header(path, "model weights", HINT, ModelError)
        for path in shard_files(model_dir)
        if path.suffix == ".safetensors"
    }


def weight_spans(
    headers: dict[Path, Header] | str | os.PathLike[str],
) -> dict[str, tuple[Path, TensorSpan]]:
    """Every tensor of the checkpoint's safetensors files (`weight_headers`, or the checkpoint
    directory whose headers to read): its file and span."""
    if not isinstance(headers, dict):
        headers = weight_headers(headers)
    return {name: (path, span) for path, h in headers.items() for name, span in h.spans.items()}


def base_bytes_at(spans: Iterable[TensorSpan], dtype: torch.dtype) -> int:
    """The bytes the checkpoint's floating-point tensors take at `dtype` (the rest as stored)."""
    size = torch.empty((), dtype=dtype).element_size()
    total = 0
    for span in spans:
        count = math.prod(span.shape)
        total += count * size if span.dtype in DTYPES else span.length
    return total


def owned_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """Rows [a, b) of a tensor with `rows` rows that process `rank` of `world` holds:
    FSDP2's chunk of dim 0 (`torch.chunk`: ceil(rows / world) rows a chunk, empty past the end)."""
    per = -(-rows // world) if rows else 0
    start = min(rank * per, rows)
    return start, min(start + per, rows)


def owned_span(span: TensorSpan, rank: int, world: int) -> tuple[int, int]:
    """(offset, length) of the bytes of `span` that hold process `rank`'s rows."""
    if not span.shape:
        return (span.offset, span.length) if rank == 0 else (span.offset, 0)
    a, b = owned_rows(span.shape[0], rank, world)
    row = span.length // span.shape[0] if span.shape[0] else 0
    return span.offset + a * row, (b - a) * row


# ------------------------------------------------------------------------- memory available


def data_limit_bytes() -> tuple[int, str] | None:
    """What this process may still allocate, and which limit says so: RLIMIT_DATA (its private
    writable memory) less VmData, and a cgroup v2 memory.max less memory.current (less the page
    cache); None when neither is set."""
    found: list[tuple[int, str]] = []
    soft, _hard = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY:
        found.append((soft - _status_bytes("VmData"), "RLIMIT_DATA"))
    group = _cgroup_dir()
    if group is not None:
        try:
            cap = (group / "memory.max").read_text().strip()
            used = int((group / "memory.current").read_text().strip())
            stat = dict(ln.split() for ln in (group / "memory.stat").read_text().splitlines())
            used -= int(stat.get("file", 0))  # the page cache: the kernel reclaims it first
        except (OSError, ValueError):
            cap = "max"
        if cap != "max":
            found.append((int(cap) - used, f"cgroup {group} memory.max"))
    return min(found) if found else None


def _status_bytes(field: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _cgroup_dir() -> Path | None:
    """This process's cgroup v2 directory, when it has one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            where = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            return where if (where / "memory.max").is_file() else None
    return None


def check_fits(model_dir: str | os.PathLike[str], precision_dtype: torch.dtype, world: int) -> None:
    """ModelError (one line) when this process's part of the base — all of it on one process,
    1/`world` of it sharded — is more than the process may still allocate. Sharded, the
    headers are read (and checked) even without a limit: a damaged file stops every process
    before any shards."""
    limit = data_limit_bytes()
    if limit is None and world == 1:
        return
    spans = [span for _, span in weight_spans(model_dir).values()]
    if limit is None:
        return
    whole = base_bytes_at(spans, precision_dtype)
    need = -(-whole // world)
    may, which = limit
    if need <= may:
        return
    if world == 1:
        raise ModelError(
            f"the base needs {whole / GB:.2f} GB; this process may use {max(may, 0) / GB:.2f} GB "
            f"({which})",
            "shard it with --shard-base under torchrun (torchrun --nproc-per-node N -m twinrun)",
        )
    raise ModelError(
        f"a 1/{world} shard of the base needs {need / GB:.2f} GB; this process may use "
        f"{max(may, 0) / GB:.2f} GB ({which})",
        "shard it over more processes (a larger --nproc-per-node)",
    )


# ------------------------------------------------------------------------------ the skeleton


def skeleton(model_dir: str | os.PathLike[str], dtype: torch.dtype, attention: str) -> Any:
    """transformers' causal LM for the checkpoint's config.json, every tensor on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    root = str(model_dir)
    config = AutoConfig.from_pretrained(root, local_files_only=True)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    hf.config.name_or_path = root
    if hf.can_generate() and (Path(root) / "generation_config.json").is_file():
        hf.generation_config = GenerationConfig.from_pretrained(root, local_files_only=True)
    return hf


def _non_persistent_buffers(hf: Any) -> list[tuple[str, Any]]:
    out = []
    for name, module in hf.named_modules():
        for buf in module._non_persistent_buffers_set:
            if module._buffers.get(buf) is not None:
                out.append((f"{name}.{buf}" if name else buf, module))
    return out


def fill_shards(
    hf: Any,
    model_dir: str | os.PathLike[str],
    rank: int,
    world: int,
    check: ReadCheck | None = None,
) -> None:
    """Fill every base weight's local shard (its rows, see the module docstring) from the
    checkpoint, persistent buffers whole, and compute the non-persistent buffers; ModelError
    when a weight is missing, has another shape, or the checkpoint holds tensors the model has
    no place for. `check` is given each header parsed and every byte read, as read
    (`model.shard_digests`)."""
    from torch.distributed.tensor import DTensor

    headers = weight_headers(model_dir)
    if check is not None:
        for path, header in headers.items():
            check.header(path, header.prefix)
    spans = weight_spans(headers)
    root = Path(model_dir)
    used: set[str] = set()
    aliases: dict[int, list[str]] = {}
    tensors: dict[int, Any] = {}
    for name, p in hf.named_parameters(remove_duplicate=False):
        if p.requires_grad:  # the LoRA factors: real, not the checkpoint's
            continue
        aliases.setdefault(id(p), []).append(checkpoint_name(name))
        tensors[id(p)] = p
    for key, p in tensors.items():
        names = [n for n in aliases[key] if n in spans]
        if not names:
            raise ModelError(
                f"{root}: the weights do not match config.json (missing {aliases[key][0]})",
                "check that the checkpoint is complete and config.json is its own",
            )
        name = names[0]
        used.update(n for n in aliases[key] if n in spans)
        local = p.to_local() if isinstance(p, DTensor) else p
        sharded = isinstance(p, DTensor)
        _fill(local, tuple(p.shape), name, spans[name], rank, world, sharded=sharded, check=check)
    for module_name, module in hf.named_modules():
        for buf_name, buf in module._buffers.items():
            name = checkpoint_name(f"{module_name}.{buf_name}" if module_name else buf_name)
            if buf is None or buf_name in module._non_persistent_buffers_set:
                continue
            if name not in spans:
                raise ModelError(
                    f"{root}: the weights do not match config.json (missing {name})",
                    "check that the checkpoint is complete and config.json is its own",
                )
            used.add(name)
            _fill(buf, tuple(buf.shape), name, spans[name], 0, 1, sharded=False, check=check)
    out, into = hf.get_output_embeddings(), hf.get_input_embeddings()
    if getattr(hf.config, "tie_word_embeddings", False) and out is not None:
        if out.weight is not into.weight:  # one parameter, sharded and filled once
            raise ModelError(f"{root}: the tied output head lost its tie when sharded", "a bug")
    patterns = getattr(hf, "_keys_to_ignore_on_load_unexpected", None) or []
    ignore = [re.compile(p) for p in patterns]
    extra = sorted(n for n in spans if n not in used and not any(r.search(n) for r in ignore))
    if extra:
        raise ModelError(
            f"{root}: the weights do not match config.json (unexpected {extra[:2]})",
            "check that config.json is the checkpoint's own, or load it without --shard-base",
        )
    with torch.no_grad():
        for _, module in _non_persistent_buffers(hf):
            if getattr(module, "_is_hf_initialized", False):
                module._is_hf_initialized = False
            hf._init_weights(module)


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A writable view of a contiguous CPU uint8 tensor's memory."""
    buffer: Any = t.numpy()
    return memoryview(buffer)


def checkpoint_name(name: str) -> str:
    """A base weight's name in the checkpoint: without the `base_layer` a LoRA layer wraps."""
    return name.replace(".base_layer.", ".")


def _fill(
    local: torch.Tensor,
    shape: tuple[int, ...],
    name: str,
    where: tuple[Path, TensorSpan],
    rank: int,
    world: int,
    *,
    sharded: bool,
    check: ReadCheck | None,
) -> None:
    path, span = where
    if span.shape != shape:
        raise ModelError(
            f"{path}: {name} has shape {list(span.shape)}, the model's is {list(shape)}",
            "check that config.json is the checkpoint's own",
        )
    if span.dtype not in DTYPES:
        raise ModelError(f"{path}: {name} is {span.dtype}, not floating point", HINT)
    offset, length = owned_span(span, rank, world) if sharded else (span.offset, span.length)
    a, b = owned_rows(shape[0], rank, world) if sharded and shape else (0, shape[0] if shape else 1)
    if sharded and shape and local.shape[0] != b - a:
        raise ModelError(
            f"{name}: this process holds {local.shape[0]} rows, its chunk is rows {a}..{b}",
            "a bug: report it",
        )
    if length == 0:
        return
    src_dtype = DTYPES[span.dtype]
    direct = local.dtype == src_dtype and local.device.type == "cpu" and local.is_contiguous()
    with torch.no_grad():
        if direct:
            into = _bytes_of(local.detach().view(-1).view(torch.uint8))
            read_span(path, offset, into)
        else:
            raw = torch.empty(length, dtype=torch.uint8)
            into = _bytes_of(raw)
            read_span(path, offset, into)
            local.copy_(raw.view(src_dtype).view(local.shape))
        if check is not None:  # the bytes as read (before a cast)
            check.read(path, offset, into)
