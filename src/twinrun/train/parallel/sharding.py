"""`--shard-base`: the frozen base sharded across torchrun's processes with FSDP2, in lockstep.

FSDP2 (`torch.distributed.fsdp.fully_shard`) keeps 1/W of every base weight on each process and
all-gathers a unit's weights inside each forward (and again for its backward), so every process
must run the same forwards in the same order. The units: each decoder layer, then the root module
(embeddings, final norm and output head: tied weights stay in one unit). The LoRA factors (and a
reward head, which is not part of the model) are FSDP's `ignored_params`: plain replicated
tensors that FSDP neither shards nor reduces; their gradients go through the ordered gather, as
in an unsharded data-parallel run.

Lockstep, in two forms:
- a step's forwards: every process runs ceil(forwards / W) of them (`forward_slots`); a process
  with fewer real forwards runs padding forwards (one of its real forwards again, or forward 0),
  whose gradients the loop drops before the ordered sum — the bytes do not move;
- sampling (GRPO's rollouts, tool episodes): how many forwards a process runs depends on the
  lengths of its completions, so inside `paced(model)` each forward is announced first (an
  all-reduce of 1), and a process that has finished answers each announcement with a one-token
  forward of its own (`drain`), until no process announces one.

Loading: under `--shard-base` the base is built on the meta device (`model.build`, nothing of
the weights read), LoRA applied to it, then `shard_base` shards it and `materialise` gives each
process memory for its own shards only and reads its rows of every weight from the safetensors
files (`model/shards.py`): no process ever holds the whole base. The model's SHA256 is
computed once, by rank 0 over every byte of the files (the 1-process digest), with the SHA256
of each process's rows of each tensor from the same pass, and broadcast (`distributed.from_root`);
every process hashes the rows it reads as it reads them and all stop, in one line, when one
read other bytes (`model/shard_digests.py`). `bound_allocator` fixes glibc's mmap
threshold before the base is built, so the all-gather buffers FSDP frees go back to the system
(recorded in the sidecar's runtime).

Evaluation inside training runs every evaluation batch on every process, so it is in lockstep
as it is. Gathering frozen weights copies them exactly: a sharded forward computes what an
unsharded one does, bit for bit, and the run writes the bytes of a one-process run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from twinrun.train.parallel import distributed

if TYPE_CHECKING:
    from twinrun.model.build import CausalLM
    from twinrun.model.shard_digests import BaseDigests
    from twinrun.train.step.loop import Params


MMAP_THRESHOLD = 1 << 20  # bytes: glibc serves every allocation this large by its own mmap
MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def bound_allocator() -> dict[str, int]:
    """Return freed all-gather buffers to the system at once: glibc's mmap threshold fixed at
    1 MiB (`mallopt`, before the base is built). By default glibc raises the threshold to the
    size of each large buffer freed, so the unit-sized buffers FSDP gathers into every forward
    and backward come from the heap afterwards and the freed ones stay in it: a sharded
    process's peak RSS rose above an unsharded one's. A threshold already set in the
    environment (`MALLOC_MMAP_THRESHOLD_`) is left as it is. Returns what the sidecar's runtime
    records: the threshold in force (nothing where the C library is not glibc)."""
    import ctypes
    import os

    given = os.environ.get(MMAP_ENV, "")
    if given.isdigit():
        return {"malloc_mmap_threshold": int(given)}
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD))
    except (OSError, AttributeError):  # not glibc: its allocator has no such threshold
        return {}
    return {"malloc_mmap_threshold": MMAP_THRESHOLD} if done == 1 else {}


def forward_slots(n: int, model: CausalLM) -> list[tuple[int, bool]]:
    """The forwards (of a step's n) this process runs, as (global index, padding): forward i on
    rank i % world; with a sharded base each process is padded to ceil(n / world) forwards
    (a padding forward repeats one of the process's forwards, or forward 0)."""
    real = [(i, False) for i in distributed.mine(n)]
    if not model.sharded or n == 0:
        return real
    most = -(-n // distributed.world().size)
    again = real[-1][0] if real else 0
    return real + [(again, True)] * (most - len(real))


def shard_base(
    model: CausalLM, params: Params, device: str, expected: BaseDigests | None = None
) -> dict[str, int]:
    """Shard `model`'s frozen base over every process with FSDP2, the LoRA factors replicated
    (`model.sharded`: its forwards run in lockstep from now on); a base on the meta device is
    then read, each process's bytes checked against rank 0's pass (`expected`). Returns what
    the sidecar records: the processes and this process's bytes of base weights before and
    after."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from twinrun.core.exact_matmul import keep_frozen

    me = distributed.world()
    whole = base_bytes(model)
    keep_frozen(False)  # a gathered unit lives for one forward: its digit planes are not kept
    with distributed.collective("sharding the base"):
        mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (me.size,))
        ignored = {p for _, p in params}
        for layer in model.decoder_layers():
            fully_shard(layer, mesh=mesh, ignored_params=ignored)
        fully_shard(model.hf, mesh=mesh, ignored_params=ignored)
    if model.on_meta is not None:
        materialise(model, params, me.rank, me.size, torch.device(device), expected)
    model.sharded = True
    return {"shard_base_processes": me.size, "base_bytes": whole,
            "base_bytes_here": base_bytes(model)}  # fmt: skip


def materialise(
    model: CausalLM,
    params: Params,
    rank: int,
    size: int,
    device: torch.device,
    expected: BaseDigests | None = None,
) -> None:
    """Give a base built on the meta device its memory — only this process's shards, FSDP's
    padded chunks — and read its rows of every weight from the checkpoint (`model/shards.py`),
    each byte hashed as read and checked against rank 0's pass (`expected`,
    `model/shard_digests.py`): a process that read other bytes stops every process in one
    line; the LoRA factors (real already) move to `device`."""
    from twinrun.model.shard_digests import ReadCheck
    from twinrun.model.shards import fill_shards

    root = model.on_meta
    assert root is not None

    def give_memory(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device=device) if t.is_meta else t

    model.hf._apply(give_memory)  # FSDP's `_apply` re-pads its shards after (`reset_sharded_param`)
    check = ReadCheck(expected, root) if expected is not None else None
    fill_shards(model.hf, root, rank, size, check)
    distributed.first_problem(
        "checking what every process read of the base",
        check.problem if check is not None else None,
        "give every process the same --model, with the same bytes at that path on every node",
    )
    for _, p in params:
        if p.device != device:
            p.data = p.data.to(device)
    model.on_meta = None


def base_bytes(model: CausalLM) -> int:
    """The bytes of frozen base weights this process holds (its shards, when sharded)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for p in model.parameters():
        if p.requires_grad:
            continue
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


@contextmanager
def paced(model: CausalLM) -> Iterator[None]:
    """Sampling whose forwards differ in number between processes (see the module docstring):
    every forward inside is announced, and on leaving this process answers the others'
    forwards until none is left. Nothing without a sharded base."""
    if not model.sharded:
        yield
        return
    device = model.device  # nccl reduces CUDA tensors

    def announce() -> None:
        _any_forward(1, device)

    model.pace = announce
    try:
        yield
    finally:
        model.pace = None
    drain(model)  # not reached when the block raised: that process stops, torchrun ends all


def _any_forward(mine: int, device: torch.device) -> bool:
    """All-reduce (max) this process's flag: True when some process runs a forward now."""
    dist: Any = distributed._dist()
    flag = torch.tensor([mine], dtype=torch.int64, device=device)
    with distributed.collective("waiting for the other processes' forwards"):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def drain(model: CausalLM) -> None:
    """Run one-token forwards while any other process still announces forwards."""
    device = model.device
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    mask = torch.ones((1, 1), dtype=torch.long, device=device)
    while _any_forward(0, device):
        with torch.no_grad():
            model.run_batch(ids, mask, None, None, None)
