"""The OCR plugin reads only what it may, only regular files, and never more than its limits.

Two halves. The extraction code (`pgtasks_ocr.extract_text`, `extract_mail`,
`read_document`) on files made here in ``tmp_path``: paths escaping the roots, a FIFO,
a socket, a directory, a PNG whose header claims 10000x10000 pixels in 200 bytes,
multi-frame images, PDFs with too many or too large pages, mail nested 500 levels deep.
Then the ``pgtasks.ocr`` task through a real worker on real PostgreSQL, where the
outcome claimed is the error code stored on the job.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from apps.pipeline_app import run_worker
from helpers import scratch_database
from PIL import Image, ImageDraw

import pgtasks
import pgtasks_ocr
import pgtasks_ocr.plugin
from pgtasks.errors import ConfigurationError, Reject
from pgtasks.states import JobStatus
from pgtasks_ocr import OcrLimits, extract_mail, extract_text, read_document, tesseract_available

needs_tesseract = pytest.mark.skipif(not tesseract_available(), reason="tesseract is not installed")


# --- files made for the tests ---------------------------------------------------------------


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` (8-bit gray) with almost no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(b"\x00" * (width + 1) * 4)  # four rows of the many promised
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def nested_multipart_mail(depth: int) -> bytes:
    """A mail whose body is ``depth`` multiparts, each inside the one before."""
    head = b"From: a@example.org\nTo: b@example.org\nSubject: deep\nMIME-Version: 1.0\n"
    opening = b"".join(
        b'Content-Type: multipart/mixed; boundary="b%d"\n\n--b%d\n' % (level, level) for level in range(depth)
    )
    closing = b"".join(b"\n--b%d--\n" % level for level in reversed(range(depth)))
    return head + opening + b"Content-Type: text/plain\n\nhello from the bottom\n" + closing


def nested_rfc822_mail(depth: int) -> bytes:
    """A mail that embeds a message that embeds a message ... ``depth`` times."""
    head = b"From: a@example.org\nTo: b@example.org\nSubject: deep\nMIME-Version: 1.0\n"
    return head + b"Content-Type: message/rfc822\n\n" * depth + b"Subject: inner\n\nhello\n"


def mail_with_parts(count: int) -> bytes:
    """A multipart/mixed mail with ``count`` small attachments."""
    parts = b"".join(
        b"--sep\nContent-Type: application/octet-stream\n"
        b'Content-Disposition: attachment; filename="a%d.bin"\n\nx\n' % index
        for index in range(count)
    )
    return (
        b"From: a@example.org\nTo: b@example.org\nSubject: many\nMIME-Version: 1.0\n"
        b'Content-Type: multipart/mixed; boundary="sep"\n\n'
        b"--sep\nContent-Type: text/plain\n\nsee the attachments\n" + parts + b"--sep--\n"
    )


def text_image(lines: list[str], size: tuple[int, int] = (900, 300)) -> Image.Image:
    image = Image.new("L", size, 255)
    draw = ImageDraw.Draw(image)
    for number, line in enumerate(lines):
        draw.text((30, 30 + 60 * number), line, fill=0, font_size=40)
    return image


def pdf_file(path: Path, pages: int, size: tuple[float, float] = (612, 792)) -> Path:
    document = pdfium.PdfDocument.new()
    for _ in range(pages):
        document.new_page(*size)
    document.save(path)
    document.close()
    return path


def unix_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def release_fifo(path: Path) -> None:
    """Give a reader blocked on the FIFO its end of file (the old code blocked there)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader: nobody is blocked
        return
    os.close(fd)


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """``root`` (the OCR root) with a readable file, and ``outside`` with a secret."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "ok.txt").write_text("inside the root\n", encoding="utf-8")
    (outside / "secret.txt").write_text("the secret outside\n", encoding="utf-8")
    return {"root": root, "outside": outside, "secret": outside / "secret.txt", "ok": root / "ok.txt"}


def refused(call: object, code: str) -> Reject:
    assert callable(call)
    with pytest.raises(Reject) as caught:
        call()
    assert caught.value.code == code, caught.value.reason
    return caught.value


# --- roots ------------------------------------------------------------------------------------


def test_a_file_inside_the_root_is_read(tree: dict[str, Path]) -> None:
    assert extract_text(tree["ok"], roots=[tree["root"]]).text == "inside the root"


def test_dot_dot_out_of_the_root_is_refused(tree: dict[str, Path]) -> None:
    escaping = f"{tree['root']}/../outside/secret.txt"
    assert Path(escaping).read_text(encoding="utf-8")  # the worker could read it
    error = refused(lambda: extract_text(escaping, roots=[tree["root"]]), "PATH_NOT_ALLOWED")
    assert "outside the OCR roots" in error.reason
    assert "the secret outside" not in error.reason  # the path, never the content


def test_an_absolute_path_elsewhere_is_refused(tree: dict[str, Path]) -> None:
    refused(lambda: extract_text(tree["secret"], roots=[tree["root"]]), "PATH_NOT_ALLOWED")
    refused(lambda: extract_text("/etc/passwd", roots=[tree["root"]]), "PATH_NOT_ALLOWED")


def test_a_missing_file_outside_the_root_is_refused_not_retried(tree: dict[str, Path]) -> None:
    # Refused before anything is opened: whether it exists is not revealed.
    refused(lambda: extract_text(tree["outside"] / "nope.txt", roots=[tree["root"]]), "PATH_NOT_ALLOWED")
    with pytest.raises(FileNotFoundError):  # inside the root: storage may come back, retried
        extract_text(tree["root"] / "nope.txt", roots=[tree["root"]])


def test_a_symlink_pointing_out_of_the_root_is_refused(tree: dict[str, Path]) -> None:
    link = tree["root"] / "link.txt"
    link.symlink_to(tree["secret"])
    refused(lambda: extract_text(link, roots=[tree["root"]]), "PATH_NOT_ALLOWED")
    folder = tree["root"] / "folder"
    folder.symlink_to(tree["outside"], target_is_directory=True)
    refused(lambda: extract_text(folder / "secret.txt", roots=[tree["root"]]), "PATH_NOT_ALLOWED")


def test_a_symlink_staying_inside_the_root_is_followed(tree: dict[str, Path]) -> None:
    link = tree["root"] / "alias.txt"
    link.symlink_to(tree["ok"])
    assert extract_text(link, roots=[tree["root"]]).text == "inside the root"


def test_no_root_configured_refuses_every_path(tree: dict[str, Path]) -> None:
    error = refused(lambda: extract_text(tree["ok"], roots=[]), "PATH_NOT_ALLOWED")
    assert "PGTASKS_OCR_ROOTS" in error.reason


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(
    tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check saw a plain folder (realpath answers as if no link were there); by the
    # time the file is opened, the folder is a link to elsewhere: O_NOFOLLOW refuses it.
    (tree["root"] / "folder").symlink_to(tree["outside"], target_is_directory=True)
    (tree["root"] / "late.txt").symlink_to(tree["secret"])
    monkeypatch.setattr(os.path, "realpath", os.path.abspath)
    for path in (tree["root"] / "folder" / "secret.txt", tree["root"] / "late.txt"):
        error = refused(lambda p=path: read_document(p, roots=[tree["root"]]), "PATH_NOT_ALLOWED")
        assert "replaced by a symbolic link" in error.reason


def test_a_path_with_nul_or_of_another_type_is_refused(tree: dict[str, Path]) -> None:
    refused(lambda: extract_text(f"{tree['ok']}\x00.txt", roots=[tree["root"]]), "PATH_NOT_ALLOWED")
    refused(lambda: read_document(42, roots=[tree["root"]]), "PATH_NOT_ALLOWED")  # type: ignore[arg-type]


# --- only regular files -------------------------------------------------------------------------


def test_a_fifo_is_refused_without_blocking(tree: dict[str, Path]) -> None:
    fifo = tree["root"] / "pipe.pdf"
    os.mkfifo(fifo)
    outcome: list[BaseException | object] = []

    def read() -> None:
        try:
            outcome.append(extract_text(fifo, roots=[tree["root"]]))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, name="fifo-reader")
    thread.start()
    thread.join(10)
    release_fifo(fifo)
    thread.join(10)
    assert outcome, "reading the FIFO blocked"
    assert isinstance(outcome[0], Reject) and outcome[0].code == "NOT_REGULAR_FILE", outcome
    assert "a FIFO" in outcome[0].reason
    # Without roots too (library use): O_NONBLOCK, then fstat.
    refused(lambda: extract_text(fifo), "NOT_REGULAR_FILE")


def test_a_directory_socket_or_device_is_refused(tree: dict[str, Path]) -> None:
    folder = tree["root"] / "folder.pdf"
    folder.mkdir()
    assert (
        "a directory"
        in refused(lambda: extract_text(folder, roots=[tree["root"]]), "NOT_REGULAR_FILE").reason
    )
    assert "a directory" in refused(lambda: extract_text(folder), "NOT_REGULAR_FILE").reason
    refused(lambda: extract_text(tree["root"], roots=[tree["root"]]), "NOT_REGULAR_FILE")
    sock_path = tree["root"] / "s.txt"
    with unix_socket(sock_path):
        assert (
            "a socket"
            in refused(lambda: extract_text(sock_path, roots=[tree["root"]]), "NOT_REGULAR_FILE").reason
        )
    assert (
        "a character device"
        in refused(lambda: extract_text("/dev/null", roots=["/dev"]), "NOT_REGULAR_FILE").reason
    )
    refused(lambda: extract_text("/dev/null"), "NOT_REGULAR_FILE")


# --- limits ---------------------------------------------------------------------------------------


def test_a_file_past_max_file_bytes_is_refused_before_it_is_read(tree: dict[str, Path]) -> None:
    sparse = tree["root"] / "big.txt"
    with sparse.open("wb") as handle:  # 101 MiB on paper, nothing on disk
        handle.truncate(101 * 1024 * 1024)
    started = time.monotonic()
    error = refused(lambda: extract_text(sparse, roots=[tree["root"]]), "FILE_TOO_LARGE")
    assert time.monotonic() - started < 1.0
    assert "max_file_bytes is 104,857,600" in error.reason
    small = OcrLimits(max_file_bytes=8)
    refused(lambda: extract_text(tree["ok"], limits=small), "FILE_TOO_LARGE")


def test_a_text_past_max_text_bytes_is_refused(tree: dict[str, Path]) -> None:
    error = refused(lambda: extract_text(tree["ok"], limits=OcrLimits(max_text_bytes=4)), "FILE_TOO_LARGE")
    assert "max_text_bytes" in error.reason


def test_an_image_header_past_max_image_pixels_is_refused_before_decoding(tree: dict[str, Path]) -> None:
    huge = tree["root"] / "huge.png"
    huge.write_bytes(png_header_only(10_000, 10_000))
    assert huge.stat().st_size < 1000
    with Image.open(huge) as image:
        assert image.size == (10_000, 10_000)
    started = time.monotonic()
    error = refused(lambda: extract_text(huge, roots=[tree["root"]]), "FILE_TOO_LARGE")
    assert time.monotonic() - started < 2.0  # decoding 100 million pixels would take longer
    assert "10000x10000" in error.reason and "max_image_pixels is 40,000,000" in error.reason


def test_max_image_pixels_is_a_setting(tree: dict[str, Path]) -> None:
    small = tree["root"] / "small.png"
    text_image(["tiny"], (200, 100)).save(small)
    error = refused(lambda: extract_text(small, limits=OcrLimits(max_image_pixels=19_999)), "FILE_TOO_LARGE")
    assert "200x100" in error.reason


def test_an_image_past_max_frames_is_refused_before_any_ocr(tree: dict[str, Path]) -> None:
    tiff = tree["root"] / "pages.tiff"
    frames = [text_image([f"page {n}"], (120, 60)) for n in range(3)]
    frames[0].save(tiff, save_all=True, append_images=frames[1:])
    error = refused(lambda: extract_text(tiff, limits=OcrLimits(max_frames=2)), "FILE_TOO_LARGE")
    assert "3 frames" in error.reason and "max_frames is 2" in error.reason
    gif = tree["root"] / "many.gif"
    colours = [Image.new("L", (2, 2), 255 * (n % 2)) for n in range(201)]
    colours[0].save(gif, save_all=True, append_images=colours[1:], duration=10, optimize=False)
    assert "max_frames is 200" in refused(lambda: extract_text(gif), "FILE_TOO_LARGE").reason


def test_a_pdf_past_max_pdf_pages_is_refused(tree: dict[str, Path]) -> None:
    pdf = pdf_file(tree["root"] / "three.pdf", 3)
    assert extract_text(pdf).pages == ("", "", "")
    error = refused(lambda: extract_text(pdf, limits=OcrLimits(max_pdf_pages=2)), "FILE_TOO_LARGE")
    assert "3 pages" in error.reason and "max_pdf_pages is 2" in error.reason


def test_a_pdf_page_too_large_to_render_is_refused(tree: dict[str, Path]) -> None:
    # 20000 x 20000 points (278 inches square) without text: it would have to be rendered.
    poster = pdf_file(tree["root"] / "poster.pdf", 1, (20_000, 20_000))
    error = refused(lambda: extract_text(poster), "FILE_TOO_LARGE")
    assert "page 1" in error.reason and "max_render_pixels is 40,000,000" in error.reason
    # A page that fits at a lower resolution is still rendered (and, blank, kept as it is).
    a4 = pdf_file(tree["root"] / "a4.pdf", 1)
    assert extract_text(a4, limits=OcrLimits(max_render_pixels=1_000_000)).pages == ("",)
    refused(lambda: extract_text(a4, limits=OcrLimits(max_render_pixels=400_000)), "FILE_TOO_LARGE")


def test_a_mail_past_max_mail_bytes_or_parts_is_refused(tree: dict[str, Path]) -> None:
    data = mail_with_parts(20)
    assert len(extract_mail(data).attachments) == 20
    error = refused(lambda: extract_mail(data, limits=OcrLimits(max_mail_bytes=100)), "FILE_TOO_LARGE")
    assert "max_mail_bytes is 100" in error.reason
    error = refused(lambda: extract_mail(data, limits=OcrLimits(max_mail_parts=10)), "FILE_TOO_LARGE")
    assert "max_mail_parts is 10" in error.reason
    many = tree["root"] / "many.eml"
    many.write_bytes(mail_with_parts(1100))
    assert "max_mail_parts is 1,000" in refused(lambda: extract_text(many), "FILE_TOO_LARGE").reason


# --- malformed input of any depth -------------------------------------------------------------------


@pytest.mark.parametrize("depth", [33, 500, 5000])
@pytest.mark.parametrize("make", [nested_multipart_mail, nested_rfc822_mail], ids=["multipart", "rfc822"])
def test_a_mail_nested_too_deep_is_malformed_not_a_recursion_error(
    tree: dict[str, Path], depth: int, make: object
) -> None:
    assert callable(make)
    path = tree["root"] / "deep.eml"
    path.write_bytes(make(depth))
    error = refused(lambda: extract_text(path, roots=[tree["root"]]), "MALFORMED_MAIL")
    assert "deep.eml" in error.reason and "max_mail_depth is 32" in error.reason


def test_a_mail_nested_within_the_limit_is_read(tree: dict[str, Path]) -> None:
    assert "hello from the bottom" in extract_mail(nested_multipart_mail(30)).body
    assert extract_mail(nested_rfc822_mail(30)).subject == "deep"


def test_header_comments_nested_too_deep_are_malformed(tree: dict[str, Path]) -> None:
    for header in (b"Content-Type: text/plain; charset=", b"From: "):
        data = header + b"(" * 5000 + b")" * 5000 + b" a@example.org\nTo: b@example.org\nSubject: s\n\nbody\n"
        assert "max_mail_depth" in refused(lambda d=data: extract_mail(d), "MALFORMED_MAIL").reason
    shallow = b"From: Ann (a (nested) comment) <a@example.org>\nTo: b@example.org\n\nbody\n"
    assert extract_mail(shallow).sender == "Ann <a@example.org>"


def _tiny_pdf(objects: list[bytes]) -> bytes:
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_pdfs_with_cycles_or_deep_nesting_fail_cleanly_or_read(tree: dict[str, Path]) -> None:
    # PDFium bounds these itself; what matters is a clean, documented outcome.
    catalog = b"<< /Type /Catalog /Pages 2 0 R >>"
    cyclic = tree["root"] / "cyclic.pdf"
    cyclic.write_bytes(
        _tiny_pdf(
            [
                catalog,
                b"<< /Type /Pages /Kids [2 0 R 3 0 R] /Count 2 >>",
                b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>",
            ]
        )
    )
    refused(lambda: extract_text(cyclic), "CORRUPT_FILE")
    nested = tree["root"] / "nested.pdf"
    deep = b"[" * 100_000 + b"]" * 100_000
    nested.write_bytes(
        _tiny_pdf(
            [
                catalog,
                b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Junk " + deep + b" >>",
            ]
        )
    )
    assert extract_text(nested).pages == ("",)


# --- settings and configuration ----------------------------------------------------------------------


def test_limits_and_roots_are_validated_naming_the_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGTASKS_OCR_ROOTS", raising=False)
    with pytest.raises(ConfigurationError, match="max_frames"):
        OcrLimits(max_frames=0)
    with pytest.raises(ConfigurationError, match="max_file_bytes"):
        OcrLimits(max_file_bytes=True)
    with pytest.raises(ConfigurationError, match="ocr_roots"):
        pgtasks.Settings(ocr_roots=(Path("relative"),))
    settings = pgtasks.Settings.from_env(
        environ={"PGTASKS_OCR_ROOTS": f"/srv/a{os.pathsep}{os.pathsep}/srv/b"}
    )
    assert settings.ocr_roots == (Path("/srv/a"), Path("/srv/b"))
    app = _ocr_app("postgresql:///unused")  # never connects
    with pytest.raises(ConfigurationError, match="absolute"):
        pgtasks_ocr.configure(app, roots=["relative"])
    with pytest.raises(ConfigurationError, match="time_limit"):
        pgtasks_ocr.configure(app, roots=[tmp_path], time_limit=-1)
    assert pgtasks_ocr.ocr_config(app).roots == ()  # nothing changed
    assert app.tasks["pgtasks.ocr"].options.time_limit == pgtasks_ocr.OCR_TIME_LIMIT


def test_the_ocr_task_has_a_default_time_limit_that_can_be_changed(tmp_path: Path) -> None:
    app = _ocr_app("postgresql:///unused")  # never connects
    task = app.tasks["pgtasks.ocr"]
    assert task.options.time_limit == pgtasks_ocr.OCR_TIME_LIMIT == 1800.0
    config = pgtasks_ocr.configure(app, roots=[tmp_path], time_limit=60, limits=OcrLimits(max_frames=3))
    assert task.options.time_limit == 60
    assert config.roots == (tmp_path,) and config.limits.max_frames == 3
    pgtasks_ocr.configure(app, time_limit=None)
    assert task.options.time_limit is None
    assert pgtasks_ocr.ocr_config(app).roots == (tmp_path,)  # left out: kept


# --- the task, through a real worker ---------------------------------------------------------------------


def _ocr_app(dsn: str) -> pgtasks.App:
    return pgtasks.App("ocr-inputs", dsn=dsn, load_entry_points=False, plugins=[pgtasks_ocr.plugin])


def _enqueue(app: pgtasks.App, path: str) -> int:
    return app.get_task("pgtasks.ocr").apply_async((path,), {"next_task": None}, tenant="acme").id


# Each case: the file made in the root (or how its path escapes) -> the error code stored.
TASK_CASES = {
    "dot-dot": "PATH_NOT_ALLOWED",
    "absolute-elsewhere": "PATH_NOT_ALLOWED",
    "symlink-out": "PATH_NOT_ALLOWED",
    "fifo": "NOT_REGULAR_FILE",
    "directory": "NOT_REGULAR_FILE",
    "huge-png-header": "FILE_TOO_LARGE",
    "mail-500-multiparts": "MALFORMED_MAIL",
    "mail-500-rfc822": "MALFORMED_MAIL",
    "mail-header-comments": "MALFORMED_MAIL",
}


@pytest.fixture(scope="module")
def task_run(
    admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[pgtasks.App, dict[str, int], int]]:
    """One worker run over every case; yields the app, the job of each case, and a good job."""
    base = tmp_path_factory.mktemp("ocr-task")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "ok.txt").write_text("inside the root\n", encoding="utf-8")
    (outside / "secret.txt").write_text("the secret outside\n", encoding="utf-8")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    os.mkfifo(root / "pipe.pdf")
    (root / "folder").mkdir()
    (root / "huge.png").write_bytes(png_header_only(10_000, 10_000))
    (root / "deep.eml").write_bytes(nested_multipart_mail(500))
    (root / "deep822.eml").write_bytes(nested_rfc822_mail(500))
    parens = b"Content-Type: text/plain; charset=" + b"(" * 5000 + b")" * 5000
    (root / "parens.eml").write_bytes(b"From: a@example.org\nTo: b@example.org\n" + parens + b"\n\nbody\n")
    paths = {
        "dot-dot": f"{root}/../outside/secret.txt",
        "absolute-elsewhere": str(outside / "secret.txt"),
        "symlink-out": str(root / "link.txt"),
        "fifo": str(root / "pipe.pdf"),
        "directory": str(root / "folder"),
        "huge-png-header": str(root / "huge.png"),
        "mail-500-multiparts": str(root / "deep.eml"),
        "mail-500-rfc822": str(root / "deep822.eml"),
        "mail-header-comments": str(root / "parens.eml"),
    }
    stack = contextlib.ExitStack()
    dsn = stack.enter_context(scratch_database(admin_dsn, template=template_db, prefix="pgtasks_ocri"))
    app = _ocr_app(dsn)
    try:
        pgtasks_ocr.configure(app, roots=[root])
        jobs = {case: _enqueue(app, path) for case, path in paths.items()}
        good = _enqueue(app, str(root / "ok.txt"))
        try:
            assert run_worker(app, timeout=120) == 0
        finally:
            release_fifo(root / "pipe.pdf")
        yield app, jobs, good
    finally:
        app.close()
        stack.close()


@pytest.mark.parametrize("case", sorted(TASK_CASES))
def test_the_task_fails_once_with_the_documented_code(
    task_run: tuple[pgtasks.App, dict[str, int], int], case: str
) -> None:
    app, jobs, _ = task_run
    job = app.get_job(jobs[case])
    assert job.status is JobStatus.FAILED, (case, job.status, job.result)
    assert job.error is not None
    assert job.error["code"] == TASK_CASES[case], job.error
    assert job.error["class"] == "permanent"
    assert len(job.attempts) == 1  # never retried
    assert "RecursionError" not in str(job.error)


def test_the_task_reads_a_file_inside_its_root(task_run: tuple[pgtasks.App, dict[str, int], int]) -> None:
    app, _, good = task_run
    job = app.get_job(good)
    assert job.status is JobStatus.SUCCEEDED, job.error
    assert job.result["text"] == "inside the root"


def test_the_task_refuses_everything_when_no_root_is_configured(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGTASKS_OCR_ROOTS", raising=False)
    readable = tmp_path / "readable.txt"
    readable.write_text("anyone may read this\n", encoding="utf-8")
    app = _ocr_app(dsn)
    try:
        assert pgtasks_ocr.ocr_config(app).roots == ()
        job_id = _enqueue(app, str(readable))
        assert run_worker(app, timeout=60) == 0
        job = app.get_job(job_id)
        assert job.status is JobStatus.FAILED and job.error is not None
        assert job.error["code"] == "PATH_NOT_ALLOWED"
        assert "no OCR root is configured" in job.error["message"]
    finally:
        app.close()


def test_the_task_reads_the_roots_of_the_settings(dsn: str, tmp_path: Path) -> None:
    readable = tmp_path / "readable.txt"
    readable.write_text("from the settings' root\n", encoding="utf-8")
    settings = pgtasks.Settings.from_env(dsn, environ={"PGTASKS_OCR_ROOTS": str(tmp_path)})
    app = pgtasks.App(
        "ocr-settings", settings=settings, load_entry_points=False, plugins=[pgtasks_ocr.plugin]
    )
    try:
        job_id = _enqueue(app, str(readable))
        assert run_worker(app, timeout=60) == 0
        job = app.get_job(job_id)
        assert job.status is JobStatus.SUCCEEDED, job.error
        assert job.result["text"] == "from the settings' root"
    finally:
        app.close()


@needs_tesseract
def test_a_job_past_its_time_limit_fails_with_time_limit(dsn: str, tmp_path: Path) -> None:
    scans = tmp_path / "scans.tiff"
    pages = [text_image([f"Page {n} of a long scan", "with several lines", "of text"]) for n in range(8)]
    pages[0].save(scans, save_all=True, append_images=pages[1:])
    app = _ocr_app(dsn)
    try:
        pgtasks_ocr.configure(app, roots=[tmp_path], time_limit=0.5)
        job_id = _enqueue(app, str(scans))
        assert run_worker(app, timeout=120) == 0
        job = app.get_job(job_id)
        assert job.status is JobStatus.FAILED, (job.status, job.result)
        assert job.error is not None and job.error["code"] == "TIME_LIMIT"
    finally:
        app.close()


def test_bytes_are_not_files() -> None:
    # extract_mail of bytes never touches the file system, so no root applies.
    assert extract_mail(b"From: a@example.org\n\nbody\n", roots=[]).sender == "a@example.org"


def test_the_mail_index_example_reads_only_inside_its_roots(dsn: str, tmp_path: Path) -> None:
    import sys

    repo = Path(__file__).resolve().parents[1]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from examples.mail_index.app import allow_folder, enqueue_mail, make_app

    inbox, elsewhere = tmp_path / "inbox", tmp_path / "elsewhere"
    inbox.mkdir()
    elsewhere.mkdir()
    message = b"From: carol@example.org\nTo: team@example.org\nSubject: Lunch\n\nLunch at noon?\n"
    (inbox / "lunch.eml").write_bytes(message)
    (elsewhere / "lunch.eml").write_bytes(message)
    (inbox / "deep.eml").write_bytes(nested_multipart_mail(500))
    app = make_app(dsn)
    try:
        app.migrate()
        allow_folder(app, inbox)
        jobs = {
            "inside": enqueue_mail(app, "alice", inbox / "lunch.eml"),
            "outside": enqueue_mail(app, "alice", elsewhere / "lunch.eml"),
            "deep": enqueue_mail(app, "alice", inbox / "deep.eml"),
        }
        assert run_worker(app, timeout=60) == 0
        outcome = {name: app.get_job(job_id) for name, job_id in jobs.items()}
        assert outcome["inside"].status is JobStatus.SUCCEEDED, outcome["inside"].error
        for name, code in (("outside", "PATH_NOT_ALLOWED"), ("deep", "MALFORMED_MAIL")):
            job = outcome[name]
            assert job.status is JobStatus.FAILED and job.error is not None, (name, job.status)
            assert job.error["code"] == code and len(job.attempts) == 1, job.error
    finally:
        app.close()


def test_names_in_messages_have_control_characters_escaped_and_are_cut(tree: dict[str, Path]) -> None:
    evil = tree["root"] / "clear\x1b[2J.pdf"
    os.mkfifo(evil)
    error = refused(lambda: extract_text(evil, roots=[tree["root"]]), "NOT_REGULAR_FILE")
    assert "\x1b" not in error.reason and "\\x1b[2J" in error.reason
    error = refused(lambda: extract_text("/" + "x" * 5000, roots=[tree["root"]]), "PATH_NOT_ALLOWED")
    assert len(error.reason) < 500
