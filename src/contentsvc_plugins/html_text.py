"""HTML reduced to plain text for connector items (decisions-part2: rss `body`, social_list
`body`): block elements become line breaks, scripts and styles vanish, entities are decoded,
runs of spaces collapse."""

from __future__ import annotations

import re
from html.parser import HTMLParser

_BLOCKS = {"address", "article", "blockquote", "br", "dd", "div", "dl", "dt", "figcaption", "footer", "h1", "h2",
           "h3", "h4", "h5", "h6", "header", "hr", "li", "ol", "p", "pre", "section", "table", "tr", "ul"}
_HIDDEN = {"script", "style", "template", "head"}
# A run of spaces and tabs becomes one space. A lone space is left alone rather than replaced by
# itself: it is most of the matches in prose, and replacing it was most of the time spent here.
_SPACES = re.compile(r" [ \t\r\f\v\u00a0]+|[\t\r\f\v\u00a0][ \t\r\f\v\u00a0]*")
_BREAKS = re.compile(r"\s*\n\s*")


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _HIDDEN:
            self.hidden += 1
        elif tag in _BLOCKS:
            self.chunks.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag in _BLOCKS:
            self.chunks.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.chunks.append(data)


def html_to_text(html: str) -> str:
    if "<" in html or "&" in html:  # markup or entities: parse; plain text (most feed titles) needs no parser
        collector = _Collector()
        collector.feed(html)
        collector.close()
        html = "".join(collector.chunks)
    html = _SPACES.sub(" ", html)
    return (_BREAKS.sub("\n", html) if "\n" in html else html).strip()
