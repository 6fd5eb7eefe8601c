"""Batch-invariant mode, proved on the model itself (`twinrun.model.invariant`).

What these tests show, bit for bit, on the wide toy (hidden 256, where batching changes numbers,
docs/batching.md) and on rows of mixed lengths:
- a row's logits and hidden states are the same whatever batch (1, 3, 4, 8) and padding it rides
  in (f32 and bf16 autocast), and stay close to what the ordinary forward gives it;
- the loss reductions sum a row over its own span, so padding cannot move their bits;
- a row's gradient contribution (the backward of that row's loss alone) is the same inside a batch
  of 8 as alone, and a whole batch's gradient is what separate one-row backwards accumulate;
- the accumulation order is the documented one (row order; a row's forwards summed first).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from twinrun.data.batching import pad_rows
from twinrun.data.examples import EncodedRow
from twinrun.model.build import CausalLM, load_causal_lm
from twinrun.model.invariant import real_lengths, row_aliases
from twinrun.model.lora import apply_lora, lora_parameters
from twinrun.objectives.dpo import sequence_logprob
from twinrun.objectives.sft import BATCH_INVARIANT_TAG, completion_nll, row_sums


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The suite runs with the portable CPU kernels, whose matrix multiplies split their sums by
    thread: the mode's promise holds at one thread there (runs with several are refused)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# mixed lengths: every batch is padded; short rows share attention widths 32/64, the long ones
# (65, 130) get their own multiple of 32 (96, 160)
LENGTHS = [7, 33, 130, 48, 5, 65, 40, 16]


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from twinrun.model.toy import write_toy_checkpoint

    out = tmp_path_factory.mktemp("wide") / "model"
    write_toy_checkpoint(out, seed=0, hidden=256, intermediate=512, heads=4, kv_heads=2)
    return out


@pytest.fixture(scope="module")
def rows() -> list[EncodedRow]:
    g = torch.Generator().manual_seed(7)
    out = []
    for n in LENGTHS:
        ids = torch.randint(3, 250, (n,), generator=g).tolist()
        out.append(EncodedRow(tuple(ids), tuple([0] * (n // 3) + [1] * (n - n // 3))))
    return out


def trained_model(model_dir: Path, precision: str = "f32") -> CausalLM:
    """The toy with LoRA whose B factors are non-zero (so every LoRA weight gets a gradient)."""
    model = load_causal_lm(model_dir, precision=precision)
    apply_lora(model, 4, 8.0, seed=3, targets=("q_proj", "v_proj"))
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in lora_parameters(model):
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


@contextmanager
def precision_ctx(precision: str) -> Iterator[None]:
    if precision == "bf16":
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


def batched(
    model: CausalLM, rows: list[EncodedRow], size: int, extra_pad: int, precision: str
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per row: (logits [L, V], hidden at layer 2 [L, H], completion NLL sum [1])."""
    out = []
    for start in range(0, len(rows), size):
        batch = rows[start : start + size]
        width = max(len(r.input_ids) for r in batch) + extra_pad
        ids, attn, mask = pad_rows(batch, 258, length=width)
        with torch.no_grad(), precision_ctx(precision):
            res = model.run(ids, attn, hidden_layer=2)
        sums, _ = completion_nll(res.logits, ids, mask)
        assert res.hidden is not None
        for b, r in enumerate(batch):
            n = len(r.input_ids)
            out.append((res.logits[b, :n], res.hidden[b, :n], sums[b : b + 1]))
    return out


def equal_rows(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> int:
    return sum(
        all(torch.equal(x, y) for x, y in zip(ra, rb, strict=True))
        for ra, rb in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_rows_are_bitwise_the_same_in_any_batch(
    wide_dir: Path, rows: list[EncodedRow], precision: str
) -> None:
    model = trained_model(wide_dir, precision)
    model.batch_invariant = False
    ordinary = batched(model, rows, 1, 0, precision)
    model.batch_invariant = True
    alone = batched(model, rows, 1, 0, precision)  # a batch of one
    tol = 1e-5 if precision == "f32" else 5e-2  # packed matmuls associate differently
    for got, ref in zip(alone, ordinary, strict=True):
        assert torch.allclose(got[0], ref[0], rtol=tol, atol=tol)
    for size, extra_pad in ((4, 0), (8, 0), (8, 9), (3, 2), (1, 5)):
        got = batched(model, rows, size, extra_pad, precision)
        assert equal_rows(got, alone) == len(rows), (size, extra_pad)


def test_slot_widths_depend_on_the_row_alone() -> None:
    from twinrun.model.packing import plan_for, slot_width

    got = [slot_width(n) for n in (1, 32, 33, 64, 65, 96, 97, 130, 400)]
    assert got == [32, 32, 64, 64, 96, 96, 128, 160, 416]
    plan = plan_for(LENGTHS, torch.device("cpu"))
    assert [(g.width, g.rows) for g in plan.groups] == [
        (32, (0, 4, 7)),
        (64, (1, 3, 6)),
        (96, (5,)),
        (160, (2,)),
    ]
    assert plan.total == 384  # 344 tokens, padded to a multiple of 64


def test_padded_positions_are_zero_and_tagged(wide_dir: Path, rows: list[EncodedRow]) -> None:
    model = trained_model(wide_dir)
    model.batch_invariant = True
    ids, attn, _ = pad_rows(rows[:2], 258)
    with torch.no_grad():
        out = model.run(ids, attn, hidden_layer=1)
    assert getattr(out.logits, BATCH_INVARIANT_TAG) is True
    assert out.hidden is not None and out.logits.shape[:2] == ids.shape
    assert not out.logits[0, LENGTHS[0] :].any() and not out.hidden[0, LENGTHS[0] :].any()


def test_row_sums_do_not_depend_on_padded_width() -> None:
    g = torch.Generator().manual_seed(0)
    trials = 0
    for trial in range(200):
        n = int(torch.randint(1, 300, (1,), generator=g))
        values = torch.rand(1, n, generator=g) * 10
        mask = torch.ones(1, n, dtype=torch.bool)
        alone = row_sums(values, mask, invariant=True)
        assert torch.equal(alone, values.sum(dim=1))  # the span is the row: a batch of one
        for extra in (1, 5, 17, 64 + trial % 13):
            padded = torch.cat([values, torch.zeros(1, extra)], dim=1)
            pmask = torch.cat([mask, torch.zeros(1, extra, dtype=torch.bool)], dim=1)
            assert torch.equal(row_sums(padded, pmask, invariant=True), alone)
            trials += 1
    assert trials == 800


def test_reductions_follow_the_tag_or_the_flag() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 9, 11, generator=g)
    ids = torch.randint(0, 11, (2, 9), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1, 1, 1]])
    plain, _ = completion_nll(logits, ids, mask, batch_invariant=True)
    first, _ = completion_nll(logits[:1, :5], ids[:1, :5], mask[:1, :5])
    assert torch.equal(plain[:1], first)  # row 0 summed over its own span
    setattr(logits, BATCH_INVARIANT_TAG, True)
    tagged, _ = completion_nll(logits, ids, mask)
    assert torch.equal(tagged, plain)
    assert torch.equal(sequence_logprob(logits, ids, mask), -plain)


def row_grads(model: CausalLM, batch: list[EncodedRow], row: int | None) -> list[torch.Tensor]:
    """LoRA gradients of the loss of `row` (None: of every row) in one forward over `batch`."""
    params = [p for _, p in lora_parameters(model)]
    for p in params:
        p.grad = None
    ids, attn, mask = pad_rows(batch, 258)
    sums, _ = completion_nll(model(ids, attn), ids, mask)
    (sums.sum() if row is None else sums[row]).backward()
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def test_a_rows_gradient_contribution_is_the_same_in_a_batch(
    wide_dir: Path, rows: list[EncodedRow]
) -> None:
    model = trained_model(wide_dir)
    model.batch_invariant = True
    for row in range(len(rows)):
        alone = row_grads(model, [rows[row]], None)
        inside = row_grads(model, rows, row)
        assert all(torch.equal(a, b) for a, b in zip(alone, inside, strict=True)), row
        assert any(a.abs().sum() > 0 for a in alone)


def test_a_batch_gradient_is_what_one_row_backwards_accumulate(
    wide_dir: Path, rows: list[EncodedRow]
) -> None:
    model = trained_model(wide_dir)
    params = [p for _, p in lora_parameters(model)]
    model.batch_invariant = True
    for p in params:
        p.grad = None
    for r in rows:  # batch size 1, one backward per row
        ids, attn, mask = pad_rows([r], 258)
        completion_nll(model(ids, attn), ids, mask)[0].sum().backward()
    sequential = [p.grad.clone() for p in params if p.grad is not None]
    for size in (8, 4, 3):
        for p in params:
            p.grad = None
        for start in range(0, len(rows), size):
            ids, attn, mask = pad_rows(rows[start : start + size], 258)
            completion_nll(model(ids, attn), ids, mask)[0].sum().backward()
        got = [p.grad for p in params if p.grad is not None]
        assert all(torch.equal(a, b) for a, b in zip(got, sequential, strict=True)), size


def test_row_aliases_add_in_row_order() -> None:
    # g = [1, 2**-24, 2**-24]: in row order 1 + 2**-24 rounds back to 1, twice; any other
    # association gives 1 + 2**-23. Autograd's own accumulation reaches the last row first.
    p = torch.zeros(1, requires_grad=True)
    weights = [1.0, 2.0**-24, 2.0**-24]
    aliases = row_aliases(3, (p,))
    sum(a * w for a, w in zip(aliases, weights, strict=True)).sum().backward()
    assert p.grad is not None and p.grad.item() == 1.0


def test_row_aliases_sum_a_rows_forwards_first() -> None:
    # two forwards of two rows each in one backward (a pair's chosen and rejected sides):
    # .grad = (0 + (c0 + r0)) + (c1 + r1), which is what two one-pair backwards give
    p = torch.zeros(1, requires_grad=True)
    c = row_aliases(2, (p,))
    r = row_aliases(2, (p,))
    grads = {"c0": 1.0, "r0": 2.0**-24, "c1": 2.0**-24, "r1": 2.0**-24}
    loss = c[0] * grads["c0"] + r[0] * grads["r0"] + c[1] * grads["c1"] + r[1] * grads["r1"]
    loss.sum().backward()
    expected = torch.tensor([0.0]) + (torch.tensor([1.0]) + torch.tensor([2.0**-24]))
    expected = expected + (torch.tensor([2.0**-24]) + torch.tensor([2.0**-24]))
    assert p.grad is not None and torch.equal(p.grad, expected)


def test_bad_batches_are_refused(wide_dir: Path) -> None:
    with pytest.raises(ValueError, match="right-padded"):
        real_lengths(torch.tensor([[0, 1, 1]]), 1, 3)
    with pytest.raises(ValueError, match="no real token"):
        real_lengths(torch.tensor([[1, 1, 0], [0, 0, 0]]), 2, 3)
    model = load_causal_lm(wide_dir)
    model.batch_invariant = True
    with pytest.raises(ValueError, match="one row"):
        model(torch.ones(2, 3, dtype=torch.long), kv_cache=model.new_cache())


def test_steering_attribute_is_used_unless_steer_is_given(wide_dir: Path) -> None:
    model = load_causal_lm(wide_dir)
    ids = torch.tensor([[256, 72, 105, 33]])
    vec = torch.full((256,), 0.5)
    with torch.no_grad():
        plain = model(ids)
        explicit = model(ids, steer=(2, vec))
        model.steering = (2, vec)
        attached = model(ids)
        zero = model(ids, steer=(2, torch.zeros(256)))
    assert torch.equal(attached, explicit) and not torch.equal(attached, plain)
    assert torch.equal(zero, plain)
