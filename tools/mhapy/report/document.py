"""A report as a list of blocks, rendered once to Markdown and once to self-contained HTML.

Inline markup in text: `code` and **bold** (the subset both renderers understand).
"""

from __future__ import annotations

import base64
import html
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Code:
    """Lines shown as written (a command to repeat a run), in a fixed-width font."""

    text: str


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    # Columns aligned right (numbers); the others left.
    numeric: set[int] = field(default_factory=set)


@dataclass
class Figure:
    """A figure written as <stem>.png (and <stem>.svg with the HTML) in the report folder."""

    stem: str
    caption: str


Block = Heading | Para | Bullets | Code | Table | Figure


def parse_notes(text: str, top_level: int) -> list[Block]:
    """Blocks of a notes file, in the subset of Markdown the renderers share: blank-line
    separated paragraphs, "- " bullet lists (as in CommonMark, a list may start right under a
    paragraph's line; an item's wrapped lines continue it), "|" tables (a header row, then the
    "|---|" row whose "---:" cells mark numeric columns, then the rows), "#" headings (level
    shifted so that "#" becomes top_level) and code, fenced by lines of "```" or indented by 4
    spaces after a blank line, kept line for line. Inline `code` and **bold** pass through."""
    blocks: list[Block] = []
    # Fenced code first: its lines, blank ones included, are not the paragraphs' to reflow.
    for i, part in enumerate(re.split(r"^```[^\n]*\n", text.strip() + "\n", flags=re.MULTILINE)):
        if i % 2:
            blocks.append(Code(part.rstrip("\n")))
        else:
            blocks += _prose_blocks(part, top_level)
    return blocks


def _prose_blocks(text: str, top_level: int) -> list[Block]:
    blocks: list[Block] = []
    for chunk in re.split(r"\n\s*\n", text.strip("\n")):
        lines = [line for line in chunk.splitlines() if line.strip()]
        if lines and all(line.startswith(("    ", "\t")) for line in lines):
            code = textwrap.dedent(chunk)
            if blocks and isinstance(blocks[-1], Code):  # a blank line inside the code
                blocks[-1].text += "\n\n" + code
            else:
                blocks.append(Code(code))
            continue
        # Runs of lines of one kind: heading (one line each), table, bullets or paragraph.
        runs: list[tuple[str, list[str]]] = []
        for line in (line.strip() for line in chunk.splitlines() if line.strip()):
            if re.match(r"^#+\s", line):
                kind = "heading"
            elif line.startswith("|"):
                kind = "table"
            elif line.startswith("- "):
                kind = "bullets"
            else:  # a paragraph, or the wrapped continuation of a list item
                kind = runs[-1][0] if runs and runs[-1][0] in ("bullets", "para") else "para"
            if runs and runs[-1][0] == kind and kind != "heading":
                runs[-1][1].append(line)
            else:
                runs.append((kind, [line]))
        blocks += [_notes_block(kind, lines, top_level) for kind, lines in runs]
    return blocks


def _notes_block(kind: str, lines: list[str], top_level: int) -> Block:
    if kind == "heading":
        marks, title = lines[0].split(maxsplit=1)
        return Heading(top_level + len(marks) - 1, title)
    if kind == "bullets":
        items: list[str] = []
        for line in lines:
            if line.startswith("- "):
                items.append(line[2:].strip())
            else:
                items[-1] += " " + line
        return Bullets(items)
    if kind == "table":
        rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
        if len(rows) > 1 and all(re.fullmatch(r":?-+:?", cell) for cell in rows[1]):
            numeric = {i for i, cell in enumerate(rows[1]) if cell.endswith(":")}
            return Table(rows[0], rows[2:], numeric)
        return Table(rows[0], rows[1:])
    return Para(" ".join(lines))


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block], svg: bool = False) -> str:
    """The blocks as Markdown; each figure its PNG, and a link to its SVG when written (svg)."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Code):
            out.append(f"```\n{b.text}\n```")
        elif isinstance(b, Table):
            align = ["---:" if i in b.numeric else "---" for i in range(len(b.headers))]
            lines = [
                "| " + " | ".join(_md_cell(h) for h in b.headers) + " |",
                "| " + " | ".join(align) + " |",
            ]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("\n".join(lines))
        elif isinstance(b, Figure):
            link = f" ([SVG]({b.stem}.svg))" if svg else ""
            out.append(f"![{b.caption}]({b.stem}.png)\n\n*{b.caption}*{link}")
    return "\n\n".join(out) + "\n"


def _inline_html(text: str) -> str:
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { background: #f4f4f4; padding: 0 0.2em; }
figure { margin: 1.2em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-style: italic; color: #555; }
"""


def to_html(blocks: list[Block], title: str, folder: Path) -> str:
    """Self-contained HTML: figures embedded as base64 PNG read from `folder`."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
    ]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{_inline_html(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            out.append(f"<p>{_inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Code):
            out.append(f"<pre><code>{html.escape(b.text, quote=False)}</code></pre>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_inline_html(h)}</th>" for h in b.headers)
            body = "".join(
                "<tr>"
                + "".join(
                    f'<td class="num">{_inline_html(c)}</td>'
                    if i in b.numeric
                    else f"<td>{_inline_html(c)}</td>"
                    for i, c in enumerate(row)
                )
                + "</tr>"
                for row in b.rows
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(b, Figure):
            data = base64.b64encode((folder / f"{b.stem}.png").read_bytes()).decode("ascii")
            out.append(
                f'<figure><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_inline_html(b.caption)}</figcaption></figure>"
            )
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write(blocks: list[Block], title: str, folder: Path, with_html: bool = False) -> None:
    """Writes report.md, and with_html report.html (figures inlined) and links to the figures'
    SVGs, into folder (the figures must already be there)."""
    (folder / "report.md").write_text(to_markdown(blocks, svg=with_html), encoding="utf-8")
    if with_html:
        (folder / "report.html").write_text(to_html(blocks, title, folder), encoding="utf-8")
