"""Strict determinism mode (docs/determinism.md): establish, verify, and record as provenance.

`establish(strict, threads, device, attention, cpu_kernels)` runs before any model or CUDA state
exists. In both modes it first pins the CPU kernels (`twinrun.core.portable`: the same bytes on
every x86-64 CPU, read back and recorded under `cpu_kernels`). In strict mode it sets

- `torch.use_deterministic_algorithms(True)` (errors, not warnings, on nondeterministic ops),
- `torch.backends.cudnn.deterministic = True` and `torch.backends.cudnn.benchmark = False`,
- `CUBLAS_WORKSPACE_CONFIG` (`:4096:8` when unset; `:4096:8` or `:16:8` are kept; any other
  value is a `ContractError`),

records the attention implementation, applies the torch intra-op thread count (in both modes),
reads every setting back and raises `ContractError` if one did not stick. It fails closed when
CUDA was initialised before `CUBLAS_WORKSPACE_CONFIG` was set: cuBLAS may already have chosen its
workspaces, and nothing done now can undo that.

The returned provenance dict records the settings as they are after the call (in non-strict mode
too), for the run's sidecar. `runtime_versions()` lists library versions through package
metadata, so nothing heavy is imported. torch is imported inside functions only.
"""

from __future__ import annotations

import os
import platform
import re
from importlib import metadata
from typing import TYPE_CHECKING, Any

from twinrun.core.errors import ConfigError, ContractError
from twinrun.core.portable import check_mode, cpu_model, establish_kernels

if TYPE_CHECKING:
    from types import ModuleType

CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_ALLOWED = (":4096:8", ":16:8")
CUBLAS_DEFAULT = ":4096:8"

# "eager": twinrun's own explicit attention (matmul + mask + softmax); "sdpa": torch's
# scaled_dot_product_attention, whose kernel choice torch's deterministic mode governs;
# "blockwise": twinrun's causal attention in memory linear in T (`twinrun.model.blockwise`).
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "blockwise")

RUNTIME_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "safetensors",
    "numpy",
    "tokenizers",
    "twinrun",
)

_DEVICE_RE = re.compile(r"cuda:(\d+)")


def parse_device(device: str) -> int | None:
    """The CUDA index of `device` ("cuda:N"; "cuda" is cuda:0, as torch's default device), None
    for "cpu"; anything else is a ConfigError."""
    if device == "cpu":
        return None
    if device == "cuda":
        return 0
    m = _DEVICE_RE.fullmatch(device) if isinstance(device, str) else None
    if m is None:
        raise ConfigError(
            "--device must be cpu, cuda or cuda:N", "use --device cpu, cuda or cuda:0"
        )
    return int(m.group(1))


# The most torch threads a run may ask for: this machine's cores, or THREADS_FLOOR where that is
# more -- a native run recorded on a bigger machine must still replay with its own count (the
# count shapes its bytes), while 100000 threads would exhaust the machine before a step.
THREADS_FLOOR = 256


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_cap() -> int:
    """The largest thread count accepted: max(THREADS_FLOOR, this machine's cores)."""
    return max(THREADS_FLOOR, machine_cores())


def threads_problem(threads: int, name: str = "--threads") -> str | None:
    """An integer thread count's problem past the type check: more than `threads_cap()`."""
    cap, cores = threads_cap(), machine_cores()
    if threads <= cap:
        return None
    shown = str(threads) if threads.bit_length() <= 80 else "an integer too large to show"
    return (
        f"{name} {shown} is more than this machine's {cores} cores and the cap of {cap} "
        f"(twinrun accepts at most max({THREADS_FLOOR}, cores))"
    )


def _check_threads(threads: int | None) -> None:
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(
            f"--threads must be an integer >= 1, got {threads!r}",
            "use --threads N with N >= 1, or leave it out to keep torch's default",
        )
    if (problem := threads_problem(threads)) is not None:
        raise ConfigError(problem, THREADS_HINT)


THREADS_HINT = "use --threads N with N at most the machine's cores, or leave it out"


def _check_attention(attention: str) -> None:
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ConfigError(
            f"unknown attention implementation {attention!r}",
            f"use one of: {', '.join(ATTENTION_IMPLEMENTATIONS)}",
        )


def check_cuda_device(device: str) -> None:
    """ConfigError in one line unless `device` ("cuda:N") is a CUDA device this process sees:
    asked before anything uses CUDA (a process group's backend included)."""
    import torch

    index = parse_device(device)
    if index is not None:
        _check_cuda_device(torch, device, index)


def _check_cuda_device(torch: ModuleType, device: str, index: int) -> None:
    if not torch.cuda.is_available():
        raise ConfigError(
            f"--device {device} asked for but no CUDA device is available", "use --device cpu"
        )
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(
            f"--device {device} asked for but only {count} CUDA device(s) are visible",
            f"use --device cuda:0 .. cuda:{count - 1}, or --device cpu",
        )


def _device_name(torch: ModuleType, index: int | None) -> str:
    if index is not None:
        return str(torch.cuda.get_device_name(index))
    return cpu_model()


def verify_strict() -> None:
    """Raise ContractError unless every strict setting holds right now (read back from torch
    and the environment). Cheap; callable again later, e.g. after the model is built."""
    import torch

    problems: list[str] = []
    if not torch.are_deterministic_algorithms_enabled():
        problems.append("torch deterministic algorithms are off")
    elif torch.is_deterministic_algorithms_warn_only_enabled():
        problems.append("torch deterministic algorithms are in warn-only mode")
    if torch.backends.cudnn.deterministic is not True:
        problems.append("cudnn.deterministic is not True")
    if torch.backends.cudnn.benchmark is not False:
        problems.append("cudnn.benchmark is not False")
    value = os.environ.get(CUBLAS_ENV)
    if value not in CUBLAS_ALLOWED:
        problems.append(f"{CUBLAS_ENV}={value!r}")
    if problems:
        raise ContractError(
            "strict determinism did not hold: " + "; ".join(problems),
            "something reset a strict setting after twinrun set it; run with --no-strict to "
            "proceed without the guarantee",
        )


def establish(
    strict: bool,
    threads: int | None,
    device: str = "cpu",
    attention: str = "eager",
    cpu_kernels: str = "native",
) -> dict[str, Any]:
    """Establish (strict) or only record (non-strict) the determinism settings; return the
    provenance dict. All inputs are validated before anything global is changed. The CPU
    kernels are pinned first (`twinrun.core.portable`), in both modes: they must be in place
    before torch runs a kernel."""
    index = parse_device(device)
    _check_threads(threads)
    _check_attention(attention)
    check_mode(cpu_kernels)
    kernels = establish_kernels(cpu_kernels, device)

    import torch

    if index is not None:
        _check_cuda_device(torch, device, index)

    if strict:
        _apply_strict(torch, index)

    if threads is not None:
        _apply_threads(torch, threads)

    if strict:
        verify_strict()

    return _provenance(torch, strict, device, attention, index, kernels)


def _apply_strict(torch: ModuleType, index: int | None) -> None:
    """Set the strict settings: `CUBLAS_WORKSPACE_CONFIG` (checked first, and refused when CUDA
    was initialised before it could be set), deterministic algorithms and cudnn's flags."""
    cuda_was_initialised = bool(torch.cuda.is_initialized())
    cublas_before = os.environ.get(CUBLAS_ENV)
    if cublas_before is not None and cublas_before not in CUBLAS_ALLOWED:
        raise ContractError(
            f"{CUBLAS_ENV}={cublas_before!r} is not a deterministic cuBLAS workspace setting",
            f"set {CUBLAS_ENV} to {' or '.join(CUBLAS_ALLOWED)}, or unset it "
            f"(twinrun then sets {CUBLAS_DEFAULT})",
        )
    if index is not None and cuda_was_initialised and cublas_before is None:
        raise ContractError(
            f"CUDA was initialised before strict mode could set {CUBLAS_ENV}",
            f"export {CUBLAS_ENV}={CUBLAS_DEFAULT} before starting, or call "
            "twinrun.core.determinism.establish() before anything touches CUDA",
        )
    if cublas_before is None:
        os.environ[CUBLAS_ENV] = CUBLAS_DEFAULT
    set_deterministic_algorithms()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def _apply_threads(torch: ModuleType, threads: int) -> None:
    """Set torch's intra-op thread count; a ContractError when it reads back different."""
    torch.set_num_threads(threads)
    got = torch.get_num_threads()
    if got != threads:
        raise ContractError(
            f"torch thread count did not stick: asked for {threads}, got {got}",
            "check OMP_NUM_THREADS / MKL settings, or leave --threads out",
        )


def _provenance(
    torch: ModuleType,
    strict: bool,
    device: str,
    attention: str,
    index: int | None,
    kernels: dict[str, Any],
) -> dict[str, Any]:
    """The provenance dict: the settings as read back now (in non-strict mode too)."""
    return {
        "strict": bool(strict),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cublas_workspace_config": os.environ.get(CUBLAS_ENV),
        "attention": attention,
        "threads": int(torch.get_num_threads()),
        "interop_threads": int(torch.get_num_interop_threads()),
        "device": device,
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda or None,
        "device_name": _device_name(torch, index),
        "cpu_kernels": kernels,
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def set_deterministic_algorithms() -> None:
    """`torch.use_deterministic_algorithms(True)` without its import of torch._inductor.

    The public call also sets `torch._inductor.config.deterministic`, and importing that config
    costs about 1.5 s of start-up — most of a toy run. twinrun never compiles, so the flag only
    matters when inductor is loaded: then it is set too.
    """
    import sys

    import torch

    torch._C._set_deterministic_algorithms(True, warn_only=False)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        setattr(inductor, "deterministic", True)  # noqa: B010 (a module attribute torch sets lazily)


def runtime_versions() -> dict[str, str | None]:
    """python, platform and library versions from package metadata (None when not installed);
    imports none of the libraries."""
    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for package in RUNTIME_PACKAGES:
        versions[package] = _version(package)
    return versions
