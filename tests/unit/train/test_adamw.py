"""twinrun's AdamW is bitwise torch's single-tensor AdamW, and round-trips its state."""

from __future__ import annotations

import pytest
import torch

from twinrun.core.tiles import span, tile_parameters
from twinrun.train.step.adamw import AdamW


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("tile", [False, True])
def test_bitwise_equal_to_torch(weight_decay: float, tile: bool) -> None:
    """Also with the parameters tiled in one buffer (as training keeps them), and at lengths
    whose vector loops end in a tail at an odd offset into the buffer."""
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g),
            torch.randn(37, 41, generator=g), torch.randn(1003, generator=g)]  # fmt: skip
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    if tile:
        tile_parameters(ours)
    kw = dict(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
    a = AdamW(ours, **kw)  # type: ignore[arg-type]
    b = torch.optim.AdamW(ref, foreach=False, fused=False, **kw)  # type: ignore[arg-type]
    for step in range(6):
        grads = [torch.randn(t.shape, generator=g) for t in init]
        for p, q, gr in zip(ours, ref, grads, strict=True):
            p.grad, q.grad = gr.clone(), gr.clone()
        for group in (*a.param_groups, *b.param_groups):
            group["lr"] = 3e-3 * (6 - step) / 6
        a.step()
        b.step()
        for p, q in zip(ours, ref, strict=True):
            assert torch.equal(p, q)
            assert torch.equal(a.state[p]["exp_avg"], b.state[q]["exp_avg"])
            assert torch.equal(a.state[p]["exp_avg_sq"], b.state[q]["exp_avg_sq"])
        for key in ("exp_avg", "exp_avg_sq"):  # each moment in one buffer
            assert span([a.state[p][key] for p in ours]) is not None


def test_state_dict_round_trip() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    p.grad = torch.full((3,), 0.5)
    opt.step()
    q = torch.nn.Parameter(p.detach().clone())
    other = AdamW([q], lr=0.5, betas=(0.5, 0.5), eps=1.0, weight_decay=1.0)
    other.load_state_dict(opt.state_dict())
    assert other.param_groups[0]["lr"] == 0.1 and other.param_groups[0]["betas"] == (0.9, 0.99)
    for x in (p, q):
        x.grad = torch.full((3,), -0.25)
    opt.step()
    other.step()
    assert torch.equal(p, q)
    opt.zero_grad(set_to_none=False)
    assert torch.equal(p.grad, torch.zeros(3))  # type: ignore[arg-type]


def test_a_loaded_state_is_tiled_and_a_copy() -> None:
    params = [torch.nn.Parameter(torch.ones(4, 3)), torch.nn.Parameter(torch.ones(5))]
    opt = AdamW(params, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    for p in params:
        p.grad = torch.full(p.shape, 0.5)
    opt.step()
    sd = opt.state_dict()
    saved = {
        "state": {i: {k: v.clone() for k, v in s.items()} for i, s in sd["state"].items()},
        "param_groups": sd["param_groups"],
    }
    other = AdamW(params, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    other.load_state_dict(saved)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        for i, p in enumerate(params):
            assert torch.equal(other.state[p][key], saved["state"][i][key])
            assert other.state[p][key].data_ptr() != saved["state"][i][key].data_ptr()
    assert span([other.state[p]["exp_avg"] for p in params]) is not None
    assert span([other.state[p]["exp_avg_sq"] for p in params]) is not None
