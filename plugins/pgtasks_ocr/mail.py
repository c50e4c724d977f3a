"""Mail messages (RFC 5322 / MIME): the fields a mail index needs, from real, messy mail.

Parsed with the standard library's `email` package and ``policy.default``, which decodes
RFC 2047 encoded words and 8-bit UTF-8 headers and records defects instead of raising.
Real mail breaks the rules in many ways, and every one of them has to parse:

- Message-IDs shared by different messages (the corpus's ``python-msg_01``, ``_03`` and
  ``_20``). The id is reported as it is; deduplication is the indexer's business.
- No Message-ID at all: ``message_id`` is None.
- Raw 8-bit UTF-8 in address headers (``simple_text.eml``: ``Cc: asdasd@æsdasd.de``).
  The parser leaves such bytes as surrogate escapes, which PostgreSQL cannot store.
  They are turned back into text: UTF-8 if the bytes are valid UTF-8, windows-1252
  otherwise.
- A multipart whose ``boundary`` parameter is cut off (the bounce ``python-msg_25``):
  the parser cannot split it, so its raw body is kept as text.
- Digests (``multipart/digest`` of ``message/rfc822`` parts): the text of every
  embedded message is part of the body.

What is not a mail: ``broken.eml`` of the corpus is the single line "This is not a valid
eml." It has no header field at all, so no sender, no date, no id, and nothing tells it
apart from any other text file. Indexing it as a mail would create an entry that looks
like a mail and is not one, so `extract_mail` raises ``Reject(code="MALFORMED_MAIL")``
for any input without a single header field. A clear, permanent failure is what the
corpus README asks for ("must fail clearly ... on broken.eml if it cannot be indexed").
A message with headers but a missing blank line (``python-msg_35``) is still a mail: its
headers parse and the rest becomes the body.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.header import decode_header, make_header
from email.message import EmailMessage, Message
from email.parser import BytesParser
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Final

from pgtasks.errors import Reject

from .html_text import html_to_text
from .result import normalise_text

__all__ = ["MailMessage", "extract_mail", "normalise_message_id"]

_MSGID_RE: Final = re.compile(r"<([^<>]*)>")
_WHITESPACE_RE: Final = re.compile(r"\s+")
_ALTERNATIVE_RANK: Final = {"text/plain": 0, "text/html": 1}


@dataclass(frozen=True, slots=True)
class MailMessage:
    """The indexable content of one mail.

    Attributes:
        message_id: the Message-ID without angle brackets or whitespace
            (`normalise_message_id`), or None when the header is missing or empty.
            Not unique: different messages may share one.
        subject: decoded Subject with whitespace collapsed, or None when missing.
        sender: the first From address formatted as ``Name <addr>`` (or the bare header
            text if it holds no parsable address), or None when missing.
        recipients: To and Cc addresses (every To/Cc header, in order, without
            duplicates), formatted like ``sender``; non-ASCII names and domains are kept
            as text.
        date: the Date header as an aware datetime (UTC for ``-0000``), or None when
            missing or unparsable.
        body: text/plain parts (text/html ones converted, and preferred only when an
            alternative has no plain text) of the message and embedded messages, in
            order, separated by a blank line.
        attachments: file names of attached parts, in order (unnamed ones are left out).
    """

    message_id: str | None
    subject: str | None
    sender: str | None
    recipients: tuple[str, ...]
    date: datetime | None
    body: str
    attachments: tuple[str, ...]

    def to_text(self) -> str:
        """The mail as one indexable text: Subject/From/To/Date/Attachments lines, then the body."""
        lines: list[str] = []
        if self.subject:
            lines.append(f"Subject: {self.subject}")
        if self.sender:
            lines.append(f"From: {self.sender}")
        if self.recipients:
            lines.append("To: " + ", ".join(self.recipients))
        if self.date is not None:
            lines.append(f"Date: {self.date.isoformat()}")
        if self.attachments:
            lines.append("Attachments: " + ", ".join(self.attachments))
        return "\n\n".join(part for part in ("\n".join(lines), self.body) if part)


def extract_mail(source: str | os.PathLike[str] | bytes) -> MailMessage:
    """Parse one mail.

    Args:
        source: the raw message as bytes, or the path of a file holding it (``.eml``,
            optionally starting with an mbox ``From `` line).

    Raises:
        Reject: ``MALFORMED_MAIL`` when the input has no header field at all (see the
            module docstring for why).
        OSError: the file cannot be read.
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    message = BytesParser(policy=policy.default).parsebytes(data)
    if not message.keys():
        name = "" if isinstance(source, bytes) else f"{Path(source).name}: "
        raise Reject(
            f"{name}not a mail: no header fields at all (no From, Date, Message-ID or Subject)",
            code="MALFORMED_MAIL",
        )
    return MailMessage(
        message_id=normalise_message_id(_first_text(message, "message-id")),
        subject=_collapse(_first_text(message, "subject")),
        sender=next(iter(_addresses(message, ("from",))), None),
        recipients=tuple(dict.fromkeys(_addresses(message, ("to", "cc")))),
        date=_date(message),
        body=_body(message),
        attachments=tuple(_attachment_names(message)),
    )


def normalise_message_id(value: str | None) -> str | None:
    """Return the id inside ``<...>`` without whitespace, or None if nothing is left.

    RFC 5322 3.6.4: ``msg-id = [CFWS] "<" id-left "@" id-right ">" [CFWS]``. The first
    bracketed part wins, so trailing comments are dropped; a value without brackets (seen
    in the wild) is used whole. Case is kept: the id's left part is case-sensitive.
    """
    if value is None:
        return None
    match = _MSGID_RE.search(value)
    inner = match.group(1) if match else value
    return _WHITESPACE_RE.sub("", inner) or None


# --- headers -----------------------------------------------------------------------


def _header_values(message: Message, name: str) -> list[Any]:
    """All values of header ``name``: structured header objects, or decoded strings."""
    try:
        return list(message.get_all(name) or [])
    except Exception:
        # The structured header parser has had crashes on hostile input (CPython issues
        # on _header_value_parser); one bad header must not lose the whole mail.
        return [_decode_raw(value) for key, value in message.raw_items() if key.lower() == name]


def _decode_raw(value: str) -> str:
    try:
        return str(make_header(decode_header(value)))
    except Exception:  # same reason as above: legacy decoder on hostile input
        return value


def _first_text(message: Message, name: str) -> str | None:
    values = _header_values(message, name)
    return _unescape(str(values[0])) if values else None


def _addresses(message: Message, names: Iterable[str]) -> list[str]:
    found: list[str] = []
    for name in names:
        for value in _header_values(message, name):
            addresses = getattr(value, "addresses", None)
            if addresses is None:  # raw fallback string
                found.extend(part.strip() for part in _unescape(str(value)).split(",") if part.strip())
            elif addresses:
                found.extend(_unescape(str(address)) for address in addresses)
            elif str(value).strip() and not getattr(value, "groups", ()):
                found.append(_unescape(str(value).strip()))
    return found


def _date(message: Message) -> datetime | None:
    values = _header_values(message, "date")
    if not values:
        return None
    parsed = getattr(values[0], "datetime", None)
    if parsed is None:
        try:
            parsed = parsedate_to_datetime(str(values[0]))
        except (TypeError, ValueError, IndexError):
            return None
    if not isinstance(parsed, datetime):
        return None
    # RFC 5322 3.3: "-0000" means UTC with no information about local time; the
    # parser returns that as a naive datetime.
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _collapse(value: str | None) -> str | None:
    return None if value is None else _WHITESPACE_RE.sub(" ", value).strip()


def _unescape(value: str) -> str:
    """Turn the parser's surrogate escapes (undecodable header bytes) back into text."""
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # lone surrogates that are not escapes
        return value.encode("utf-8", "replace").decode("utf-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


# --- body ----------------------------------------------------------------------------


def _body(message: Message) -> str:
    chunks: list[str] = []
    _collect(message, chunks)
    return "\n\n".join(text for text in (normalise_text(chunk) for chunk in chunks) if text)


def _children(part: Message) -> list[Message]:
    payload = part.get_payload()
    return [child for child in payload if isinstance(child, Message)] if isinstance(payload, list) else []


def _is_attachment(part: Message) -> bool:
    if isinstance(part, EmailMessage) and part.is_attachment():
        return True
    return part.get_content_maintype() not in ("text", "multipart", "message")


def _collect(part: Message, chunks: list[str]) -> None:
    content_type = part.get_content_type()
    if part.is_multipart():
        children = _children(part)
        if content_type == "multipart/alternative":
            _collect_alternative(children, chunks)
        elif content_type == "message/delivery-status":
            chunks.append("\n\n".join(_raw_headers_text(block) for block in children))
        else:
            for child in children:
                _collect(child, chunks)
        return
    if _is_attachment(part):
        return
    if part.get_content_maintype() == "text":
        text = _text_content(part)
        chunks.append(html_to_text(text) if content_type == "text/html" else text)
    else:  # a multipart or message part the parser could not split: keep its raw text
        chunks.append(_decoded_payload(part))


def _collect_alternative(children: list[Message], chunks: list[str]) -> None:
    """Add the first non-empty alternative, trying text/plain, then text/html, then the rest."""
    for child in sorted(children, key=lambda c: _ALTERNATIVE_RANK.get(c.get_content_type(), 2)):
        found: list[str] = []
        _collect(child, found)
        if any(text.strip() for text in found):
            chunks.extend(found)
            return


def _text_content(part: Message) -> str:
    if isinstance(part, EmailMessage):
        try:
            content = part.get_content()
        except (LookupError, ValueError, UnicodeError, AssertionError):
            content = None
        if isinstance(content, str):
            return content
    return _decoded_payload(part)


def _decoded_payload(part: Message) -> str:
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    charset = part.get_content_charset() or "utf-8"
    try:
        return payload.decode(charset, errors="replace")
    except LookupError:
        return payload.decode("utf-8", errors="replace")


def _raw_headers_text(block: Message) -> str:
    return "\n".join(f"{key}: {_unescape(str(value))}" for key, value in block.raw_items())


def _attachment_names(message: Message) -> list[str]:
    names: list[str] = []
    for part in message.walk():
        if part.is_multipart() or not _is_attachment(part):
            continue
        try:
            name = part.get_filename()
        except Exception:  # filename parameter decoding on hostile input; see _header_values
            name = None
        if name:
            names.append(_unescape(str(name)))
    return names
