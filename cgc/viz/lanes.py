"""A lane chart: rows of cells on a grid of steps, wrapped into bands that fit a screen.

Nothing here knows about plans. The schedule view fills a ``LaneChart`` with one row per
actor (plus one per comm stream) and one cell per op; a recorded run can fill the same
chart with the ops it saw, its steps being the order they ran in.

The DOT it writes pins every node (``layout=neato``, positions in points), so Graphviz only
draws: columns stay columns, and a SEND and its RECV in one column are joined by a
vertical line, drawn over the cells it crosses. Long charts wrap: each band repeats the
row labels and numbers its steps.

Example::

    chart = LaneChart("demo", [Row("a", "a")], [Cell("x", "a", 0, "fwd#0")], [])
    Path("demo.dot").write_text(lanes_dot(chart))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

__all__ = ["Row", "Cell", "Link", "LegendEntry", "LaneChart", "Geometry", "lanes_dot",
           "band_layout", "text_width", "MAX_WIDTH_PT"]

# Graphviz draws PNGs at 96 dpi: 1450 points are about 1930 pixels.
MAX_WIDTH_PT = 1450.0
_LABEL_W = 104.0  # the row labels' column
_PITCH = 74.0  # one step
_CELL_W, _CELL_H = 68.0, 26.0
_ROW_PITCH = 34.0
_HEADER_H = 18.0
_BAND_GAP = 22.0


@dataclass(frozen=True)
class Row:
    """One lane: ``label`` in bold, ``sublabel`` under it, ``tint`` behind its cells."""

    key: str
    label: str
    sublabel: str = ""
    tint: str = "#eeeeee"


@dataclass(frozen=True)
class Cell:
    """One op at ``step`` in row ``row``: ``title`` in bold, ``detail`` in small type."""

    key: str
    row: str
    step: int
    title: str
    detail: str = ""
    fill: str = "white"
    border: str = "#444444"
    penwidth: float = 1.0
    dashed: bool = False
    tooltip: str = ""


@dataclass(frozen=True)
class Link:
    """A line from cell ``src`` to cell ``dst`` (drawn when both are in one band)."""

    src: str
    dst: str
    color: str
    style: str = "solid"
    arrow: bool = True
    penwidth: float = 1.2


@dataclass(frozen=True)
class LegendEntry:
    """A legend line: a sample cell (``fill``/``border``) or a line (``line_style``), and text."""

    sample: str
    text: str
    fill: str = "white"
    border: str = "#444444"
    line_style: str = ""  # "solid", "dashed", "dotted": draw a line sample instead of a cell


@dataclass
class LaneChart:
    """What ``lanes_dot`` draws. ``title`` lines are separated by newlines."""

    title: str
    rows: list[Row]
    cells: list[Cell]
    links: list[Link]
    legend: list[LegendEntry] = field(default_factory=list)
    step_name: str = "step"

    @property
    def width(self) -> int:
        """The number of steps."""
        return max((c.step for c in self.cells), default=-1) + 1


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _html(text: str) -> str:
    return escape(text, quote=True)


def text_width(text: str, point_size: float, bold: bool = False) -> float:
    """About how wide Graphviz draws ``text`` in Helvetica (points), erring wide.

    Example: ``text_width("forward_backward #2", 9, bold=True)`` is about 106.
    """
    return len(text) * point_size * (0.62 if bold else 0.56)


@dataclass(frozen=True)
class Geometry:
    """The sizes a chart is drawn with: the label column, a cell, one step (points).

    Each is the default, or wider when a label needs it: boxes are ``fixedsize`` (so that
    the grid stays a grid), and a label wider than its box would spill out of it.
    """

    label_w: float = _LABEL_W
    cell_w: float = _CELL_W

    @property
    def pitch(self) -> float:
        """One step's width."""
        return self.cell_w + (_PITCH - _CELL_W)

    @classmethod
    def of(cls, chart: LaneChart) -> Geometry:
        """The geometry whose boxes fit every label of ``chart``."""
        # Row labels: Graphviz's default 14 pt, bold; the sublabel 8 pt.
        label_w = max([_LABEL_W] + [max(text_width(r.label, 14, True), text_width(r.sublabel, 8))
                                    + 12 for r in chart.rows])
        cell_w = max([_CELL_W] + [max(text_width(c.title, 9, True), text_width(c.detail, 7))
                                  + 10 for c in chart.cells])
        return cls(math.ceil(label_w), math.ceil(cell_w))


def band_layout(width: int, max_width_pt: float = MAX_WIDTH_PT,
                geometry: Geometry = Geometry()) -> tuple[int, int]:
    """``(steps per band, bands)`` for a chart ``width`` steps wide, bands balanced.

    Example: ``band_layout(54) == (18, 3)``.
    """
    fit = max(1, int((max_width_pt - geometry.label_w) // geometry.pitch))
    bands = max(1, math.ceil(width / fit))
    return math.ceil(max(width, 1) / bands), bands


def lanes_dot(chart: LaneChart, max_width_pt: float = MAX_WIDTH_PT) -> str:
    """DOT source of ``chart``, wrapped into bands at most ``max_width_pt`` points wide.

    Example: ``lanes_dot(LaneChart("t", [Row("a", "a")], [Cell("x", "a", 0, "C")], []))``.

    Raises:
        KeyError: a cell names a row, or a link a cell, that the chart does not have.
    """
    geo = Geometry.of(chart)
    label_w, cell_w, pitch = geo.label_w, geo.cell_w, geo.pitch
    per_band, bands = band_layout(chart.width, max_width_pt, geo)
    row_index = {r.key: i for i, r in enumerate(chart.rows)}
    band_h = _HEADER_H + len(chart.rows) * _ROW_PITCH + _BAND_GAP
    cells = {c.key: c for c in chart.cells}
    title = "<BR/>".join(_html(t) for t in chart.title.splitlines())
    out = [
        "digraph schedule {",
        "  layout=neato; inputscale=72; splines=false; outputorder=nodesfirst;",
        f'  labelloc=t; fontname=Helvetica; label=<<FONT POINT-SIZE="12">{title}</FONT>>;',
        '  node [fontname=Helvetica, fixedsize=true, shape=box, style="rounded,filled"];',
        "  edge [arrowsize=0.6];",
    ]

    def pos(x: float, y: float) -> str:
        return f'pos="{x:.1f},{y:.1f}!"'

    def cell_xy(c: Cell) -> tuple[int, float, float]:
        band, col = divmod(c.step, per_band)
        y = -(band * band_h + _HEADER_H + row_index[c.row] * _ROW_PITCH + _ROW_PITCH / 2)
        return band, label_w + col * pitch + pitch / 2, y

    right = label_w + per_band * pitch
    for b in range(bands):
        top = -b * band_h
        first, last = b * per_band, min(chart.width, (b + 1) * per_band) - 1
        out.append(f"  // band {b}: {chart.step_name}s {first}-{last}")
        out.append(
            f'  h{b} [shape=plaintext, style="", width={label_w / 72:.3f}, height=0.2, '
            f'label=<<FONT POINT-SIZE="8" COLOR="#666666">{chart.step_name}s {first}-{last}'
            f"</FONT>>, {pos(label_w / 2, top - _HEADER_H / 2)}];"
        )
        for s in range(first, last + 1):
            x = label_w + (s - first) * pitch + pitch / 2
            out.append(
                f'  h{b}_{s} [shape=plaintext, style="", width=0.4, height=0.2, '
                f'label=<<FONT POINT-SIZE="8" COLOR="#888888">{s}</FONT>>, '
                f"{pos(x, top - _HEADER_H / 2)}];"
            )
        for r in chart.rows:
            y = top - _HEADER_H - row_index[r.key] * _ROW_PITCH - _ROW_PITCH / 2
            sub = (f'<BR/><FONT POINT-SIZE="8" COLOR="#555555">{_html(r.sublabel)}</FONT>'
                   if r.sublabel else "")
            rid = f"b{b}_{row_index[r.key]}"
            out.append(
                f'  {rid} [shape=plaintext, style="", width={(label_w - 6) / 72:.3f}, '
                f'height={_CELL_H / 72:.3f}, label=<<B>{_html(r.label)}</B>{sub}>, '
                f"{pos(label_w / 2, y)}];"
            )
            # The row's band: a node declared before the cells, so drawn under them.
            out.append(
                f'  {rid}_band [shape=box, style=filled, color="{r.tint}", label="", '
                f"width={(right - label_w + 4) / 72:.3f}, height={(_ROW_PITCH - 4) / 72:.3f}, "
                f"{pos((right + label_w) / 2, y)}];"
            )
    for c in chart.cells:
        _, x, y = cell_xy(c)
        detail = (f'<BR/><FONT POINT-SIZE="7" COLOR="#444444">{_html(c.detail)}</FONT>'
                  if c.detail else "")
        style = '"rounded,filled,dashed"' if c.dashed else '"rounded,filled"'
        tip = f", tooltip={_q(c.tooltip)}" if c.tooltip else ""
        out.append(
            f"  {_q(c.key)} [width={cell_w / 72:.3f}, height={_CELL_H / 72:.3f}, "
            f'style={style}, fillcolor="{c.fill}", color="{c.border}", '
            f"penwidth={c.penwidth:g}, "
            f'label=<<FONT POINT-SIZE="9"><B>{_html(c.title)}</B></FONT>{detail}>'
            f"{tip}, {pos(x, y)}];"
        )
    for link in chart.links:
        src, dst = cells[link.src], cells[link.dst]
        if cell_xy(src)[0] != cell_xy(dst)[0]:
            continue  # in different bands: the cells name their peers
        arrow = "" if link.arrow else ", dir=none"
        out.append(
            f'  {_q(link.src)} -> {_q(link.dst)} [color="{link.color}", style={link.style}, '
            f"penwidth={link.penwidth:g}{arrow}];"
        )
    if chart.legend:
        y = -(bands * band_h) - 10
        out.append(
            f'  legend [shape=plaintext, style="", fixedsize=false, '
            f"label=<{_legend_html(chart.legend, 4 if right > 900 else 2)}>, "
            f"{pos(right / 2, y)}];"
        )
    out.append("}")
    return "\n".join(out) + "\n"


def _legend_html(entries: list[LegendEntry], per_row: int) -> str:
    """The legend as an HTML-like table: ``per_row`` (sample, text) pairs a row."""
    cells = []
    for e in entries:
        if e.line_style:
            dash = {"solid": "———", "dashed": "– – –", "dotted": "· · · ·"}.get(e.line_style, "———")
            sample = f'<TD><FONT COLOR="{e.border}"><B>{dash}</B></FONT></TD>'
        else:
            sample = (f'<TD BGCOLOR="{e.fill}" COLOR="{e.border}" BORDER="1" STYLE="rounded">'
                      f'<FONT POINT-SIZE="8"><B>{_html(e.sample)}</B></FONT></TD>')
        cells.append(sample + f'<TD ALIGN="LEFT"><FONT POINT-SIZE="8">{_html(e.text)}</FONT></TD>')
    rows = ["<TR>" + "".join(cells[i:i + per_row]) + "</TR>" for i in range(0, len(cells), per_row)]
    return ('<TABLE BORDER="0" CELLSPACING="4" CELLPADDING="2">'
            + "".join(rows) + "</TABLE>")
