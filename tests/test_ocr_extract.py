"""Text extraction of the built-in OCR plugin, on the real files of the shared corpus.

Every file in ``corpus/documents`` (and ``documents/mail``) is checked against the right
result its README gives. No database is involved. The corpus is found at
``<repo>/../shared/corpus`` or at ``$PGTASKS_CORPUS_DIR``; the tests skip if it is absent.
OCR tests skip only when the ``tesseract`` program is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from email.message import EmailMessage
from pathlib import Path

import pypdfium2 as pdfium
import pytest

from pgtasks.errors import Reject
from pgtasks_ocr import (
    ExtractedText,
    MailMessage,
    OcrUnavailable,
    extract_mail,
    extract_text,
    normalise_message_id,
    sniff_mime,
    tesseract_available,
    tesseract_version,
)

CORPUS = Path(
    os.environ.get("PGTASKS_CORPUS_DIR") or Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
)
DOCS = CORPUS / "documents"
MAIL = DOCS / "mail"

needs_tesseract = pytest.mark.skipif(
    not tesseract_available(),
    reason="tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng tesseract-ocr-deu)",
)

SHARED_MESSAGE_ID = "15090.61304.110929.45684@aaa.zzz.org"
CONTROL_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


@pytest.fixture(scope="module", autouse=True)
def _corpus_present() -> None:
    if not DOCS.is_dir():
        pytest.skip(f"corpus not found at {CORPUS} (set PGTASKS_CORPUS_DIR)")


def doc(name: str) -> Path:
    return DOCS / name


def mail(name: str) -> Path:
    return MAIL / name


def assert_in_order(text: str, *needles: str) -> None:
    positions = [text.find(needle) for needle in needles]
    assert all(position >= 0 for position in positions), (needles, positions)
    assert positions == sorted(positions), (needles, positions)


def assert_clean(result: ExtractedText) -> None:
    """What the index stores: no NUL or other control characters, text = pages joined."""
    assert not CONTROL_CHARS.search(result.text)
    assert result.text == "\n\n".join(page for page in result.pages if page)


# --- PDFs --------------------------------------------------------------------------------


def test_simple_pdf_uses_its_text_layer() -> None:
    result = extract_text(doc("simple.pdf"))
    assert "This is a test document." in result.text
    assert (result.method, result.mime, len(result.pages)) == ("text-layer", "application/pdf", 1)
    assert_clean(result)


def test_multi_page_digital_pdf_keeps_page_order() -> None:
    result = extract_text(doc("multi-page-digital.pdf"))
    assert result.method == "text-layer"
    assert len(result.pages) == 3
    for number, page in enumerate(result.pages, start=1):
        assert f"Page {number}" in page
        assert all(f"Page {other}" not in page for other in (1, 2, 3) if other != number)
    assert_in_order(result.text, "Page 1", "Page 2", "Page 3")
    assert_clean(result)


@needs_tesseract
def test_multi_page_image_pdf_is_ocrd_in_page_order() -> None:
    result = extract_text(doc("multi-page-images.pdf"))
    assert result.method == "ocr"
    assert len(result.pages) == 3
    for number, page in enumerate(result.pages, start=1):
        assert f"Page {number}" in page, page
    assert_in_order(result.text, "Page 1", "Page 2", "Page 3")
    assert_clean(result)


def test_libtasn1_manual() -> None:
    result = extract_text(doc("libtasn1.pdf"))
    assert "Abstract Syntax Notation One" in result.text
    assert (result.method, len(result.pages)) == ("text-layer", 36)
    # PDFium marks line-end hyphens with U+0002; the word must come back whole.
    assert "manipulation" in result.text
    assert_clean(result)


def test_shared_mime_info_spec() -> None:
    result = extract_text(doc("shared-mime-info-spec.pdf"))
    assert "Shared MIME-info Database" in result.text
    assert (result.method, len(result.pages)) == ("text-layer", 17)
    assert_clean(result)


def test_invalid_pdf_is_recovered() -> None:
    assert not doc("invalid_pdf.pdf").read_bytes().startswith(b"%PDF")  # junk before the header
    result = extract_text(doc("invalid_pdf.pdf"))
    assert "Invoice number: 123456" in result.text
    assert (result.mime, len(result.pages)) == ("application/pdf", 2)
    assert "Page 2 of 2" in result.pages[1]
    assert_clean(result)


def test_encrypted_pdf_without_password_is_rejected_permanently() -> None:
    with pytest.raises(Reject) as caught:
        extract_text(doc("password-is-test.pdf"))
    assert caught.value.code == "ENCRYPTED_PDF"
    assert "password" in str(caught.value)
    assert "password-is-test.pdf" in str(caught.value)


def test_encrypted_pdf_with_wrong_password_is_rejected() -> None:
    with pytest.raises(Reject) as caught:
        extract_text(doc("password-is-test.pdf"), password="not-it")
    assert caught.value.code == "ENCRYPTED_PDF"
    assert "wrong" in str(caught.value)


def test_encrypted_pdf_with_password_is_readable() -> None:
    result = extract_text(doc("password-is-test.pdf"), password="test")
    assert "Password Protected PDF test" in result.text
    assert result.method == "text-layer"


@needs_tesseract
def test_pdf_with_digital_and_scanned_pages_is_mixed(tmp_path: Path) -> None:
    target = tmp_path / "mixed.pdf"
    combined = pdfium.PdfDocument.new()
    with (
        pdfium.PdfDocument(doc("simple.pdf")) as digital,
        pdfium.PdfDocument(doc("multi-page-images.pdf")) as scan,
    ):
        combined.import_pages(digital)
        combined.import_pages(scan, [1])  # the scan of "Page 2"
    combined.save(target)
    combined.close()

    result = extract_text(target)
    assert result.method == "mixed"
    assert len(result.pages) == 2
    assert "This is a test document." in result.pages[0]
    assert "Page 2" in result.pages[1]
    assert_clean(result)


# --- images ------------------------------------------------------------------------------


@needs_tesseract
@pytest.mark.parametrize(
    ("name", "mime"),
    [("simple.png", "image/png"), ("simple.jpg", "image/jpeg"), ("simple.tiff", "image/tiff")],
)
def test_scanned_image_is_ocrd(name: str, mime: str) -> None:
    result = extract_text(doc(name))
    assert "This is a test document." in result.text
    assert (result.method, result.mime, len(result.pages)) == ("ocr", mime, 1)
    assert_clean(result)


@needs_tesseract
def test_multi_page_tiff_gives_one_page_per_frame(tmp_path: Path) -> None:
    with pdfium.PdfDocument(doc("multi-page-images.pdf")) as scan:
        frames = [scan[index].render(scale=200 / 72, grayscale=True).to_pil().copy() for index in range(3)]
    target = tmp_path / "three.tiff"
    frames[0].save(
        target, save_all=True, append_images=frames[1:], compression="tiff_deflate", dpi=(200, 200)
    )

    result = extract_text(target)
    assert (result.method, result.mime, len(result.pages)) == ("ocr", "image/tiff", 3)
    for number, page in enumerate(result.pages, start=1):
        assert f"Page {number}" in page, page


@needs_tesseract
def test_type_comes_from_content_not_name(tmp_path: Path) -> None:
    renamed = tmp_path / "upload.bin"
    shutil.copyfile(doc("simple.png"), renamed)
    assert extract_text(renamed).mime == "image/png"
    misnamed = tmp_path / "scan.pdf"
    shutil.copyfile(doc("simple.jpg"), misnamed)
    result = extract_text(misnamed)
    assert result.mime == "image/jpeg"
    assert "This is a test document." in result.text


def test_pdf_without_suffix_is_still_a_pdf(tmp_path: Path) -> None:
    target = tmp_path / "document"
    shutil.copyfile(doc("simple.pdf"), target)
    assert extract_text(target).mime == "application/pdf"


# --- plain text --------------------------------------------------------------------------


def test_simple_txt() -> None:
    result = extract_text(doc("simple.txt"))
    assert result.text == "This is a test file."
    assert (result.method, result.mime, result.pages) == ("plain", "text/plain", ("This is a test file.",))


def test_content_txt_keeps_every_script() -> None:
    result = extract_text(doc("content.txt"))
    assert result.method == "plain"
    for word in (
        "Привет",
        "Ωμέγα",
        "مرحبًا",
        "שלום",
        "你好",
        "歡迎",
        "東京",
        "カタカナ",
        "안녕하세요",
        "🐍",
        "àâäæç",
    ):
        assert word in result.text, word
    assert_clean(result)


def test_legacy_encoded_text_falls_back_to_windows_1252(tmp_path: Path) -> None:
    target = tmp_path / "legacy.txt"
    target.write_bytes("Grüße \u2013 5 €".encode("cp1252"))
    assert extract_text(target).text == "Grüße \u2013 5 €"


def test_utf16_text_with_bom(tmp_path: Path) -> None:
    target = tmp_path / "utf16.txt"
    target.write_bytes("Привет\r\nworld".encode("utf-16"))
    assert extract_text(target).text == "Привет\nworld"


# --- failures ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("truncated.pdf", lambda: doc("simple.pdf").read_bytes()[:15000]),
        ("garbage.pdf", lambda: b"%PDF-1.4\n" + bytes(range(256)) * 8),
        ("not-really.pdf", lambda: b"<html>404 Not Found</html>"),
        ("empty.pdf", lambda: b""),
        ("truncated.png", lambda: doc("simple.png").read_bytes()[:3000]),
        ("truncated.jpg", lambda: doc("simple.jpg").read_bytes()[:5000]),
    ],
)
def test_corrupt_files_are_rejected(tmp_path: Path, name: str, content: Callable[[], bytes]) -> None:
    target = tmp_path / name
    target.write_bytes(content())
    if target.suffix in (".png", ".jpg") and not tesseract_available():
        pytest.skip("image decoding runs after the Tesseract check")
    with pytest.raises(Reject) as caught:
        extract_text(target)
    assert caught.value.code == "CORRUPT_FILE", caught.value
    assert name in str(caught.value)


def test_unknown_binary_is_unsupported(tmp_path: Path) -> None:
    target = tmp_path / "archive.xyz"
    target.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    with pytest.raises(Reject) as caught:
        extract_text(target)
    assert caught.value.code == "UNSUPPORTED_TYPE"


def test_missing_file_is_not_a_permanent_rejection(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        extract_text(tmp_path / "gone.pdf")


def test_malformed_languages_are_refused() -> None:
    with pytest.raises(ValueError, match="languages"):
        extract_text(doc("simple.pdf"), languages="eng;rm -rf")


@needs_tesseract
def test_missing_languages_are_dropped_or_refused() -> None:
    assert "This is a test document." in extract_text(doc("simple.png"), languages="eng+xyzzy").text
    with pytest.raises(OcrUnavailable) as caught:
        extract_text(doc("simple.png"), languages="xyzzy")
    assert "tesseract-ocr-xyzzy" in str(caught.value)


# --- Tesseract presence ------------------------------------------------------------------


@needs_tesseract
def test_tesseract_version_is_reported() -> None:
    version = tesseract_version()
    assert version is not None
    assert re.match(r"^\d+\.\d+", version), version


@pytest.fixture
def no_tesseract(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A PATH on which no tesseract can be found."""
    monkeypatch.setenv("PATH", str(tmp_path))
    yield


@pytest.mark.usefixtures("no_tesseract")
def test_without_tesseract_image_ocr_says_how_to_install() -> None:
    assert not tesseract_available()
    assert tesseract_version() is None
    with pytest.raises(OcrUnavailable) as caught:
        extract_text(doc("simple.png"))
    assert isinstance(caught.value, Reject)
    assert caught.value.code == "OCR_UNAVAILABLE"
    assert "apt-get install tesseract-ocr tesseract-ocr-eng" in str(caught.value)
    with pytest.raises(OcrUnavailable):
        extract_text(doc("multi-page-images.pdf"))


@pytest.mark.usefixtures("no_tesseract")
def test_without_tesseract_digital_pdfs_still_work() -> None:
    assert "This is a test document." in extract_text(doc("simple.pdf")).text


# --- mails -------------------------------------------------------------------------------

MAIL_FILES = sorted(path.name for path in MAIL.glob("*.eml")) if MAIL.is_dir() else []
GOOD_MAIL_FILES = [name for name in MAIL_FILES if name != "broken.eml"]


def test_the_corpus_mails_are_all_covered() -> None:
    assert len(MAIL_FILES) == 15
    assert "broken.eml" in MAIL_FILES


@pytest.mark.parametrize("name", GOOD_MAIL_FILES)
def test_every_mail_parses(name: str) -> None:
    message = extract_mail(mail(name))
    assert isinstance(message, MailMessage)
    assert message.date is None or message.date.tzinfo is not None
    for text in (message.subject, message.sender, message.body, *message.recipients):
        assert text is None or not re.search("[\x00\ud800-\udfff]", text), text
    result = extract_text(mail(name))
    assert (result.method, result.mime, len(result.pages)) == ("mail", "message/rfc822", 1)
    assert result.text == message.to_text()
    assert_clean(result)


@pytest.mark.parametrize("name", GOOD_MAIL_FILES)
def test_mails_are_recognised_by_content(name: str) -> None:
    assert sniff_mime(mail(name).read_bytes()[:8192]) == "message/rfc822"


def test_broken_eml_is_rejected_as_malformed() -> None:
    assert sniff_mime(mail("broken.eml").read_bytes()) == "text/plain"  # it is one line of prose
    for source in (mail("broken.eml"), mail("broken.eml").read_bytes()):
        with pytest.raises(Reject) as caught:
            extract_mail(source)
        assert caught.value.code == "MALFORMED_MAIL"
        assert "no header" in str(caught.value)
    with pytest.raises(Reject) as caught:
        extract_text(mail("broken.eml"))
    assert caught.value.code == "MALFORMED_MAIL"


def test_three_messages_share_one_message_id() -> None:
    ids = {
        name: extract_mail(mail(name)).message_id
        for name in ("python-msg_01.eml", "python-msg_03.eml", "python-msg_20.eml")
    }
    assert set(ids.values()) == {SHARED_MESSAGE_ID}
    others = {extract_mail(mail(name)).message_id for name in GOOD_MAIL_FILES} - {SHARED_MESSAGE_ID, None}
    assert others == {
        "da0c12c1-58c3-4f3d-ab89-9ae04@domain.de",
        "20010803162810.0CA8AA7ACC@mail.example.com",
        "xxxx",
        "200104061723.JAB03225@zinfandel.lacita.com",
        "6e99e34d-e20a-80c4-ea61-d8234b612be9@someserver.de",
    }


@pytest.mark.parametrize(
    "name",
    ["python-msg_02.eml", "python-msg_10.eml", "python-msg_12.eml", "python-msg_30.eml", "python-msg_35.eml"],
)
def test_missing_message_id_is_none(name: str) -> None:
    assert extract_mail(mail(name)).message_id is None


def test_umlaut_mail_is_decoded() -> None:
    message = extract_mail(mail("eml_with_umlaut.eml"))
    assert message.subject == "No Umlauts here"
    assert message.sender == "My Nameöer <myaddr@volkswagen.de>"  # RFC 2047 encoded word
    assert message.recipients == ("rechnung@domain.de",)
    assert message.body == "But here: üöäüäö"  # 8-bit UTF-8 body
    assert message.date == datetime(2025, 1, 15, 21, 43, 52, tzinfo=timezone(timedelta(hours=1)))
    assert message.date is not None
    assert message.date.utcoffset() == timedelta(hours=1)
    assert message.attachments == ()


def test_non_ascii_domains_in_cc_survive() -> None:
    message = extract_mail(mail("simple_text.eml"))
    assert message.subject == "Simple Text Mail"
    assert message.sender == "Some One <mail@someserver.de>"
    assert message.recipients == ("some@one.de", "asdasd@æsdasd.de", "asdadasdasdasda.asdasd@æsdasd.de")
    assert "fdf@fvf.de" not in message.recipients  # Bcc is not a recipient list we index
    assert message.body == "This is just a simple Text Mail."
    assert message.date == datetime(2022, 10, 12, 19, 40, 43, tzinfo=UTC)


def test_repeated_cc_headers_are_all_recipients() -> None:
    message = extract_mail(mail("python-msg_20.eml"))
    assert message.recipients == ("bbb@zzz.org", "ccc@zzz.org", "ddd@zzz.org", "eee@zzz.org")
    assert message.subject == "This is a test message"
    assert message.sender == "bbb@ddd.com"
    assert message.body == "Hi,\n\nDo you like this message?\n\n-Me"


def test_digest_includes_every_embedded_message() -> None:
    message = extract_mail(mail("python-msg_02.eml"))
    assert message.subject == "Ppp digest, Vol 1 #2 - 5 msgs"
    assert message.sender == "ppp-request@zzz.org"
    assert message.date == datetime(2001, 4, 21, 0, 18, tzinfo=UTC)
    assert message.body.count("hello") == 5
    assert_in_order(
        message.body, "Send Ppp mailing list submissions", "Today's Topics:", "hello", "_\nPpp mailing list"
    )


def test_bounce_with_cut_boundary_keeps_its_report() -> None:
    message = extract_mail(mail("python-msg_25.eml"))
    assert message.subject is not None
    assert message.subject.startswith("Returned mail: Too many hops 19 (17 max)")
    assert message.sender == "Mail Delivery Subsystem <MAILER-DAEMON@zinfandel.lacita.com>"
    assert message.recipients == ("linuxuser-admin@www.linux.org.uk", "postmaster@zinfandel.lacita.com")
    assert message.date == datetime(2001, 4, 6, 17, 23, 6, tzinfo=UTC)
    assert "unrecoverable error" in message.body
    assert "Final-Recipient: rfc822; scoffman@wellpartner.com" in message.body


def test_transfer_encodings_are_decoded() -> None:
    body = extract_mail(mail("python-msg_10.eml")).body
    assert_in_order(
        body,
        "This is a 7bit encoded message.",
        "¡This is a Quoted Printable encoded message!",  # text/html part, quoted-printable Latin-1
        "This is a Base64 encoded message.",
        "This has no Content-Transfer-Encoding: header.",
    )


def test_multipart_digest_of_two() -> None:
    message = extract_mail(mail("python-msg_30.eml"))
    assert (message.sender, message.subject, message.recipients) == ("aperson@dom.ain", None, ())
    assert message.body == "message 1\n\nmessage 2"


def test_headers_without_separating_blank_line() -> None:
    message = extract_mail(mail("python-msg_35.eml"))
    assert message.subject == "here's something interesting"
    assert message.recipients == ("bperson@dom.ain",)
    assert message.body == "counter to RFC 2822, there's no separating newline here"


def test_report_and_reused_boundary_mails() -> None:
    report = extract_mail(mail("python-msg_05.eml"))
    assert (report.sender, report.subject, report.recipients) == ("foo", "bar", ("baz",))
    assert report.body.count("Yadda yadda yadda") == 3
    reused = extract_mail(mail("python-msg_15.eml"))
    assert reused.message_id == "xxxx"
    assert reused.body.startswith("Some removed test.")
    empty_parts = extract_mail(mail("python-msg_12.eml"))
    assert (empty_parts.subject, empty_parts.body) == ("Lyrics", "")
    html_only = extract_mail(mail("python-msg_40.eml"))
    assert (html_only.sender, html_only.subject, html_only.date) == (None, None, None)
    assert "<html>" not in html_only.body


def test_html_alternative_attachments_and_utc_date() -> None:
    source = EmailMessage()
    source["From"] = "=?utf-8?q?J=C3=BCrgen?= <j@example.org>"
    source["To"] = "Team: a@example.org, b@example.org;"
    source["Subject"] = "=?utf-8?b?UmVjaG51bmcgTcOkcno=?="  # "Rechnung März"
    source["Date"] = "Tue, 1 Apr 2025 10:00:00 -0000"
    source["Message-ID"] = "  <abc@Example.ORG> (sent twice) "
    source.set_content(
        "<html><head><title>t</title><style>p{}</style></head>"
        "<body><p>Hallo&nbsp;Welt</p><script>x()</script><p>zweite Zeile</p></body></html>",
        subtype="html",
    )
    source.add_attachment(b"%PDF-1.4", maintype="application", subtype="pdf", filename="Rechnung März.pdf")

    message = extract_mail(source.as_bytes())
    assert message.sender == "Jürgen <j@example.org>"
    assert message.recipients == ("a@example.org", "b@example.org")
    assert message.subject == "Rechnung März"
    assert message.message_id == "abc@Example.ORG"
    assert message.date == datetime(2025, 4, 1, 10, 0, tzinfo=UTC)
    assert message.body == "Hallo Welt\n\nzweite Zeile"
    assert message.attachments == ("Rechnung März.pdf",)


def test_alternative_prefers_plain_text() -> None:
    source = EmailMessage()
    source["From"] = "a@example.org"
    source["Subject"] = "both"
    source.set_content("plain version")
    source.add_alternative("<p>html version</p>", subtype="html")
    assert extract_mail(source.as_bytes()).body == "plain version"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("<a@b>", "a@b"),
        ("  <a@b> (comment)", "a@b"),
        ("<a@\n b>", "a@b"),
        ("bare@id", "bare@id"),
        ("<>", None),
        ("", None),
        (None, None),
    ],
)
def test_normalise_message_id(raw: str | None, expected: str | None) -> None:
    assert normalise_message_id(raw) == expected


def test_result_types_are_frozen() -> None:
    result = extract_text(doc("simple.txt"))
    with pytest.raises(AttributeError):
        result.text = "changed"  # type: ignore[misc]
    message = extract_mail(mail("python-msg_01.eml"))
    with pytest.raises(AttributeError):
        message.subject = "changed"  # type: ignore[misc]


def test_concurrent_extraction_from_threads_matches_sequential() -> None:
    """PDFium is not thread-safe; workers run tasks in threads. Results must not mix."""
    names = ["libtasn1.pdf", "shared-mime-info-spec.pdf", "invalid_pdf.pdf", "multi-page-digital.pdf"] * 3
    if tesseract_available():
        names += ["multi-page-images.pdf", "simple.png"]
    expected = {name: extract_text(doc(name)) for name in set(names)}
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda name: extract_text(doc(name)), names))
    assert results == [expected[name] for name in names]
