"""Render report sections to Markdown and to one self-contained HTML file (the PNGs are
embedded as base64 data URIs, so the HTML can be mailed or attached as it is)."""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class Text:
    text: str


@dataclass
class Table:
    caption: str
    frame: pd.DataFrame


@dataclass
class Figure:
    caption: str
    path: Path  # relative to the report folder


@dataclass
class Row:
    blocks: list  # Figures shown side by side in HTML, one after another in Markdown


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)
    collapsed: bool = False  # HTML: inside <details> (the long per-run tables)


def fmt_cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.4g}"
    if value is None:
        return "n/a"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    flat = frame.reset_index() if _named_index(frame) else frame
    header = [str(c) for c in flat.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in flat.itertuples(index=False):
        cells = [fmt_cell(v).replace("|", "\\|") for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _named_index(frame: pd.DataFrame) -> bool:
    return any(name is not None for name in frame.index.names)


def to_markdown(title: str, sections: list[Section]) -> str:
    out = [f"# {title}", ""]
    for section in sections:
        out += [f"## {section.title}", ""]
        for block in section.blocks:
            if isinstance(block, Text):
                out += [block.text, ""]
            elif isinstance(block, Table):
                out += [f"*{block.caption}*", "", markdown_table(block.frame), ""]
            elif isinstance(block, (Figure, Row)):
                for fig in block.blocks if isinstance(block, Row) else [block]:
                    out += [f"![{fig.caption}]({fig.path.as_posix()})", "", f"*{fig.caption}*", ""]
    return "\n".join(out).rstrip() + "\n"


# Nothing may scroll sideways at 1280 px: tables take at most the page width and wrap
# anywhere (long run names, paths, headers); tables wider than MAX_COLUMNS are split into
# column blocks (each repeating the row labels) instead of shrinking past legibility.
CSS = """
body{font-family:system-ui,sans-serif;max-width:1180px;margin:1.5em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.4em 0 1.2em;font-size:.8em;max-width:100%}
th,td{border:1px solid #ccc;padding:.2em .45em;text-align:right;overflow-wrap:anywhere}
th{background:#f2f2f2;font-weight:600;overflow-wrap:break-word} td:first-child,th:first-child{text-align:left}
figure{margin:.8em 0 1.6em} img{max-width:100%;height:auto}
figcaption,.caption{color:#555;font-style:italic;font-size:.9em}
p,li,figcaption,.caption,summary{overflow-wrap:anywhere}
code{background:#f4f4f4;padding:0 .2em;overflow-wrap:anywhere}
details{margin:.5em 0;border-top:1px solid #ddd} summary{cursor:pointer;font-weight:600;padding:.4em 0}
.lead{display:flex;flex-wrap:wrap;gap:1em} .lead>figure{flex:1 1 520px;margin:0}
"""
MAX_COLUMNS = 10


def _inline(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _breakable(name: str) -> str:
    """A header that may wrap after `_` and `/` (toy_text_contrast, dataset/metric), so
    headers break between words, not inside "GenEval"."""
    return re.sub(r"([_/])", r"\1<wbr>", html.escape(name))


def column_blocks(frame: pd.DataFrame, limit: int = MAX_COLUMNS) -> list[pd.DataFrame]:
    """The frame split into blocks of at most `limit` columns, each starting with the
    row labels (the named index, else the first column), so a wide table fits the page."""
    flat = frame.reset_index() if _named_index(frame) else frame
    if flat.shape[1] <= limit:
        return [flat]
    keys = list(flat.columns[:frame.index.nlevels if _named_index(frame) else 1])
    rest = [c for c in flat.columns if c not in keys]
    step = max(1, limit - len(keys))
    return [flat[keys + rest[i:i + step]] for i in range(0, len(rest), step)]


def _html_table(frame: pd.DataFrame) -> str:
    return "".join(_one_html_table(block) for block in column_blocks(frame))


def _one_html_table(flat: pd.DataFrame) -> str:
    head = "".join(f"<th>{_breakable(str(c))}</th>" for c in flat.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(fmt_cell(v))}</td>" for v in row) + "</tr>"
        for row in flat.itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _html_block(block, root: Path) -> str:
    if isinstance(block, Text):
        return f"<p class='text'>{_inline(block.text)}</p>"
    if isinstance(block, Table):
        return f"<p class='caption'>{_inline(block.caption)}</p>{_html_table(block.frame)}"
    if isinstance(block, Figure):
        src = png_data_uri(root / block.path)
        return (f"<figure><img src='{src}' alt='{html.escape(block.caption)}'>"
                f"<figcaption>{_inline(block.caption)}</figcaption></figure>")
    if isinstance(block, Row):  # figures side by side (the headline bars)
        return "<div class='lead'>" + "".join(_html_block(b, root) for b in block.blocks) + "</div>"
    raise TypeError(f"unknown report block {type(block).__name__}")


def to_html(title: str, sections: list[Section], root: Path) -> str:
    """`root` is the folder the figure paths are relative to (read to embed them)."""
    out = [
        "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for section in sections:
        body = "\n".join(_html_block(b, root) for b in section.blocks)
        if section.collapsed:
            out.append(f"<details><summary>{html.escape(section.title)}</summary>\n{body}</details>")
        else:
            out.append(f"<h2>{html.escape(section.title)}</h2>\n{body}")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
