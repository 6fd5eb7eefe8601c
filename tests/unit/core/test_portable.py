"""`twinrun.core.portable`: what it puts in the environment, what it takes back, what it reads."""

from __future__ import annotations

import os

import numpy as np
import pytest

from twinrun.core import pinning, portable
from twinrun.core.errors import ConfigError


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="--cpu-kernels must be portable or native$"):
        portable.check_mode("fast")


def test_pinning_keeps_what_the_user_set_and_unpinning_takes_back_only_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pinning, "_pinned_here", {})
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    portable.pin_environment()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2" and os.environ["MKL_CBWR"] == "AVX2"
    portable.unpin_environment()
    assert "ATEN_CPU_CAPABILITY" not in os.environ and os.environ["MKL_CBWR"] == "AVX2"


def test_a_child_gets_the_user_s_environment_not_the_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    """`user_environment`: this process's environment less what `pin_environment` set here; a
    value the user set, and everything else, passes through."""
    monkeypatch.setattr(pinning, "_pinned_here", {})
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setenv("TWINRUN_TEST_OTHER", "kept")
    portable.pin_environment()
    child = portable.user_environment()
    assert "ATEN_CPU_CAPABILITY" not in child and child["TWINRUN_TEST_OTHER"] == "kept"
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"  # this process keeps its pin
    portable.unpin_environment()
    for users in ("avx2", "avx512"):  # set by the user: never taken for the pin
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", users)
        portable.pin_environment()
        assert portable.user_environment()["ATEN_CPU_CAPABILITY"] == users
    monkeypatch.setattr(pinning, "_pinned_here", {"ATEN_CPU_CAPABILITY": "avx2"})
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # changed since the pin: not the pin's
    assert portable.user_environment()["ATEN_CPU_CAPABILITY"] == "default"


def test_this_process_reads_back_portable() -> None:
    """The suite pins the environment before torch loads (tests/conftest.py)."""
    portable.establish_kernels("portable")
    record = portable.read_back()
    assert record["aten_capability"] == "AVX2" and record["exact_products"] is True
    assert record["onednn"] is False and portable.is_portable(record)
    assert not portable.is_portable(record | {"aten_capability": "AVX512"})
    assert not portable.is_portable(record | {"exact_products": False})
    assert portable.is_portable(record | {"mkl_cbwr": "AUTO"})  # MKL's branch no longer matters
    assert record["native_capability"] in ("AVX2", "AVX512") and record["machine"] == "x86_64"


def test_native_takes_the_portable_kernels_back_and_portable_puts_them_in_place() -> None:
    import torch

    from twinrun.core import portable_ops

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 700, generator=g), torch.randn(700, 5, generator=g)
    try:
        native = portable.establish_kernels("native")
        assert native["exact_products"] is False and not portable_ops.installed()
        assert native["onednn"] is True and native["sdpa_fused"] is True
        record = portable.establish_kernels("portable")
        assert record["exact_products"] is True and portable_ops.installed()
        from twinrun.core.exact_matmul import exact_matmul

        assert torch.equal(torch.mm(a, b), exact_matmul(a, b))
        root = torch.from_numpy(np.sqrt(b.abs().numpy()))  # IEEE's correctly rounded sqrt
        assert torch.equal(torch.sqrt(b.abs()), root)
    finally:
        portable.establish_kernels("portable")


def test_the_mkl_branch_names_are_the_numbers_mkl_reads_back() -> None:
    assert portable._MKL_BRANCHES[3] == "COMPATIBLE" and portable._MKL_BRANCHES[10] == "AVX2"
    assert portable._MKL_BRANCHES[12] == "AVX512" and portable._MKL_BRANCHES[1] == "OFF"


def test_the_default_mode_is_native_unless_the_environment_names_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TWINRUN_CPU_KERNELS", raising=False)
    assert portable.default_mode() == "native"
    monkeypatch.setenv("TWINRUN_CPU_KERNELS", "portable")
    assert portable.default_mode() == "portable"
    monkeypatch.setenv("TWINRUN_CPU_KERNELS", "fast")
    with pytest.raises(ConfigError, match="^TWINRUN_CPU_KERNELS must be portable or native$"):
        portable.check_mode(portable.default_mode())


def test_each_mode_states_its_promise() -> None:
    assert portable.promise({"mode": "portable"}) == (
        "the same bytes on every x86-64 CPU with AVX2, at any thread count"
    )
    native = portable.promise({"mode": "native", "cpu_model": "X", "aten_capability": "AVX512"})
    assert native.startswith("the same bytes on this kind of CPU (X, AVX512 kernels) at this")
