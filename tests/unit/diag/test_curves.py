"""`twinrun plot`'s figure read back: a run has one colour and one line style in every panel,
runs differ in both (two identical runs stay visible one over the other), and one legend names
every run once for all the panels."""

from __future__ import annotations

from pathlib import Path

from twinrun.diag.curves import draw_curves


def rows(scale: float) -> list[dict[str, object]]:
    return [
        {"phase": "train", "step": s, "loss": scale / (s + 1), "lr": 1e-3, "grad_norm": 0.5}
        for s in range(5)
    ]


def test_each_run_keeps_its_colour_and_style_in_every_panel_with_one_legend() -> None:
    table = {Path("runs/a"): rows(1.0), Path("runs/b"): rows(1.0), Path("runs/c"): rows(2.0)}
    fig = draw_curves(table, ["loss", "lr", "grad_norm"])
    panels = fig.axes
    assert [ax.get_title() for ax in panels] == ["loss", "lr", "grad_norm"]
    looks = {}
    for ax in panels:
        assert ax.get_legend() is None  # no per-panel legend
        for line in ax.get_lines():
            look = (line.get_color(), line.get_linestyle(), line.get_linewidth())
            assert looks.setdefault(line.get_label(), look) == look  # the same in every panel
    assert sorted(looks) == ["a", "b", "c"]
    assert len({look[:2] for look in looks.values()}) == 3  # colour and style differ per run
    assert looks["a"][2] > looks["b"][2]  # b (identical to a) is drawn thinner, over it
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c"]
    handles = legend.legend_handles
    assert [(h.get_color(), h.get_linestyle()) for h in handles] == [looks[k][:2] for k in "abc"]
