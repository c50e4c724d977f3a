"""HTML to plain text with the standard library's `html.parser`, for HTML-only mails."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Final

__all__ = ["html_to_text"]

# Elements whose content is not text a reader sees.
_HIDDEN: Final = frozenset({"head", "script", "style", "template", "title"})
# Elements that start a new line (the block-level and line-breaking ones of HTML).
_BREAKS: Final = frozenset(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "br",
        "dd",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "pre",
        "section",
        "table",
        "td",
        "th",
        "tr",
        "ul",
    ]
)
_SPACES_RE: Final = re.compile(r"[ \t\r\f\v\u00a0]+")
_BLANK_LINES_RE: Final = re.compile(r"\n{3,}")


class _TextCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self._hidden_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self._hidden_depth = 0  # an unclosed <head> ends where <body> starts
        elif tag in _HIDDEN:
            self._hidden_depth += 1
        elif tag in _BREAKS:
            self.chunks.append("\n")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BREAKS:
            self.chunks.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN:
            self._hidden_depth = max(0, self._hidden_depth - 1)
        elif tag in _BREAKS:
            self.chunks.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._hidden_depth:
            self.chunks.append(_SPACES_RE.sub(" ", data.replace("\n", " ")))


def html_to_text(html: str) -> str:
    """Return the visible text of an HTML document or fragment.

    Tags are dropped; entities are decoded; ``head``, ``script``, ``style``, ``template``
    and ``title`` content is skipped; block elements and ``<br>`` start new lines; runs of
    spaces collapse to one and more than one blank line to one. Malformed HTML never
    raises: `html.parser` is lenient, as browsers are.
    """
    collector = _TextCollector()
    collector.feed(html)
    collector.close()
    lines = (line.strip() for line in "".join(collector.chunks).split("\n"))
    return _BLANK_LINES_RE.sub("\n\n", "\n".join(lines)).strip()
