"""Who may act on the dashboard, and the protection of its forms against cross-site requests.

Every visitor gets a session cookie (a random id signed with a key that lives as
long as the dashboard process; ``HttpOnly``, ``SameSite=Strict``, ``Secure`` when
served over HTTPS). Each form carries the session's CSRF token (an HMAC of the
session id) and every action checks it. Actions also need the right to act:

- with a token (``--token-file`` or ``PGTASKS_DASHBOARD_TOKEN``): the login form
  sets a second cookie, signed over the session id, once the token was typed; a
  script may instead send ``Authorization: Bearer <token>`` (a header a browser
  never adds by itself, so such a request needs no CSRF token);
- with an auth callback (``create_app(app, auth=...)``, for a host application with
  its own login): the callback says, per request;
- with neither, the dashboard is read-only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["AUTH_COOKIE", "SESSION_COOKIE", "Access", "AuthCallback"]

SESSION_COOKIE: Final = "pgtasks_session"
AUTH_COOKIE: Final = "pgtasks_auth"
#: The form field that carries the CSRF token.
CSRF_FIELD: Final = "csrf_token"

#: ``auth(request) -> bool``: whether this request may act (retry, cancel, trigger ...).
AuthCallback = Callable[[Request], bool]


@dataclass(frozen=True)
class Access:
    """The dashboard's rules of access (see the module docstring).

    Args:
        token: the token that unlocks actions, or None.
        auth: a callback that says whether a request may act, or None.
        cookie_secure: mark cookies ``Secure``: True, False, or None to do so when
            the request came over HTTPS.
    """

    token: str | None = None
    auth: AuthCallback | None = None
    cookie_secure: bool | None = None
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @property
    def can_ever_act(self) -> bool:
        """Whether actions are possible at all (a token or an auth callback is set)."""
        return self.token is not None or self.auth is not None

    def _sign(self, purpose: str, value: str) -> str:
        return hmac.new(self.key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def session_id(self, request: Request) -> str | None:
        """The request's session id if its cookie is one this dashboard signed, else None."""
        raw = request.cookies.get(SESSION_COOKIE, "")
        sid, _, signature = raw.partition(".")
        if sid and hmac.compare_digest(signature, self._sign("session", sid)):
            return sid
        return None

    def new_session(self) -> str:
        """A fresh session id."""
        return secrets.token_urlsafe(24)

    def set_session(self, response: Response, request: Request, sid: str) -> None:
        """Put the signed session cookie on ``response``."""
        self._cookie(response, request, SESSION_COOKIE, f"{sid}.{self._sign('session', sid)}")

    def csrf_token(self, sid: str) -> str:
        """The CSRF token of session ``sid``."""
        return self._sign("csrf", sid)

    def check_csrf(self, sid: str | None, submitted: object) -> bool:
        """Whether ``submitted`` is the CSRF token of session ``sid``."""
        return (
            sid is not None
            and isinstance(submitted, str)
            and hmac.compare_digest(submitted.encode(), self.csrf_token(sid).encode())
        )

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is the dashboard's token (compared in constant time)."""
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def bearer(self, request: Request) -> str | None:
        """The token of an ``Authorization: Bearer ...`` header, or None."""
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return value.strip() if scheme.lower() == "bearer" and value.strip() else None

    def log_in(self, response: Response, request: Request, sid: str) -> None:
        """Mark session ``sid`` as holding the token (the cookie the login form sets)."""
        self._cookie(response, request, AUTH_COOKIE, self._sign("auth", sid))

    def log_out(self, response: Response, request: Request) -> None:
        """Drop the login cookie."""
        response.delete_cookie(AUTH_COOKIE, path=self.cookie_path(request))

    def may_act(self, request: Request, sid: str | None) -> bool:
        """Whether this request may act: the auth callback says so, or (with a token)
        the session logged in with it or the request carries it as a bearer token."""
        if self.auth is not None:
            return bool(self.auth(request))
        if self.token is None:
            return False
        bearer = self.bearer(request)
        if bearer is not None:
            return self.token_matches(bearer)
        cookie = request.cookies.get(AUTH_COOKIE, "")
        return sid is not None and hmac.compare_digest(cookie, self._sign("auth", sid))

    def cookie_path(self, request: Request) -> str:
        """The path the dashboard's cookies are set for: where it is mounted."""
        root = request.scope.get("root_path", "") or ""
        return root.rstrip("/") + "/"

    def _cookie(self, response: Response, request: Request, name: str, value: str) -> None:
        secure = self.cookie_secure if self.cookie_secure is not None else request.url.scheme == "https"
        response.set_cookie(
            name, value, httponly=True, samesite="strict", secure=secure, path=self.cookie_path(request)
        )
