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

Hostile mail is bounded before Python's recursion is: the parser builds each part
through a message class that knows its depth, and a part nested deeper than
``max_mail_depth`` (`OcrLimits`; multipart in multipart, or a chain of
``message/rfc822``) stops the parse with ``MALFORMED_MAIL``, as does a header field
whose comments nest deeper than that (the structured-header parser recurses into
comments). ``max_mail_bytes`` is checked before parsing and ``max_mail_parts`` while
parsing (``FILE_TOO_LARGE``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.header import decode_header, make_header
from email.headerregistry import BaseHeader, HeaderRegistry
from email.message import EmailMessage, Message
from email.parser import BytesParser
from email.policy import EmailPolicy
from email.utils import parsedate_to_datetime
from typing import Any, Final

from pgtasks.errors import Reject

from .files import read_document, shown
from .html_text import html_to_text
from .limits import DEFAULT_LIMITS, MALFORMED_MAIL, OcrLimits, limit_exceeded
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


def extract_mail(
    source: str | os.PathLike[str] | bytes,
    *,
    roots: Sequence[str | os.PathLike[str]] | None = None,
    limits: OcrLimits = DEFAULT_LIMITS,
    name: str | None = None,
) -> MailMessage:
    """Parse one mail.

    Args:
        source: the raw message as bytes, or the path of a file holding it (``.eml``,
            optionally starting with an mbox ``From `` line), read with
            `pgtasks_ocr.files.read_document`.
        roots: for a path, the directories it must lie in (empty refuses every path;
            None, the default for library use, does not check).
        limits: ``max_file_bytes`` (a path), ``max_mail_bytes``, ``max_mail_parts`` and
            ``max_mail_depth`` apply.
        name: what messages call the mail (default: the file's name; none for bytes).

    Raises:
        Reject: ``MALFORMED_MAIL`` when the input has no header field at all (see the
            module docstring for why), or nests parts or header comments deeper than
            ``max_mail_depth``; ``FILE_TOO_LARGE`` past ``max_mail_bytes`` or
            ``max_mail_parts``; for a path, those of `read_document`
            (``PATH_NOT_ALLOWED``, ``NOT_REGULAR_FILE``).
        OSError: the file cannot be read.
    """
    if isinstance(source, bytes):
        data = source
    else:
        document = read_document(source, roots=roots, limits=limits)
        data, name = document.data, name or shown(document.name)
    prefix = f"{name}: " if name else ""
    label = name or "mail"
    if len(data) > limits.max_mail_bytes:
        raise limit_exceeded(label, f"a mail of {len(data):,} bytes", "max_mail_bytes", limits.max_mail_bytes)
    message = BytesParser(policy=_bounded_policy(limits, label)).parsebytes(data)
    if not message.keys():
        raise Reject(
            f"{prefix}not a mail: no header fields at all (no From, Date, Message-ID or Subject)",
            code=MALFORMED_MAIL,
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


# --- bounds --------------------------------------------------------------------------


class _Budget:
    """What one parse may still build: parts in all, and how deep."""

    def __init__(self, limits: OcrLimits, label: str) -> None:
        self.limits = limits
        self.label = label
        self.parts = 0

    def enter(self, depth: int) -> None:
        """Account for one more part at ``depth`` (the top-level message is depth 0).

        Raises:
            Reject: ``MALFORMED_MAIL`` past ``max_mail_depth``, ``FILE_TOO_LARGE`` past
                ``max_mail_parts``.
        """
        self.parts += 1
        if depth > self.limits.max_mail_depth:
            raise limit_exceeded(
                self.label,
                f"parts nested at least {depth} deep",
                "max_mail_depth",
                self.limits.max_mail_depth,
                code=MALFORMED_MAIL,
            )
        if self.parts > self.limits.max_mail_parts:
            raise limit_exceeded(
                self.label,
                f"at least {self.parts:,} MIME parts",
                "max_mail_parts",
                self.limits.max_mail_parts,
            )


class _BoundedMessage(EmailMessage):
    """A message part that knows its depth; attaching a part too deep stops the parse.

    The parser (`email.feedparser`) attaches each part it starts to its parent before
    it parses the part's content, so the check runs before Python recurses any deeper.
    """

    def __init__(self, policy: Any = None, *, budget: _Budget | None = None, depth: int = 0) -> None:
        super().__init__(policy)
        self.budget = budget
        self.depth = depth

    def attach(self, payload: Any) -> None:
        """Attach a part, one level below this one, within the budget."""
        if isinstance(payload, _BoundedMessage) and self.budget is not None:
            payload.depth = self.depth + 1
            self.budget.enter(payload.depth)
        super().attach(payload)


class _DepthCheckedHeaders(HeaderRegistry):
    """The standard header classes, refusing a value whose comments nest too deep.

    ``email._header_value_parser.get_comment`` calls itself once per nested ``(``.
    """

    def __init__(self, budget: _Budget) -> None:
        super().__init__()
        self.budget = budget

    def __call__(self, name: str, value: str) -> BaseHeader:
        """Build the header object for ``name: value``.

        Raises:
            Reject: ``MALFORMED_MAIL`` when comments nest deeper than ``max_mail_depth``.
        """
        depth = _comment_depth(value)
        if depth > self.budget.limits.max_mail_depth:
            raise limit_exceeded(
                self.budget.label,
                f"comments nested {depth} deep in the {shown(name)} field",
                "max_mail_depth",
                self.budget.limits.max_mail_depth,
                code=MALFORMED_MAIL,
            )
        header: BaseHeader = super().__call__(name, value)
        return header


def _comment_depth(value: str) -> int:
    """Deepest nesting of ``(`` in ``value`` (a backslash escapes the next character);
    never less than what the header parser will recurse through."""
    depth = deepest = 0
    escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")" and depth:
            depth -= 1
    return deepest


def _bounded_policy(limits: OcrLimits, label: str) -> EmailPolicy[EmailMessage]:
    """``policy.default`` building `_BoundedMessage` parts and depth-checked headers."""
    budget = _Budget(limits, label)

    def message_factory(policy: Any = None) -> _BoundedMessage:
        return _BoundedMessage(policy, budget=budget)

    return policy.default.clone(message_factory=message_factory, header_factory=_DepthCheckedHeaders(budget))


# --- headers -----------------------------------------------------------------------


def _header_values(message: Message, name: str) -> list[Any]:
    """All values of header ``name``: structured header objects, or decoded strings."""
    try:
        return list(message.get_all(name) or [])
    except Reject:  # a limit (max_mail_depth): the mail fails, not just this header
        raise
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
        except Reject:
            raise
        except Exception:  # filename parameter decoding on hostile input; see _header_values
            name = None
        if name:
            names.append(_unescape(str(name)))
    return names
