"""`twinrun.core.digit_kernels` and the integer GEMM under it: the fused C passes give the torch
passes' bits; digits stay in [-64, 63] and recombine to q; oneDNN's int8 GEMM is exact for such
digits under every instruction cap (`ONEDNN_MAX_CPU_ISA`), on random and all-extreme blocks and
inner dimensions up to 2**14, and the whole product is the same there as on the float64 engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from twinrun.core import digit_kernels as dk
from twinrun.core import exact_matmul as em

ROOT = Path(__file__).resolve().parents[3]
CAPS = ["AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_AMX"]


def spread(shape: tuple[int, ...], seed: int, span: int = 60) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    exps = torch.randint(-span, span + 1, shape, generator=g).to(torch.float64)
    return (mant * torch.exp2(exps)).to(torch.float32)


def awkward_rows() -> torch.Tensor:
    """Rows that reach the digits' edges: a zero row, subnormals, the float32 maximum, values
    whose digits are -64 and whose top digit is +-32, one outlier among small values."""
    rows = torch.zeros(6, 9)
    rows[1] = torch.tensor([2.0**-149, -(2.0**-149), 2.0**-140, 0.0, 3 * 2.0**-149, 0, 0, 0, 0])
    rows[2] = torch.tensor([3.4e38, -3.4e38, 1.0, -1.0, 2.0**100, 0, 0, 0, 7.0])
    rows[3] = torch.tensor([1.0, -1.0, 0.5, 1.0 - 2.0**-24, -(2.0**-7), 2.0**-14, 64 / 128, 0, 0])
    rows[4] = torch.tensor([2.6e4, 1e-3, -2e-3, 1.0, -1.0, 0.25, 3.0, -7.0, 1e-30])
    rows[5] = torch.tensor([1.0 + 64 * 2.0**-25, -(1.0 + 64 * 2.0**-18), 0.99, 0, 0, 0, 0, 0, 1])
    return rows


@pytest.mark.parametrize("reverse", [False, True])
def test_c_and_torch_slices_agree(reverse: bool) -> None:
    if dk.library() is None:
        pytest.skip("no C compiler here: only the torch passes run")
    for x in (
        spread((37, 300), 1),
        awkward_rows(),
        spread((20, 64), 2)[:, ::3],
        spread((9, 40), 3).t(),
    ):
        got, ref = dk.slice_lines(x, reverse), dk.slice_torch(x, reverse)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_c_and_torch_loud_counts_agree() -> None:
    if dk.library() is None:
        pytest.skip("no C compiler here: only the torch passes run")
    rows = awkward_rows()
    rows[3, 7] = -0.0
    for x in (spread((37, 300), 4), rows, spread((20, 64), 5)[:, ::3]):
        e = dk.slice_lines(x, reverse=True)[1]
        loud, nonzero = dk.loud_counts(x, e, 5)
        assert torch.equal(loud, dk.loud_counts_torch(x, e, 5)[0])
        assert torch.equal(nonzero, dk.loud_counts_torch(x, e, 5)[1])
        assert torch.equal(nonzero, (x != 0).sum(1))  # -0.0 is a zero
    assert dk.loud_counts(rows, dk.slice_lines(rows, reverse=True)[1], 5)[0][4] == 1  # 2.6e4


def test_digits_are_in_range_and_recombine_to_q() -> None:
    x = torch.cat([awkward_rows(), spread((30, 9), 4)])
    planes, e = dk.slice_torch(x, reverse=False)
    k = x.shape[1]
    digits = [planes[:, i * k : (i + 1) * k].long() for i in range(dk.DIGITS)]
    assert all(int(d.min()) >= dk.LOW and int(d.max()) <= dk.HIGH for d in digits)
    assert int(digits[0].abs().max()) <= 32
    q = sum(d * dk.BASE ** (dk.DIGITS - 1 - i) for i, d in enumerate(digits))
    expect = torch.round(x.double() * dk.pow2(dk.W - e.long()).unsqueeze(1))
    assert torch.equal(q.double(), expect)
    assert int(q.abs().max()) <= 2**dk.W


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_c_and_torch_combine_agree(dtype: torch.dtype) -> None:
    if dk.library() is None:
        pytest.skip("no C compiler here: only the torch passes run")
    g = torch.Generator().manual_seed(5)
    parts = [torch.randint(-(2**30), 2**30, (23, 17), dtype=torch.int32, generator=g)]
    parts += [
        torch.randint(-(2**30), 2**30, (23, 17), dtype=torch.int32, generator=g) for _ in "abc"
    ]
    ea = torch.randint(-148, 129, (23,), dtype=torch.int32, generator=g)
    eb = torch.randint(-148, 129, (17,), dtype=torch.int32, generator=g)
    got = dk.combine(parts, ea, eb, dtype)
    assert torch.equal(got, dk.combine_torch(parts, ea, eb).to(dtype))
    assert got.dtype == dtype


def test_a_view_with_a_row_stride_combines_like_a_copy() -> None:
    g = torch.Generator().manual_seed(6)
    big = [torch.randint(-(2**20), 2**20, (8, 12), dtype=torch.int32, generator=g) for _ in "abcd"]
    views = [p[:, 2:9] for p in big]
    ea, eb = torch.zeros(8, dtype=torch.int32), torch.ones(7, dtype=torch.int32)
    assert torch.equal(
        dk.combine(views, ea, eb), dk.combine([v.contiguous() for v in views], ea, eb)
    )


CAP_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys, torch
    from twinrun.core import exact_matmul as em
    wrong, cases = 0, 0
    for m, k, n in [(17, 64, 9), (64, 1000, 33), (5, 16384, 3), (96, 512, 80)]:
        g = torch.Generator().manual_seed(k)
        blocks = [(torch.randint(-64, 64, (m, k), dtype=torch.int8, generator=g),
                   torch.randint(-64, 64, (k, n), dtype=torch.int8, generator=g))]
        for va in (-64, 63):
            for vb in (-64, 63):
                blocks.append((torch.full((m, k), va, dtype=torch.int8),
                               torch.full((k, n), vb, dtype=torch.int8)))
        alt = torch.tensor([-64, 63], dtype=torch.int8).repeat((k + 1) // 2)[:k]
        blocks.append((alt.repeat(m, 1), alt.repeat(n, 1).t().contiguous()))
        blocks.append((alt.repeat(m, 1), alt.flip(0).repeat(n, 1).t().contiguous()))
        blocks.append((alt.repeat(m, 1).flip(1), alt.repeat(n, 1).t()))  # transposed
        for a, b in blocks:
            cases += 1
            wrong += not torch.equal(torch._int_mm(a, b).long(), a.long() @ b.long())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 3000, generator=g); x[::7, 5] = 2.6e4
    y = torch.randn(3000, 24, generator=g) * 0.05
    product = em.exact_product64(x, y)
    digest = hashlib.sha256(product.numpy().tobytes()).hexdigest()
    print(json.dumps({"wrong": wrong, "cases": cases, "product": digest}))
    """
)


def run_capped(cap: str | None, engine: str = "int8") -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONEDNN_", "TWINRUN_EXACT"))}
    if cap:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    env["TWINRUN_EXACT_ENGINE"] = engine
    proc = subprocess.run([sys.executable, "-c", CAP_SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_int8_gemm_is_exact_for_digits_under_every_onednn_cap() -> None:
    """Each cap is a fresh process (oneDNN reads it once). On a CPU without a cap's
    instructions oneDNN takes the best path below it, which is one more path checked."""
    reference = run_capped(None, engine="float64")["product"]
    for cap in [None, *CAPS]:
        got = run_capped(cap)
        assert got["wrong"] == 0, f"{cap}: {got['wrong']} of {got['cases']} int8 products wrong"
        assert got["product"] == reference, f"{cap}: the exact product moved"


def test_plus_minus_127_would_not_be_exact_where_onednn_lacks_vnni() -> None:
    """Why the digits stop at [-64, 63]: +-127 operands saturate on oneDNN's AVX2 path (a check
    that the cap above is real, not a claim about every machine's default path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEDNN_")}
    env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    code = (
        "import torch; a = torch.full((16, 256), 127, dtype=torch.int8); "
        "print(int(torch._int_mm(a, a.t().contiguous())[0, 0]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert int(proc.stdout.strip()) != 127 * 127 * 256
    a = torch.full((16, 256), 63, dtype=torch.int8)
    assert int(em.torch._int_mm(a, a.t().contiguous())[0, 0]) == 63 * 63 * 256
