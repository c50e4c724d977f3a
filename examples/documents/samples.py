"""Sample files for a machine without the shared corpus: a PDF, a scan, a mail, a text.

Each is made here, with no download: the PDF is written by hand (PDF 1.4, one page,
Helvetica text, so it has a text layer), the scan is text rendered by Pillow with
the grey background, noise and slight tilt of a real scan, the mail is an RFC 5322
message and the text file holds Cyrillic and Greek words.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Final

from PIL import Image, ImageDraw, ImageFilter, ImageFont

__all__ = ["SAMPLE_QUERIES", "make_samples"]

#: Queries the run prints when it uses these samples.
SAMPLE_QUERIES: Final = ("invoice", "quarterly report", "Привет", "Kalimera")

_PDF_LINES: Final = (
    "Invoice number: 2024-117",
    "Customer: Example Trading Ltd",
    "Consulting services, March: 1,200.00 EUR",
    "Total due within 30 days: 1,200.00 EUR",
)
_SCAN_LINES: Final = (
    "Quarterly report",
    "Revenue grew by twelve percent",
    "in the third quarter.",
)


def make_samples(folder: Path) -> list[Path]:
    """Write the sample files into ``folder`` (created if needed) and return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        _write_pdf(folder / "invoice.pdf", _PDF_LINES),
        _write_scan(folder / "quarterly-report-scan.png", _SCAN_LINES),
        _write_mail(folder / "meeting.eml"),
        _write_text(folder / "greetings.txt"),
    ]


def _write_pdf(path: Path, lines: tuple[str, ...]) -> Path:
    """A one-page PDF whose text is in its content stream (a real text layer)."""
    text_ops = ["BT", "/F1 14 Tf", "72 760 Td", "18 TL"]
    for line in lines:
        escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        text_ops.append(f"({escaped}) Tj T*")
    text_ops.append("ET")
    stream = "\n".join(text_ops).encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return path


def _write_scan(path: Path, lines: tuple[str, ...]) -> Path:
    """Text on a greyish page with speckles and a slight tilt, saved at 200 dpi."""
    rng = random.Random(7)  # the same image every time
    page = Image.new("L", (1400, 600), 235)
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=56)
    for number, line in enumerate(lines):
        draw.text((90, 90 + number * 130), line, fill=25, font=font)
    for _ in range(2500):
        x, y = rng.randrange(page.width), rng.randrange(page.height)
        page.putpixel((x, y), rng.choice((120, 170, 200)))
    page = page.rotate(0.6, resample=Image.Resampling.BICUBIC, fillcolor=235, expand=False)
    page = page.filter(ImageFilter.GaussianBlur(0.6))
    page.save(path, dpi=(200, 200))
    return path


def _write_mail(path: Path) -> Path:
    path.write_text(
        "From: Alice Example <alice@example.org>\n"
        "To: Bob Example <bob@example.org>\n"
        "Subject: Planning meeting on Thursday\n"
        "Date: Tue, 04 Mar 2025 09:30:00 +0100\n"
        "Message-ID: <planning-2025-03-04@example.org>\n"
        "Content-Type: text/plain; charset=utf-8\n"
        "\n"
        "Hi Bob,\n\nlet us go through the quarterly report and the open invoice on Thursday.\n\nAlice\n",
        encoding="utf-8",
    )
    return path


def _write_text(path: Path) -> Path:
    path.write_text(
        "Greetings in several scripts.\nRussian: Привет, как дела?\nGreek: Καλημέρα (Kalimera)\n",
        encoding="utf-8",
    )
    return path
