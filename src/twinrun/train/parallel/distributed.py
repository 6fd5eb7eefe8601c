"""Data-parallel runs under torchrun: the process group, who computes what, and ordered gathers.

`torchrun --nproc-per-node N -m twinrun tune ...` starts N processes; each calls `setup` when its
session opens, which joins torch.distributed's process group from torchrun's environment
(`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`/`MASTER_PORT`, or torchrun's rendezvous for
several nodes): gloo on CPU, nccl on CUDA with one device per process (`cuda:LOCAL_RANK`).
Without torchrun nothing here does anything: the world is one process, `mine(n)` is every
index, and `in_global_order` returns its argument.

What makes the bytes independent of the process count:
- a step's forwards are fixed by the data order; forward i runs on rank i % world (`mine`);
- per-forward results (gradients, loss sums, counts) are all-gathered with their global index
  and put back in global forward order (`in_global_order`), then combined exactly as one
  process combines them: from zero, forward 0 first.

Agreement: before any process trains, `agree` gathers every process's resolved settings and
input SHA256s and compares them with rank 0's; a process started with another seed, learning
rate, examples file or model stops every process with one line naming the rank and the setting
(one torchrun command per node makes such a mix a real mistake).

A sharded base (`--shard-base`) is hashed once: rank 0 computes the model's SHA256 over every
byte of its files, as one process does, and the SHA256 of each process's rows in the same pass,
and broadcasts them (`from_root`); each process agrees on the files beside the weights and the
weights' headers (its `model sha256` here), then hashes the rows it reads as it reads them, and
`first_problem` stops every process when one read other bytes (model/shard_digests.py).

Faults: every collective runs under the process group's timeout (`TWINRUN_DIST_TIMEOUT_S`,
default 300 s); a peer that died or stopped answering turns into a `DistributedError` (one
line), and torchrun ends the other processes as soon as one exits non-zero.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from twinrun.core.errors import ConfigError, TwinrunError, memory_failure

T = TypeVar("T")

TIMEOUT_ENV = "TWINRUN_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class DistributedError(TwinrunError, RuntimeError):
    """A collective failed: a peer process died, raised, or did not answer within the timeout."""


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank, number of processes, rank within its node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_root(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """True when torchrun started this process (it sets RANK, WORLD_SIZE and LOCAL_RANK)."""
    return all(name in os.environ for name in LAUNCH_ENV)


def several_processes() -> bool:
    """True when torchrun started this process as one of more than one (WORLD_SIZE other than
    1): read from the environment, before any process group is joined."""
    return launched() and os.environ.get("WORLD_SIZE") != "1"


def timeout_s() -> float:
    """The bound on every collective (seconds): TWINRUN_DIST_TIMEOUT_S, default 300."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(
            f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds",
            f"set {TIMEOUT_ENV} to e.g. 300, or unset it",
        )
    return value


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def active() -> bool:
    """True when this process is in an initialised process group."""
    import sys

    if "torch.distributed" not in sys.modules:
        return False
    dist = _dist()
    return bool(dist.is_available() and dist.is_initialized())


def world() -> World:
    """This process's World (one process of one when no process group is initialised)."""
    if not active():
        return World()
    dist = _dist()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def is_root() -> bool:
    """True on the process that writes run files (rank 0, or the only process)."""
    return world().is_root


def runtime_record() -> dict[str, int]:
    """What the sidecar's runtime records of the process group: nothing without one."""
    return {"processes": world().size} if active() else {}


def process_device(device: str) -> str:
    """The device of this process: under torchrun any CUDA device becomes `cuda:LOCAL_RANK`
    (one device per process); on one process `cuda` is `cuda:0`; `cpu` stays `cpu`."""
    if not device.startswith("cuda"):
        return device
    if not launched():
        return "cuda:0" if device == "cuda" else device
    return f"cuda:{int(os.environ['LOCAL_RANK'])}"


def setup(device: str) -> str:
    """Join the process group when torchrun started this process (gloo on CPU, nccl on CUDA);
    returns this process's device. Without torchrun: nothing joined, and `device` as
    `process_device` gives it (`cuda` is `cuda:0`)."""
    device = process_device(device)
    if not launched():
        return device
    if active():
        return device
    dist = _dist()
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        import torch

        from twinrun.core.determinism import check_cuda_device

        check_cuda_device(device)  # one line where there is no CUDA, before any process group
        torch.cuda.set_device(device)
    # torch.distributed.nn.functional takes the process group it finds at import as its
    # functions' default group, and transformers imports it (through FSDP) while it loads a
    # model. Imported after the group exists, those defaults would keep the group alive past
    # `teardown`, and gloo's threads with it into the interpreter's shutdown, where a thread
    # still releasing a collective's work aborts the process ("terminate called without an
    # active exception") after a run that succeeded. Imported first, the defaults are None.
    import torch.distributed.nn.functional  # noqa: F401

    timeout = timedelta(seconds=timeout_s())
    try:
        dist.init_process_group(backend=backend, timeout=timeout)
    except Exception as exc:  # rendezvous failed: wrong address/port, a peer never came
        raise DistributedError(
            f"could not join the process group ({backend}): {exc}".splitlines()[0],
            "start every process with the same torchrun command (check --master-addr/port)",
        ) from exc
    return device


def teardown() -> None:
    """Leave the process group (at the end of a successful command): every process waits for the
    others first, so none closes its connections while a peer is still finishing a collective
    (a process with no work of its own, e.g. no prompt group to sample, gets here first). Nothing
    else holds the group (see `setup`), so destroying it joins gloo's threads here, before the
    interpreter shuts down."""
    if active():
        barrier("waiting for every process to finish")
        _release_device_meshes()
        _dist().destroy_process_group()


def _release_device_meshes() -> None:
    """A sharded run's device mesh outlives its model: DTensor's sharding-propagation caches
    (Python's and the C++ fast path's) keep the specs of the run's sharded weights, each
    holding the mesh and through it the process group, so `destroy_process_group` would leave
    gloo's threads running into the interpreter's shutdown (an abort after a run that
    succeeded). Emptied, and the specs' cycles collected, nothing holds the group. Nothing to
    do where DTensor was never imported."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    gc.collect()


@contextmanager
def collective(what: str) -> Iterator[None]:
    """Run a collective; a failure (a peer died, raised or timed out) becomes one clear line.
    This process running out of memory is its own failure, said as such (the CLI's memory
    line), not blamed on another process."""
    try:
        yield
    except TwinrunError:
        raise
    except Exception as exc:
        if memory_failure(exc) is not None:
            raise
        me = world()
        raise DistributedError(
            f"rank {me.rank} of {me.size}: {what} failed: another process stopped or did not "
            f"answer within {timeout_s():g} s ({type(exc).__name__})",
            "the first error another rank printed says why",
        ) from exc


def barrier(what: str) -> None:
    """Wait until every process got here (nothing without a process group)."""
    if active():
        with collective(what):
            _dist().barrier()


def agree(what: str, record: Mapping[str, Any]) -> None:
    """All-gather every process's `record` (settings and input digests, printable values) and
    compare each with rank 0's: every process raises the same ConfigError, naming the first rank
    that differs and its settings, so none trains a mixed run. Nothing without a process group;
    the gather is also a barrier."""
    if not active():
        return
    size = world().size
    gathered: list[Any] = [None] * size
    with collective(what):
        _dist().all_gather_object(gathered, dict(record))
    problem = disagreement(gathered)
    if problem is not None:
        raise ConfigError(problem, "start every process with the same command and the same inputs")


def _short(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= 24 else text[:21] + "..."


def disagreement(records: Sequence[Mapping[str, Any]]) -> str | None:
    """What the first process whose record differs from rank 0's differs in, or None."""
    first = records[0]
    absent = "(not set)"
    for rank, other in enumerate(records[1:], start=1):
        keys = [k for k in first if other.get(k, absent) != first[k]]
        keys += [k for k in other if k not in first]
        if keys:
            shown = ", ".join(
                f"{k} (rank {rank}: {_short(other.get(k, absent))}, "
                f"rank 0: {_short(first.get(k, absent))})"
                for k in keys[:3]
            )
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            return (
                f"rank {rank} of {len(records)} was started with other settings or inputs than "
                f"rank 0: {shown}{more}"
            )
    return None


def first_problem(what: str, problem: str | None, hint: str) -> None:
    """All-gather each process's `problem` (None: it has none) and raise, on every process, the
    same ConfigError naming the first rank that has one: none goes on alone (nothing written by
    rank 0 while another stops). Without a process group: raise this process's own."""
    if not active():
        if problem is not None:
            raise ConfigError(f"this process {problem}", hint)
        return
    me = world()
    gathered: list[Any] = [None] * me.size
    with collective(what):
        _dist().all_gather_object(gathered, problem)
    for rank, found in enumerate(gathered):
        if found is not None:
            raise ConfigError(f"rank {rank} of {me.size} {found}", hint)


def from_root(compute: Callable[[], T], what: str) -> T:
    """`compute()` on rank 0 only, its (picklable) result broadcast to every process; without a
    process group, `compute()`. A failure on rank 0 raises there, and the others stop at the
    broadcast with a DistributedError."""
    if not active():
        return compute()
    box: list[Any] = [compute() if is_root() else None]
    with collective(what):
        _dist().broadcast_object_list(box, src=0)
    return box[0]


def mine(n: int) -> range:
    """The global indices (of n forwards, or n prompt groups) this process computes: i % world."""
    me = world()
    return range(me.rank, n, me.size)


def interleave(per_rank: Sequence[Sequence[T]]) -> list[T]:
    """Per-rank lists of round-robin items (rank r holds items r, r+W, r+2W, ...) in global
    order: item i is `per_rank[i % W][i // W]`."""
    size = len(per_rank)
    n = sum(len(items) for items in per_rank)
    return [per_rank[i % size][i // size] for i in range(n)]


def in_global_order(local: Sequence[T], what: str = "gathering per-forward values") -> list[T]:
    """All-gather every process's round-robin items (`local`: this rank's, in `mine` order) and
    return all of them in global order, on every process. Picklable items (floats, tensors)."""
    if not active():
        return list(local)
    size = world().size
    gathered: list[Any] = [None] * size
    with collective(what):
        _dist().all_gather_object(gathered, list(local))
    return interleave(gathered)
