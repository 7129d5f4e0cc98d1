"""Small valid PDFs written by hand (Helvetica text on each page, a /Title, a correct
cross-reference table): what the plugin suite feeds the pdf normalizer, made here so the
bench needs no files and every copy can differ by its text."""

from __future__ import annotations

import zlib


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def make_pdf(pages: list[list[str]], title: str | None = None, compress: bool = False) -> bytes:
    """`compress` writes the page contents as FlateDecode streams, as most PDFs in use do."""
    objects: list[bytes] = []  # object n is objects[n - 1]
    page_ids = [4 + 2 * i for i in range(len(pages))]
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % n for n in page_ids)
                   + b"] /Count %d >>" % len(pages))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, lines in enumerate(pages):
        stream = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({_escape(line)}) Tj T*" for line in lines) + " ET"
        content = stream.encode("latin-1")
        content, filter_entry = (zlib.compress(content), b" /Filter /FlateDecode") if compress else (content, b"")
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >>"
                       b" /Contents %d 0 R >>" % (page_ids[i] + 1))
        objects.append(b"<< /Length %d%s >>\nstream\n" % (len(content), filter_entry) + content + b"\nendstream")
    info_id = None
    if title is not None:
        objects.append(b"<< /Title (" + _escape(title).encode("latin-1") + b") /Producer (contentsvc) >>")
        info_id = len(objects)
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    trailer = b"<< /Size %d /Root 1 0 R" % (len(objects) + 1) + (b" /Info %d 0 R" % info_id if info_id else b"") + b" >>"
    out += b"trailer\n" + trailer + b"\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def tiny_pdf(lines: list[str], title: str) -> bytes:
    """One page of text lines with a /Title."""
    return make_pdf([lines], title)


def report_lines(n: int) -> tuple[list[str], str]:
    """The text of the n-th bench PDF (a few short lines, different for every n) and its title."""
    return ([f"Field report {n}", f"Crane {n % 7} inspected; bearings {n % 5} replaced.",
             "Next inspection in the spring."], f"Bench report {n}")
