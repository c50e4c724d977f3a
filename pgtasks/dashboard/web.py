"""The dashboard's ASGI application (Starlette): routes, templates, actions.

Pages are rendered on the server by Jinja2 with autoescape on; every value a page
shows also passes through `pgtasks.loader.shown`, so control characters and the
Unicode marks that reorder text are shown as escapes. The only script is htmx,
shipped in the package (``static/htmx.min.js``), which refreshes the overview.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from pgtasks.dashboard.auth import CSRF_FIELD, Access, AuthCallback
from pgtasks.dashboard.views import MAX_BULK, REQUEUED_BY, STATUSES, Dashboard, JobFilters, NotFound
from pgtasks.errors import (
    AlreadyQueued,
    ConfigurationError,
    DatabaseError,
    InvalidSchedule,
    JobNotFound,
    RunAlreadyActive,
)
from pgtasks.loader import shown
from pgtasks.redaction import redact_text

if TYPE_CHECKING:
    from pgtasks.app import App

__all__ = ["create_app"]

HERE: Final = Path(__file__).parent
_FLASH_COOKIE: Final = "pgtasks_flash"

Handler = Callable[[Request], Awaitable[Response]]


def _finalize(value: Any) -> Any:
    """Every ``{{ value }}``: text through `shown` (Markup the templates build is kept)."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return shown(value)
    return value


def _when(value: object) -> str:
    """A time as ``YYYY-MM-DD HH:MM:SS UTC`` (ISO text from a history kept as is)."""
    if value is None or value == "":
        return ""
    instant: dt.datetime
    if isinstance(value, dt.datetime):
        instant = value
    else:
        try:
            instant = dt.datetime.fromisoformat(str(value))
        except ValueError:
            return str(value)
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=dt.UTC)
    return instant.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(value: float | None) -> str:
    """A duration in seconds as ``4 s``, ``3 min 20 s``, ``2 h 5 min``."""
    if value is None:
        return ""
    s = max(0, round(value))
    if s < 60:
        return f"{value:.1f} s" if value < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = _when
    env.filters["seconds"] = _seconds
    env.filters["qs"] = urllib.parse.urlencode
    return env


def create_app(
    app: App,
    *,
    token: str | None = None,
    auth: AuthCallback | None = None,
    tenant: str | None = None,
    read_app: App | None = None,
    cookie_secure: bool | None = None,
    refresh_seconds: int = 10,
) -> Starlette:
    """The dashboard of ``app`` as a Starlette application (mount it with
    ``starlette.routing.Mount("/tasks", create_app(app))`` inside another ASGI app).

    Args:
        app: the application whose jobs, workers and schedules are shown; actions
            (retry, cancel, bulk requeue, trigger, pause, resume) go through it.
        token: a secret that unlocks the actions (login form, or
            ``Authorization: Bearer``); None with no ``auth`` keeps the dashboard read-only.
        auth: ``auth(request) -> bool`` for a host application with its own login: says
            whether the request may act (instead of the token).
        tenant: limit every page and action to this tenant (through ``app.tenant``).
        read_app: an application on a replica to read through (actions still go
            through ``app``); None to read through ``app``.
        cookie_secure: mark cookies ``Secure``; None: when the request came over HTTPS.
        refresh_seconds: how often the overview refreshes itself (0: never).

    Raises:
        ConfigurationError: both ``token`` and ``auth``, an empty token, a refused
            tenant name, or ``refresh_seconds`` out of range.
    """
    if token is not None and auth is not None:
        raise ConfigurationError("give the dashboard a token or an auth callback, not both")
    if token is not None and not token.strip():
        raise ConfigurationError("the dashboard token is empty")
    if type(refresh_seconds) is not int or not 0 <= refresh_seconds <= 86400:
        raise ConfigurationError(f"refresh_seconds must be an int in 0..86400, got {refresh_seconds!r:.80}")
    access = Access(token=token, auth=auth, cookie_secure=cookie_secure)
    board = Dashboard(app=app, read=read_app or app, tenant=tenant)
    templates = Jinja2Templates(env=_environment())

    def render(request: Request, template: str, context: dict[str, Any], status: int = 200) -> Response:
        sid = access.session_id(request)
        fresh = sid is None
        if sid is None:
            sid = access.new_session()
        flash = urllib.parse.unquote(request.cookies.get(_FLASH_COOKIE, ""))
        base = {
            "tenant": tenant,
            "can_act": access.may_act(request, None if fresh else sid),
            "can_ever_act": access.can_ever_act,
            "token_login": token is not None,
            "csrf_field": CSRF_FIELD,
            "csrf": access.csrf_token(sid),
            "flash": flash,
            "statuses": STATUSES,
            "refresh": refresh_seconds,
            "replica": read_app is not None,
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        }
        response = templates.TemplateResponse(request, template, {**base, **context}, status_code=status)
        if fresh:
            access.set_session(response, request, sid)
        if flash:
            response.delete_cookie(_FLASH_COOKIE, path=access.cookie_path(request))
        return response

    def error(request: Request, status: int, message: str) -> Response:
        return render(request, "error.html", {"status": status, "message": message}, status)

    async def overview(request: Request) -> Response:
        context = await run_in_threadpool(board.overview_page)
        template = "overview_body.html" if request.headers.get("hx-request") else "overview.html"
        return render(request, template, context)

    async def jobs(request: Request) -> Response:
        try:
            filters = JobFilters.parse(request.query_params)
            found = await run_in_threadpool(board.jobs, filters)
        except ConfigurationError as exc:
            return render(
                request, "jobs.html", {"jobs": [], "filters": JobFilters(), "problem": str(exc)}, 400
            )
        next_query = filters.query(before=found[-1].id) if len(found) == filters.limit else None
        context = {"jobs": found, "filters": filters, "problem": None, "next_query": next_query}
        return render(request, "jobs.html", context)

    async def job(request: Request) -> Response:
        try:
            context = await run_in_threadpool(board.job_page, request.path_params["job_id"])
        except NotFound as exc:
            return error(request, 404, str(exc))
        return render(request, "job.html", context)

    async def workers(request: Request) -> Response:
        found = await run_in_threadpool(board.workers)
        return render(request, "workers.html", {"workers": found})

    async def tenants(request: Request) -> Response:
        found = await run_in_threadpool(board.overview.tenants)
        return render(request, "tenants.html", {"tenants": found})

    async def schedules(request: Request) -> Response:
        found = await run_in_threadpool(board.schedules)
        return render(request, "schedules.html", {"schedules": found})

    async def schedule(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            page = int(request.query_params.get("page", "1"))
            context = await run_in_threadpool(board.schedule_page, name, page)
        except NotFound as exc:
            return error(request, 404, str(exc))
        except (ValueError, InvalidSchedule) as exc:
            return error(request, 400, f"bad page: {exc}")
        return render(request, "schedule.html", context)

    # -- actions -------------------------------------------------------------------

    def action(run: Callable[[Request, dict[str, str]], Awaitable[Response]]) -> Handler:
        """An action endpoint: refused (403, nothing done) without the right to act or
        without the session's CSRF token (unless the request carries the bearer token)."""

        async def endpoint(request: Request) -> Response:
            form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
            sid = access.session_id(request)
            if not access.can_ever_act:
                return error(request, 403, "this dashboard is read-only: start it with a token to act")
            if not access.may_act(request, sid):
                bearer = access.bearer(request)
                why = "wrong token" if bearer is not None else "log in with the dashboard's token to act"
                return error(request, 403, why)
            header_auth = access.auth is None and access.bearer(request) is not None
            if not header_auth and not access.check_csrf(sid, form.get(CSRF_FIELD)):
                return error(request, 403, "the form's security token is missing or wrong; reload the page")
            return await run(request, form)

        return endpoint

    def done(request: Request, form: dict[str, str], message: str, fallback: str) -> Response:
        target = form.get("next", "")
        if not target.startswith("/") or target.startswith("//") or "\\" in target:
            target = fallback
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            _FLASH_COOKIE, urllib.parse.quote(message), httponly=True, samesite="strict",
            path=access.cookie_path(request),
        )  # fmt: skip
        return response

    def job_path(request: Request, job_id: int) -> str:
        return str(request.url_for("job", job_id=job_id).path)

    async def retry(request: Request, form: dict[str, str]) -> Response:
        job_id = request.path_params["job_id"]
        try:
            requeued = await run_in_threadpool(board.actor.requeue, job_id, by=REQUEUED_BY)
        except (JobNotFound, ConfigurationError):
            return error(request, 404, f"no job with id {job_id}")
        except AlreadyQueued as exc:
            return error(request, 409, f"job {job_id} was not requeued: {exc}")
        if not requeued:
            status = (await run_in_threadpool(board.actor.get_job, job_id)).status
            return error(
                request, 409,
                f"job {job_id} is {status}: only failed, cancelled or partially failed jobs can be "
                "retried; nothing changed",
            )  # fmt: skip
        return done(request, form, f"job {job_id} requeued", job_path(request, job_id))

    async def cancel(request: Request, form: dict[str, str]) -> Response:
        job_id = request.path_params["job_id"]
        try:
            outcome = await run_in_threadpool(board.actor.cancel_job, job_id)
        except (JobNotFound, ConfigurationError):
            return error(request, 404, f"no job with id {job_id}")
        if outcome == "finished":
            status = (await run_in_threadpool(board.actor.get_job, job_id)).status
            return error(request, 409, f"job {job_id} already finished ({status}); nothing changed")
        message = (
            f"job {job_id} cancelled"
            if outcome == "cancelled"
            else (f"job {job_id} is running: its worker was asked to stop it")
        )
        return done(request, form, message, job_path(request, job_id))

    async def requeue_failed(request: Request, form: dict[str, str]) -> Response:
        try:
            filters = JobFilters.parse({**form, "status": "failed"})
        except ConfigurationError as exc:
            return error(request, 400, str(exc))

        def requeue_all() -> tuple[int, int]:
            ids: list[int] = []
            before = None
            while len(ids) < MAX_BULK:
                page = board.jobs(
                    JobFilters(**{**filters.__dict__, "before_id": before, "limit": 500}), database="primary"
                )
                ids.extend(j.id for j in page)
                if len(page) < 500:
                    break
                before = page[-1].id
            done_count = skipped = 0
            for job_id in ids[:MAX_BULK]:
                try:
                    ok = board.actor.requeue(job_id, by=REQUEUED_BY)
                except AlreadyQueued:
                    ok = False
                done_count += ok
                skipped += not ok
            return done_count, skipped

        requeued, skipped = await run_in_threadpool(requeue_all)
        if requeued == 0 and skipped == 0:
            message = "no failed job matches these filters; nothing changed"
        else:
            message = f"{requeued} failed job(s) requeued" + (f", {skipped} skipped" if skipped else "")
        jobs_path = str(request.url_for("jobs").path)
        query = urllib.parse.urlencode(filters.query(status="failed"))
        return done(request, form, message, f"{jobs_path}?{query}")

    def schedule_action(kind: str) -> Callable[[Request, dict[str, str]], Awaitable[Response]]:
        async def run(request: Request, form: dict[str, str]) -> Response:
            name = request.path_params["name"]

            def act() -> str:
                board.schedule(name, primary=True)  # NotFound for another tenant's
                api = board.app.schedules
                if kind == "trigger":
                    result = api.trigger(name, requested_by=REQUEUED_BY)
                    return f"schedule {name!r} triggered: run {result.id}"
                if kind == "pause":
                    changed = api.pause(name, by=REQUEUED_BY)
                    return f"schedule {name!r} paused" if changed else f"schedule {name!r} was already paused"
                changed = api.resume(name)
                return f"schedule {name!r} resumed" if changed else f"schedule {name!r} was not paused"

            try:
                message = await run_in_threadpool(act)
            except NotFound as exc:
                return error(request, 404, str(exc))
            except RunAlreadyActive as exc:
                return error(request, 409, f"schedule {name!r} was not triggered: {exc}")
            fallback = str(request.url_for("schedule", name=name).path)
            return done(request, form, message, fallback)

        return run

    # -- login ---------------------------------------------------------------------

    async def login(request: Request) -> Response:
        if token is None:
            return error(request, 404, "this dashboard has no token login")
        if request.method == "GET":
            return render(request, "login.html", {"problem": None})
        form = await request.form()
        sid = access.session_id(request)
        if not access.check_csrf(sid, form.get(CSRF_FIELD)):
            return error(request, 403, "the form's security token is missing or wrong; reload the page")
        given = form.get("token")
        if not isinstance(given, str) or not access.token_matches(given):
            return render(request, "login.html", {"problem": "wrong token"}, 403)
        assert sid is not None
        response = RedirectResponse(str(request.url_for("overview").path), status_code=303)
        access.log_in(response, request, sid)
        return response

    async def logout(request: Request) -> Response:
        form = await request.form()
        if not access.check_csrf(access.session_id(request), form.get(CSRF_FIELD)):
            return error(request, 403, "the form's security token is missing or wrong; reload the page")
        response = RedirectResponse(str(request.url_for("overview").path), status_code=303)
        access.log_out(response, request)
        return response

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error(request, exc.status_code, exc.detail or "not found")

    async def database_error(request: Request, exc: Exception) -> Response:
        # E.g. a server that is down, or, under row-level security, a tenant's role
        # that may not write the code-defined schedules the schedule API syncs first.
        return error(request, 503, f"the database refused: {redact_text(str(exc))}")

    routes = [
        Route("/", overview, name="overview"),
        Route("/jobs", jobs, name="jobs"),
        Route("/jobs/requeue-failed", action(requeue_failed), methods=["POST"], name="requeue_failed"),
        Route("/jobs/{job_id:int}", job, name="job"),
        Route("/jobs/{job_id:int}/retry", action(retry), methods=["POST"], name="retry"),
        Route("/jobs/{job_id:int}/cancel", action(cancel), methods=["POST"], name="cancel"),
        Route("/workers", workers, name="workers"),
        Route("/tenants", tenants, name="tenants"),
        Route("/schedules", schedules, name="schedules"),
        Route("/schedules/{name:path}/trigger", action(schedule_action("trigger")), methods=["POST"],
              name="trigger"),
        Route("/schedules/{name:path}/pause", action(schedule_action("pause")), methods=["POST"],
              name="pause"),
        Route("/schedules/{name:path}/resume", action(schedule_action("resume")), methods=["POST"],
              name="resume"),
        Route("/schedules/{name:path}", schedule, name="schedule"),
        Route("/login", login, methods=["GET", "POST"], name="login"),
        Route("/logout", logout, methods=["POST"], name="logout"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]  # fmt: skip
    handlers = {HTTPException: not_found, DatabaseError: database_error}
    return Starlette(routes=routes, exception_handlers=handlers)
