"""``pgtasks search QUERY --tenant T``: ranked hits with snippets, as a table or one JSON array."""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgtasks.errors import PgtasksError
from pgtasks.plugin_api import AppLoader, echo_json, fail, shown

from .api import DEFAULT_LIMIT, search

__all__ = ["search_command"]

# Markers that do not occur in real text, turned into rich styles after escaping.
_START, _STOP = "\u27e6", "\u27e7"


@click.command("search")
@click.argument("query")
@click.option("-t", "--tenant", default="", show_default=True, help="Whose index to search.")
@click.option("-n", "--limit", default=DEFAULT_LIMIT, show_default=True, type=click.IntRange(1, 1000))
@click.option("--language", default=None, help="Text-search configuration (default: english).")
@click.option("--kind", "kinds", multiple=True, help="Only entries of this kind (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the hits as one JSON array.")
@click.pass_obj
def search_command(
    loader: AppLoader,
    /,
    *,
    query: str,
    tenant: str,
    limit: int,
    language: str | None,
    kinds: tuple[str, ...],
    as_json: bool,
) -> None:
    """Search the full-text index of one tenant (pgtasks_index plugin)."""
    try:
        app = loader.get()
    except PgtasksError as exc:
        fail(exc)
        return
    try:
        hits = search(
            app,
            query,
            tenant=tenant,
            limit=limit,
            language=language,
            kinds=kinds or None,
            highlight=(_START, _STOP) if not as_json else ("«", "»"),
        )
    except PgtasksError as exc:
        fail(exc)
        return
    finally:
        app.close()
    if as_json:
        echo_json(
            [
                {
                    "tenant": hit.tenant,
                    "kind": hit.kind,
                    "key": hit.key,
                    "title": hit.title,
                    "rank": hit.rank,
                    "match": hit.match,
                    "snippet": hit.snippet,
                }
                for hit in hits
            ]
        )
        return
    console = Console()
    if not hits:
        console.print(f"no hits for {_literal(repr(query))} in tenant {_literal(repr(tenant))}")
        return
    table = Table(title=f"{len(hits)} hit(s) for {_literal(repr(query))} in tenant {_literal(repr(tenant))}")
    table.add_column("#", justify="right")
    table.add_column("kind")
    table.add_column("key", style="bold")
    table.add_column("title")
    table.add_column("match")
    table.add_column("rank", justify="right")
    table.add_column("snippet")
    for number, hit in enumerate(hits, 1):
        snippet = _literal(hit.snippet).replace(_START, "[bold yellow]").replace(_STOP, "[/bold yellow]")
        table.add_row(
            str(number),
            _literal(hit.kind),
            _literal(hit.key),
            _literal(hit.title),
            _literal(hit.match),
            f"{hit.rank:.3f}",
            snippet,
        )
    console.print(table)


def _literal(value: str) -> str:
    """``value`` as rich markup that prints it literally: markup escaped, control characters
    shown as escapes (`pgtasks.plugin_api.shown`)."""
    return escape(shown(value))
