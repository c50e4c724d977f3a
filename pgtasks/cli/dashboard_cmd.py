"""``pgtasks dashboard``: serve the web dashboard (`pgtasks.dashboard`) with uvicorn.

The token that unlocks actions is read from a file (``--token-file``) or from the
environment (``PGTASKS_DASHBOARD_TOKEN``), never from the command line, where
every user of the host could read it in the process list.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from pgtasks.cli.common import AppLoader, fail, shown
from pgtasks.errors import ConfigurationError, PgtasksError

__all__ = ["TOKEN_ENV", "dashboard_command", "read_token"]

#: The environment variable that may hold the dashboard's token.
TOKEN_ENV = "PGTASKS_DASHBOARD_TOKEN"


def read_token(token_file: Path | None) -> str | None:
    """The dashboard's token: the first line of ``token_file``, else ``PGTASKS_DASHBOARD_TOKEN``,
    else None (read-only).

    Raises:
        ConfigurationError: the file cannot be read, or holds no token.
    """
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read the token file {shown(token_file)}: {exc}") from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise ConfigurationError(f"the token file {shown(token_file)} is empty")
        return token
    value = os.environ.get(TOKEN_ENV, "").strip()
    return value or None


@click.command("dashboard")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"File whose first line is the token that unlocks actions (else env {TOKEN_ENV}; "
    "with neither the dashboard is read-only).",
)
@click.option(
    "--read-dsn",
    default=None,
    envvar="PGTASKS_DASHBOARD_READ_DSN",
    help="Read through this DSN (a replica); actions still go to the primary.",
)
@click.option("--tenant", default=None, help="Show and act on this tenant's jobs and schedules only.")
@click.pass_obj
def dashboard_command(
    loader: AppLoader,
    host: str,
    port: int,
    token_file: Path | None,
    read_dsn: str | None,
    tenant: str | None,
) -> None:
    """Serve the web dashboard: queues, jobs, workers, schedules, tenants.

    Read-only unless a token is given (``--token-file`` or env
    PGTASKS_DASHBOARD_TOKEN); then actions (retry, cancel, bulk requeue, trigger,
    pause, resume) need a login with that token.
    """
    try:
        import uvicorn

        from pgtasks.dashboard import create_app
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the 'dashboard' extra: pip install 'pgtasks[dashboard]' ({exc})"
        ) from None
    import pgtasks

    try:
        token = read_token(token_file)
        app = loader.get()
        read_app = None
        if read_dsn is not None:
            read_app = pgtasks.App(app.name, dsn=read_dsn, load_entry_points=False)
        elif loader.reader() is not app:  # --read-dsn of the command line, PGTASKS_READ_DSN
            read_app = loader.reader()
        web = create_app(app, token=token, tenant=tenant, read_app=read_app)
    except PgtasksError as exc:
        fail(exc)
    mode = "actions need the token" if token else "read-only"
    click.echo(f"pgtasks dashboard on http://{shown(host)}:{port}/ ({mode})", err=True)
    try:
        uvicorn.run(web, host=host, port=port, log_level="warning")
    finally:
        if read_app is not None:
            read_app.close()
