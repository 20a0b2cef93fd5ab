"""The report page's HTML pieces: sections, tables, folded tables, cells."""

from __future__ import annotations

from html import escape
from typing import Any


def section(ident: str, title: str, body: str) -> str:
    return f'<section id="{ident}"><h2>{escape(title)}</h2>{body}</section>'


def table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return (f"<table>{f'<thead><tr>{head}</tr></thead>' if head else ''}"
            f"<tbody>{body}</tbody></table>")


def folded(table: str) -> str:
    return f"<details><summary>as a table</summary>{table}</details>"


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)
