"""`twinrun.core.portable`: what it puts in the environment, what it takes back, what it reads."""

from __future__ import annotations

import os

import pytest

from twinrun.core import portable
from twinrun.core.errors import ConfigError


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="--cpu-kernels must be portable or native$"):
        portable.check_mode("fast")


def test_pinning_keeps_what_the_user_set_and_unpinning_takes_back_only_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(portable, "_pinned_here", {})
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    portable.pin_environment()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2" and os.environ["MKL_CBWR"] == "AVX2"
    portable.unpin_environment()
    assert "ATEN_CPU_CAPABILITY" not in os.environ and os.environ["MKL_CBWR"] == "AVX2"


def test_this_process_reads_back_portable() -> None:
    """The suite pins the environment before torch loads (tests/conftest.py)."""
    portable.establish_kernels("portable")
    record = portable.read_back()
    assert record["aten_capability"] == "AVX2" and record["mkl_cbwr"] == "COMPATIBLE"
    assert record["onednn"] is False and portable.is_portable(record)
    assert not portable.is_portable(record | {"aten_capability": "AVX512"})
    assert not portable.is_portable(record | {"mkl_cbwr": "AUTO"})
    assert record["native_capability"] in ("AVX2", "AVX512") and record["machine"] == "x86_64"
