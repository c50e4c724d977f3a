"""The full-text index plugin against a real PostgreSQL: migrations, upsert, search, delete."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgtasks
import pgtasks_delete
import pgtasks_delete.plugin
import pgtasks_index
import pgtasks_index.plugin
from pgtasks.cli import cli
from pgtasks.errors import ConfigurationError
from pgtasks_index.store import QUERIES

# The shared corpus beside the repository (or at $PGTASKS_CORPUS_DIR, as tests/test_ocr_extract.py
# finds it); a clone without it skips the tests that read it.
CORPUS = (
    Path(os.environ.get("PGTASKS_CORPUS_DIR") or Path(__file__).resolve().parents[2] / "shared" / "corpus")
    / "documents"
)
PLUGIN_DIR = Path(pgtasks_index.__file__).parent


def _index_app(dsn: str) -> pgtasks.App:
    app = pgtasks.App(
        "index-test",
        dsn=dsn,
        load_entry_points=False,
        plugins=[pgtasks_index.plugin, pgtasks_delete.plugin],
    )
    app.migrate()
    return app


@pytest.fixture
def iapp(dsn: str) -> Iterator[pgtasks.App]:
    """An app with the index and delete plugins, on a fresh database, index migrated."""
    app = _index_app(dsn)
    yield app
    app.close()


# -- migrations ----------------------------------------------------------------------


def test_plugin_migrations_are_applied_once_and_recorded(dsn: str) -> None:
    app = pgtasks.App("m", dsn=dsn, load_entry_points=False, plugins=[pgtasks_index.plugin])
    try:
        assert app.migrate() == ["pgtasks_index:0001_entries"]
        assert app.migrate() == []
        with psycopg.connect(dsn) as conn:
            ledger = conn.execute("SELECT plugin, version, name FROM pgtasks.plugin_migrations").fetchall()
            assert ledger == [("pgtasks_index", 1, "entries")]
            assert conn.execute("SELECT to_regclass('pgtasks_index.entries') IS NOT NULL").fetchone() == (
                True,
            )
        assert pgtasks_index.capabilities(app).migrated
    finally:
        app.close()


def test_concurrent_migrations_apply_the_plugin_migration_once(dsn: str) -> None:
    import threading

    apps = [
        pgtasks.App(f"m{i}", dsn=dsn, load_entry_points=False, plugins=[pgtasks_index.plugin])
        for i in range(4)
    ]
    applied: list[list[str]] = []
    threads = [threading.Thread(target=lambda a=a: applied.append(a.migrate())) for a in apps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for app in apps:
        app.close()
    assert sorted(applied) == [[], [], [], ["pgtasks_index:0001_entries"]]


def test_without_the_plugin_migrate_creates_no_index_tables(dsn: str, app: pgtasks.App) -> None:
    assert app.migrate() == []
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('pgtasks_index.entries')").fetchone() == (None,)


def test_index_use_before_migration_says_to_migrate(dsn: str) -> None:
    app = pgtasks.App("m", dsn=dsn, load_entry_points=False, plugins=[pgtasks_index.plugin])
    try:
        with pytest.raises(ConfigurationError, match="migrate"):
            pgtasks_index.search(app, "anything", tenant="t")
    finally:
        app.close()


# -- named queries -------------------------------------------------------------------


def _corpus_text(name: str) -> str:
    """A text file of the shared corpus; skips the test when the corpus is absent."""
    path = CORPUS / name
    if not path.is_file():
        pytest.skip(f"the shared corpus is not present: no {path} (set PGTASKS_CORPUS_DIR)")
    return path.read_text(encoding="utf-8")


def _as_prepared(text: str) -> str:
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, text).replace("%%", "%")


def test_every_index_query_is_used_and_prepares(iapp: pgtasks.App, dsn: str) -> None:
    code = "\n".join(p.read_text() for p in PLUGIN_DIR.glob("*.py"))
    unused = [name for name in QUERIES if f'"{name}"' not in code]
    assert unused == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, text in QUERIES.items():
            stmt = _as_prepared(text) if "%(" in text else text
            conn.execute(sql.SQL("PREPARE {} AS {}").format(sql.Identifier(f"q_{name}"), sql.SQL(stmt)))
            conn.execute(sql.SQL("DEALLOCATE {}").format(sql.Identifier(f"q_{name}")))


# -- upsert and search ---------------------------------------------------------------


def test_upsert_replaces_and_search_ranks_by_stem_and_title(iapp: pgtasks.App) -> None:
    first = pgtasks_index.upsert(
        iapp,
        tenant="acme",
        kind="document",
        key="a",
        title="Invoices",
        text="The invoices of March were paid.",
    )
    assert first.created and first.lexemes > 0
    pgtasks_index.upsert(
        iapp, tenant="acme", kind="document", key="b", title="Notes", text="An invoice was mentioned once."
    )
    again = pgtasks_index.upsert(
        iapp,
        tenant="acme",
        kind="document",
        key="a",
        title="Invoices",
        text="The invoices of April were paid.",
        metadata={"pages": 1},
    )
    assert not again.created
    hits = pgtasks_index.search(iapp, "invoice", tenant="acme")
    assert [h.key for h in hits] == ["a", "b"]  # stemmed match in both; the title weighs more
    assert all(h.match == "fulltext" for h in hits)
    assert "«" in hits[0].snippet and "April" in hits[0].snippet
    assert hits[0].metadata == {"pages": 1}
    assert pgtasks_index.find_keys(iapp, tenant="acme", kind="document", metadata={"pages": 1}) == ["a"]
    assert pgtasks_index.find_keys(iapp, tenant="acme", kind="document", metadata={"pages": 2}) == []
    assert pgtasks_index.find_keys(iapp, tenant="other", kind="document", metadata={}) == []
    entry = pgtasks_index.get_entry(iapp, tenant="acme", kind="document", key="a")
    assert entry is not None and "April" in entry.body and entry.language == "english"
    assert pgtasks_index.count_entries(iapp, "acme") == {"document": 2}


def test_search_sees_only_its_tenant(iapp: pgtasks.App) -> None:
    for tenant in ("acme", "globex"):
        pgtasks_index.upsert(
            iapp, tenant=tenant, kind="mail", key="same-key", text=f"secret plans of {tenant}"
        )
    acme = pgtasks_index.search(iapp, "secret plans", tenant="acme")
    assert [(h.tenant, h.key) for h in acme] == [("acme", "same-key")]
    assert "acme" in acme[0].snippet
    assert pgtasks_index.search(iapp, "secret", tenant="initech") == []
    assert pgtasks_index.search(iapp, "globex", tenant="acme") == []


def test_corpus_content_found_by_cyrillic_greek_and_cjk_words(iapp: pgtasks.App) -> None:
    text = _corpus_text("content.txt")
    pgtasks_index.upsert(iapp, tenant="t", kind="document", key="content.txt", text=text)
    pgtasks_index.upsert(iapp, tenant="t", kind="document", key="other", text="Nothing to see here.")
    for word in ("Привет", "привет", "пожаловать", "Ωμέγα", "quick fox", "カタカナ"):
        hits = pgtasks_index.search(iapp, word, tenant="t")
        assert [(h.key, h.match) for h in hits] == [("content.txt", "fulltext")], word
    # Chinese and Japanese have no spaces: the parser sees a whole run between
    # punctuation as one word, so a word inside a run is found by the fallback.
    for word in ("天气", "東京"):
        hits = pgtasks_index.search(iapp, word, tenant="t")
        assert [h.key for h in hits] == ["content.txt"], word
        assert hits[0].match == "substring"
        assert f"«{word}»" in hits[0].snippet


def test_fuzzy_fallback_with_pg_trgm_finds_a_misspelled_name(iapp: pgtasks.App) -> None:
    assert pgtasks_index.capabilities(iapp).trigram
    pgtasks_index.upsert(iapp, tenant="t", kind="mail", key="m1", text="Meeting with Bartholomew tomorrow.")
    hits = pgtasks_index.search(iapp, "Bartholomeu", tenant="t")
    assert [(h.key, h.match) for h in hits] == [("m1", "trigram")]
    assert 0.0 < hits[0].rank <= 1.0
    # Fuzzy hits only stand in for missing results; they never pad exact ones.
    pgtasks_index.upsert(iapp, tenant="t", kind="mail", key="m2", text="Letter to Bartholomeu Dias.")
    hits = pgtasks_index.search(iapp, "Bartholomeu", tenant="t")
    assert [(h.key, h.match) for h in hits] == [("m2", "fulltext")]


def test_names_found_by_exact_word_whatever_the_language(iapp: pgtasks.App) -> None:
    # German stemming turns "Müllers" into "mull"; the simple-config tokens keep the
    # exact word, so an English-configured search still finds it.
    pgtasks_index.upsert(
        iapp,
        tenant="t",
        kind="document",
        key="de",
        language="german",
        text="Die Rechnungen des Herrn Müllers sind bezahlt.",
    )
    assert [h.key for h in pgtasks_index.search(iapp, "Müllers", tenant="t")] == ["de"]
    assert [h.key for h in pgtasks_index.search(iapp, "Rechnung", tenant="t", language="german")] == ["de"]


def test_limits_kinds_blank_queries_and_bad_arguments(iapp: pgtasks.App) -> None:
    for n in range(5):
        pgtasks_index.upsert(
            iapp,
            tenant="t",
            kind="document" if n % 2 else "mail",
            key=f"k{n}",
            text=f"common word number {n}",
        )
    assert len(pgtasks_index.search(iapp, "common", tenant="t", limit=3)) == 3
    assert {h.kind for h in pgtasks_index.search(iapp, "common", tenant="t", kinds=["mail"])} == {"mail"}
    assert pgtasks_index.search(iapp, "   ", tenant="t") == []
    with pytest.raises(ConfigurationError, match="limit"):
        pgtasks_index.search(iapp, "common", tenant="t", limit=0)
    with pytest.raises(ConfigurationError, match="unknown text-search language"):
        pgtasks_index.search(iapp, "common", tenant="t", language="klingon")
    with pytest.raises(ConfigurationError, match="kind"):
        pgtasks_index.upsert(iapp, tenant="t", kind="Bad Kind", key="x", text="y")
    with pytest.raises(ConfigurationError, match="key"):
        pgtasks_index.upsert(iapp, tenant="t", kind="mail", key="", text="y")
    # Wildcards in the query are literal in the substring fallback.
    assert pgtasks_index.search(iapp, "%", tenant="t") == []


def test_nul_characters_are_dropped_not_fatal(iapp: pgtasks.App) -> None:
    pgtasks_index.upsert(iapp, tenant="t", kind="document", key="nul", text="before\x00after", title="a\x00b")
    entry = pgtasks_index.get_entry(iapp, tenant="t", kind="document", key="nul")
    assert entry is not None and entry.body == "beforeafter" and entry.title == "ab"


def test_configured_default_language(iapp: pgtasks.App) -> None:
    pgtasks_index.configure(iapp, language="german")
    done = pgtasks_index.upsert(iapp, tenant="t", kind="document", key="x", text="Häuser")
    assert done.language == "german"
    assert [h.key for h in pgtasks_index.search(iapp, "Haus", tenant="t")] == ["x"]  # german stem


def test_app_search_delegates_to_the_plugin_hook(iapp: pgtasks.App, app: pgtasks.App) -> None:
    pgtasks_index.upsert(iapp, tenant="t", kind="document", key="x", text="delegated search works")
    hits = iapp.search("delegated", tenant="t")
    assert [h.key for h in hits] == ["x"]
    with pytest.raises(ConfigurationError, match="no search plugin"):
        app.search("delegated", tenant="t")  # the bare app has no index plugin


# -- delete ----------------------------------------------------------------------------


def test_delete_is_idempotent_and_all_or_nothing(iapp: pgtasks.App) -> None:
    pgtasks_index.upsert(iapp, tenant="t", kind="document", key="x", text="to be deleted")
    assert pgtasks_delete.delete_item(iapp, tenant="t", kind="document", key="x") == {"index_entries": 1}
    assert pgtasks_index.search(iapp, "deleted", tenant="t") == []
    assert pgtasks_delete.delete_item(iapp, tenant="t", kind="document", key="x") == {"index_entries": 0}
    assert pgtasks_delete.delete_item(iapp, tenant="t", kind="mail", key="never") == {"index_entries": 0}

    class Failing:
        def pgtasks_delete_item(self, tenant: str, kind: str, key: str, derived: bool) -> dict[str, int]:
            if derived:
                raise OSError("thumbnail store is down")
            return {"thumbnails": 0}

    iapp.plugin_manager.register(Failing())
    pgtasks_index.upsert(iapp, tenant="t", kind="document", key="y", text="kept when derived fails")
    with pytest.raises(OSError):
        pgtasks_delete.delete_item(iapp, tenant="t", kind="document", key="y", derived=True)
    assert [h.key for h in pgtasks_index.search(iapp, "kept", tenant="t")] == ["y"]  # rolled back
    removed = pgtasks_delete.delete_item(iapp, tenant="t", kind="document", key="y")
    assert removed == {"index_entries": 1, "thumbnails": 0}


def test_delete_joins_the_callers_transaction(iapp: pgtasks.App, dsn: str) -> None:
    pgtasks_index.upsert(iapp, tenant="t", kind="document", key="x", text="rollback keeps me")
    with psycopg.connect(dsn) as conn:
        pgtasks_delete.delete_item(iapp, tenant="t", kind="document", key="x", conn=conn)
        conn.rollback()
    assert pgtasks_index.get_entry(iapp, tenant="t", kind="document", key="x") is not None


# -- without pg_trgm -------------------------------------------------------------------


@pytest.fixture
def no_trgm_dsn(admin_dsn: str) -> Iterator[str]:
    """A database where ``CREATE EXTENSION pg_trgm`` fails, as on servers that do not offer it.

    Its search_path names no existing schema, so PostgreSQL has nowhere to create the
    extension ("no schema has been selected to create in"); pgtasks names its own
    schemas explicitly and is unaffected.
    """
    db = f"pgtasks_r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        conn.execute(sql.SQL("ALTER DATABASE {} SET search_path TO ''").format(sql.Identifier(db)))
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = db
    yield make_conninfo("", **params)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


def test_without_pg_trgm_migration_succeeds_and_search_falls_back_to_substrings(
    no_trgm_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = _index_app(no_trgm_dsn)
    try:
        caps = pgtasks_index.capabilities(app)
        assert caps.migrated and not caps.trigram and not caps.trigram_index
        assert "pg_trgm is not available" in caplog.text
        text = _corpus_text("content.txt")
        pgtasks_index.upsert(app, tenant="t", kind="document", key="content.txt", text=text)
        assert [h.match for h in pgtasks_index.search(app, "Привет", tenant="t")] == ["fulltext"]
        hits = pgtasks_index.search(app, "天气", tenant="t")
        assert [(h.key, h.match) for h in hits] == [("content.txt", "substring")]
        assert pgtasks_index.search(app, "Bartholomeu", tenant="t") == []  # no fuzzy matching
    finally:
        app.close()


# -- command line ------------------------------------------------------------------------


def test_search_command_prints_ranked_hits(
    iapp: pgtasks.App, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGTASKS_DISABLE_PLUGIN_AUTOLOAD", "1")
    pgtasks_index.upsert(
        iapp,
        tenant="acme",
        kind="document",
        key="doc-7",
        title="Quarterly report",
        text="Revenue grew in the third quarter.",
    )
    runner = CliRunner()
    args = ["--dsn", dsn, "--plugin", "pgtasks_index.plugin", "search", "revenue", "--tenant", "acme"]
    result = runner.invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "doc-7" in result.output and "Quarterly report" in result.output and "Revenue" in result.output
    result = runner.invoke(cli, [*args[:-2], "--tenant", "other"], catch_exceptions=False)
    assert result.exit_code == 0 and "no hits" in result.output
    result = runner.invoke(cli, [*args, "--json"], catch_exceptions=False)
    (hit,) = orjson.loads(result.stdout)
    assert (hit["tenant"], hit["kind"], hit["key"], hit["title"]) == (
        "acme",
        "document",
        "doc-7",
        "Quarterly report",
    )
    assert isinstance(hit["rank"], float) and "Revenue" in hit["snippet"]
    result = runner.invoke(cli, [*args[:-2], "--tenant", "other", "--json"], catch_exceptions=False)
    assert result.exit_code == 0 and orjson.loads(result.stdout) == []
    # Without the plugin there is no such command.
    result = runner.invoke(cli, ["--dsn", dsn, "search", "revenue"])
    assert result.exit_code == 2 and "No such command" in result.output
