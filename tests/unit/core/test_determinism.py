"""Tests for twinrun.core.determinism: strict mode settings stick and are recorded, threads apply,
bad CUBLAS_WORKSPACE_CONFIG / device / threads fail clearly, runtime versions are recorded.

torch's deterministic flag, cuDNN flags, thread count and the environment are process-global:
the `restore_torch_state` fixture puts every one back after each test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from twinrun.core import determinism
from twinrun.core.determinism import (
    CUBLAS_ENV,
    establish,
    parse_device,
    runtime_versions,
    verify_strict,
)
from twinrun.core.errors import ConfigError, ContractError

PROVENANCE_KEYS = {
    "strict",
    "deterministic_algorithms",
    "cudnn_deterministic",
    "cudnn_benchmark",
    "cublas_workspace_config",
    "attention",
    "threads",
    "interop_threads",
    "device",
    "torch",
    "cuda",
    "device_name",
    "cpu_kernels",
}


@pytest.fixture(autouse=True)
def restore_torch_state() -> Iterator[None]:
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn_det = torch.backends.cudnn.deterministic
    cudnn_bench = torch.backends.cudnn.benchmark
    threads = torch.get_num_threads()
    cublas = os.environ.get(CUBLAS_ENV)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
        torch.backends.cudnn.deterministic = cudnn_det
        torch.backends.cudnn.benchmark = cudnn_bench
        torch.set_num_threads(threads)
        if cublas is None:
            os.environ.pop(CUBLAS_ENV, None)
        else:
            os.environ[CUBLAS_ENV] = cublas


@pytest.fixture
def no_cublas_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CUBLAS_ENV, raising=False)


def _non_strict_state() -> None:
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True


# -- strict mode -------------------------------------------------------------------------------


def test_strict_sets_and_records_everything(no_cublas_env: None) -> None:
    _non_strict_state()
    prov = establish(strict=True, threads=None)
    assert set(prov) == PROVENANCE_KEYS
    assert prov["strict"] is True
    assert prov["deterministic_algorithms"] is True
    assert prov["cudnn_deterministic"] is True
    assert prov["cudnn_benchmark"] is False
    assert prov["cublas_workspace_config"] == ":4096:8"
    assert prov["attention"] == "eager"
    assert prov["device"] == "cpu"
    assert prov["torch"] == torch.__version__
    assert prov["cuda"] == (torch.version.cuda or None)
    assert isinstance(prov["device_name"], str) and prov["device_name"]
    assert prov["threads"] == torch.get_num_threads()
    assert prov["interop_threads"] == torch.get_num_interop_threads()
    # the settings stuck (read back independently)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic is True
    assert torch.backends.cudnn.benchmark is False
    assert os.environ[CUBLAS_ENV] == ":4096:8"
    verify_strict()


@pytest.mark.parametrize("value", [":4096:8", ":16:8"])
def test_strict_keeps_allowed_cublas_config(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(CUBLAS_ENV, value)
    prov = establish(strict=True, threads=None)
    assert prov["cublas_workspace_config"] == value
    assert os.environ[CUBLAS_ENV] == value


@pytest.mark.parametrize("value", [":0:0", "4096:8", ":4096:2", ""])
def test_strict_rejects_other_cublas_config(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    _non_strict_state()
    monkeypatch.setenv(CUBLAS_ENV, value)
    with pytest.raises(ContractError) as info:
        establish(strict=True, threads=None)
    assert CUBLAS_ENV in info.value.message
    assert info.value.hint and ":4096:8" in info.value.hint
    assert "\n" not in info.value.one_line()
    # failed before changing anything
    assert not torch.are_deterministic_algorithms_enabled()
    assert os.environ[CUBLAS_ENV] == value


def test_non_strict_records_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    _non_strict_state()
    monkeypatch.setenv(CUBLAS_ENV, ":0:0")  # not an error when not strict
    prov = establish(strict=False, threads=None, attention="sdpa")
    assert set(prov) == PROVENANCE_KEYS
    assert prov["strict"] is False
    assert prov["deterministic_algorithms"] is False
    assert prov["cudnn_deterministic"] is False
    assert prov["cudnn_benchmark"] is True
    assert prov["cublas_workspace_config"] == ":0:0"
    assert prov["attention"] == "sdpa"
    assert not torch.are_deterministic_algorithms_enabled()


def test_non_strict_unset_cublas_is_none(no_cublas_env: None) -> None:
    prov = establish(strict=False, threads=None)
    assert prov["cublas_workspace_config"] is None
    assert CUBLAS_ENV not in os.environ


def test_setting_that_does_not_stick_is_contract_error(
    monkeypatch: pytest.MonkeyPatch, no_cublas_env: None
) -> None:
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: False)
    with pytest.raises(ContractError, match="deterministic algorithms are off"):
        establish(strict=True, threads=None)


def test_verify_strict_notices_a_reset(no_cublas_env: None) -> None:
    establish(strict=True, threads=None)
    torch.backends.cudnn.benchmark = True
    with pytest.raises(ContractError, match="cudnn.benchmark"):
        verify_strict()


def test_verify_strict_notices_warn_only(no_cublas_env: None) -> None:
    establish(strict=True, threads=None)
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.raises(ContractError, match="warn-only"):
        verify_strict()


# -- threads -----------------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [True, False])
def test_threads_applied_and_recorded(strict: bool, no_cublas_env: None) -> None:
    target = 1 if torch.get_num_threads() != 1 else 2
    prov = establish(strict=strict, threads=target)
    assert torch.get_num_threads() == target
    assert prov["threads"] == target


def test_threads_none_keeps_current() -> None:
    before = torch.get_num_threads()
    assert establish(strict=False, threads=None)["threads"] == before


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "2"])
def test_bad_threads_is_config_error(threads: object) -> None:
    before = torch.get_num_threads()
    with pytest.raises(ConfigError, match="--threads"):
        establish(strict=False, threads=threads)  # type: ignore[arg-type]
    assert torch.get_num_threads() == before


def test_thread_count_that_does_not_stick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    with pytest.raises(ContractError, match="thread count"):
        establish(strict=False, threads=5)


# -- device and attention ----------------------------------------------------------------------


def test_parse_device() -> None:
    assert parse_device("cpu") is None
    assert parse_device("cuda:0") == 0
    assert parse_device("cuda:3") == 3


@pytest.mark.parametrize("device", ["cuda", "gpu:0", "CPU", "cuda:", "cuda:-1", "cuda:0 ", "mps"])
def test_bad_device_string(device: str) -> None:
    with pytest.raises(ConfigError, match="--device"):
        establish(strict=False, threads=None, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device exists here")
def test_cuda_without_gpu_is_config_error(no_cublas_env: None) -> None:
    with pytest.raises(ConfigError) as info:
        establish(strict=True, threads=None, device="cuda:0")
    assert info.value.one_line() == (
        "--device cuda:0 asked for but no CUDA device is available — use --device cpu"
    )
    assert CUBLAS_ENV not in os.environ  # nothing was changed


def test_cuda_initialised_before_cublas_config_fails_closed(
    monkeypatch: pytest.MonkeyPatch, no_cublas_env: None
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ContractError, match="initialised before"):
        establish(strict=True, threads=None, device="cuda:0")
    assert CUBLAS_ENV not in os.environ


def test_cuda_initialised_after_cublas_config_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CUBLAS_ENV, ":16:8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Fake GPU")
    prov = establish(strict=True, threads=None, device="cuda:0")
    assert prov["device"] == "cuda:0"
    assert prov["device_name"] == "Fake GPU"
    assert prov["cublas_workspace_config"] == ":16:8"


def test_cuda_index_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="only 1 CUDA device"):
        establish(strict=False, threads=None, device="cuda:1")


def test_unknown_attention_is_config_error() -> None:
    with pytest.raises(ConfigError, match="attention"):
        establish(strict=False, threads=None, attention="flash_attention_9")


@pytest.mark.gpu
def test_strict_cuda_matmul_repeats_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    # set up front: another test may already have initialised CUDA in this process
    monkeypatch.setenv(CUBLAS_ENV, ":4096:8")
    prov = establish(strict=True, threads=None, device="cuda:0")
    assert prov["cuda"] is not None
    assert prov["cublas_workspace_config"] in (":4096:8", ":16:8")
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(256, 512, generator=gen).to("cuda:0")
    b = torch.randn(512, 128, generator=gen).to("cuda:0")
    first = (a @ b).cpu()
    second = (a @ b).cpu()
    assert torch.equal(first, second)


# -- runtime versions --------------------------------------------------------------------------


def test_runtime_versions() -> None:
    v = runtime_versions()
    assert set(v) == {
        "python",
        "platform",
        "torch",
        "transformers",
        "peft",
        "safetensors",
        "numpy",
        "tokenizers",
        "twinrun",
    }
    assert v["torch"] == torch.__version__
    assert v["python"] and v["platform"]
    import twinrun

    assert v["twinrun"] == twinrun.__version__


def test_runtime_versions_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(determinism, "RUNTIME_PACKAGES", ("torch", "definitely-not-installed-xyz"))
    v = runtime_versions()
    assert v["definitely-not-installed-xyz"] is None
    assert v["torch"] == torch.__version__
