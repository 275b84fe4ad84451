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
class Section:
    title: str
    blocks: list = field(default_factory=list)


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
            elif isinstance(block, Figure):
                out += [f"![{block.caption}]({block.path.as_posix()})", "", f"*{block.caption}*", ""]
    return "\n".join(out).rstrip() + "\n"


CSS = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f2f2f2} td:first-child,th:first-child{text-align:left}
figure{margin:1em 0 2em} img{max-width:100%} figcaption,.caption{color:#555;font-style:italic}
code{background:#f4f4f4;padding:0 .2em}
"""


def _inline(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _html_table(frame: pd.DataFrame) -> str:
    flat = frame.reset_index() if _named_index(frame) else frame
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in flat.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(fmt_cell(v))}</td>" for v in row) + "</tr>"
        for row in flat.itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def to_html(title: str, sections: list[Section], root: Path) -> str:
    """`root` is the folder the figure paths are relative to (read to embed them)."""
    out = [
        "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for section in sections:
        out.append(f"<h2>{html.escape(section.title)}</h2>")
        for block in section.blocks:
            if isinstance(block, Text):
                out.append(f"<p>{_inline(block.text)}</p>")
            elif isinstance(block, Table):
                out.append(f"<p class='caption'>{_inline(block.caption)}</p>{_html_table(block.frame)}")
            elif isinstance(block, Figure):
                src = png_data_uri(root / block.path)
                out.append(
                    f"<figure><img src='{src}' alt='{html.escape(block.caption)}'>"
                    f"<figcaption>{_inline(block.caption)}</figcaption></figure>"
                )
    out.append("</body></html>")
    return "\n".join(out) + "\n"
