"""Lane charts: the DOT of a small chart (golden), wrapping, and links across bands.

Run with CGC_UPDATE_GOLDEN=1 to rewrite the golden file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from cgc.viz.lanes import Cell, LaneChart, LegendEntry, Link, Row, lanes_dot

HERE = Path(__file__).parent


def _chart(steps: int) -> LaneChart:
    rows = [Row("a", "a", "Worker", "#dbe9f6"), Row("b", "b", "comm stream", "#fde2c8")]
    cells = [Cell(f"a.{s}", "a", s, f"op {s}", "task 1 · i") for s in range(steps)]
    cells.append(Cell("b.0", "b", 1, "RECV c1", "←a #0 · i", dashed=True))
    cells.append(Cell("b.1", "b", steps - 1, "last", "x<y & z"))
    links = [Link("a.1", "b.0", "#1f5fbf"), Link("a.0", "b.1", "#7f7f7f", "dashed")]
    legend = [LegendEntry("op", "an op"), LegendEntry("", "a link", line_style="solid")]
    return LaneChart("demo\nsecond line", rows, cells, links, legend)


def test_small_chart_golden():
    text = lanes_dot(_chart(3))
    path = HERE / "golden" / "lanes_small.dot"
    if os.environ.get("CGC_UPDATE_GOLDEN"):  # a missing golden fails: regenerate on purpose
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")
    assert "x&lt;y &amp; z" in text  # labels are escaped for Graphviz's HTML labels


def test_long_chart_wraps_and_drops_links_across_bands():
    text = lanes_dot(_chart(40), max_width_pt=800)
    bands = re.findall(r"// band (\d+): steps (\d+)-(\d+)", text)
    assert [b[0] for b in bands] == ["0", "1", "2", "3", "4"]  # 9 fit: 5 bands of 8
    assert bands[-1][2] == "39"
    xs = [float(x) for x in re.findall(r'pos="([\d.]+),', text)]
    assert max(xs) <= 800
    assert '"a.1" -> "b.0"' in text  # both in band 0
    assert '"a.0" -> "b.1"' not in text  # b.1 is in the last band


def test_unknown_row_is_an_error():
    chart = _chart(2)
    chart.cells.append(Cell("z", "nope", 0, "?"))
    with pytest.raises(KeyError):
        lanes_dot(chart)
