"""The web dashboard in a real browser: Debian's headless Chromium through Selenium, against
``pgtasks dashboard`` served by uvicorn, with real worker and scheduler processes.

The tests click through every page, log in, perform each action and check its effect in
the database, check that a job whose arguments hold ``<script>`` renders inert, and save
a screenshot of each page under the test's output directory (and into
``$PGTASKS_SCREENSHOTS`` when set: the screenshots of docs/operations.md are made so).

Selenium is handed Debian's ``/usr/bin/chromedriver`` explicitly, so Selenium Manager
never runs and nothing is downloaded. Without ``/usr/bin/chromium`` the tests are skipped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.dashboard_app import NIGHTLY, make_app
from helpers import eventually
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgtasks

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[1]
APP_SPEC = "tests.apps.dashboard_app:app"
TOKEN = "browser-test-token"
XSS = "<script>alert('pgtasks')</script><img src=x onerror=\"alert('img')\">"

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)"),
    pytest.mark.skipif(not CHROMEDRIVER.exists(), reason="needs Debian's chromium-driver"),
]

selenium = pytest.importorskip("selenium")
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.selenium_manager import SeleniumManager  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _replaced(page: WebElement) -> bool:
    """Whether ``page`` (a page's ``html`` element) has left the document: stale, or,
    from Chromium caught mid-navigation, an inspector error saying its node no longer
    belongs to the document."""
    try:
        page.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


@dataclass
class Site:
    """The served dashboard, its database, the browser, and what the fixture enqueued."""

    url: str
    dsn: str
    app: pgtasks.App
    driver: WebDriver
    shots: list[Path]
    worker_pids: list[int]
    jobs: dict[str, int]

    def get(self, path: str) -> None:
        self.driver.get(self.url + path)

    def text(self, css: str) -> str:
        return str(self.driver.find_element(By.CSS_SELECTOR, css).text)

    def click(self, css: str) -> None:
        """Click what ``css`` finds and wait for the page it leads to."""
        page = self.driver.find_element(By.TAG_NAME, "html")
        self.driver.find_element(By.CSS_SELECTOR, css).click()
        WebDriverWait(self.driver, 15).until(lambda driver: _replaced(page))

    def screenshot(self, name: str) -> None:
        self.driver.execute_script("window.scrollTo(0, 0)")
        height = int(self.driver.execute_script("return document.documentElement.scrollHeight"))
        self.driver.set_window_size(1366, min(max(height, 700), 2000))  # the whole page
        try:
            for directory in self.shots:
                directory.mkdir(parents=True, exist_ok=True)
                assert self.driver.save_screenshot(str(directory / f"dashboard-{name}.png"))
        finally:
            self.driver.set_window_size(1366, 900)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


def _spawn(args: list[str], dsn: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    full_env = {**os.environ, "PGTASKS_DSN": dsn, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1", **env}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pgtasks", "-A", APP_SPEC, *args],
            cwd=REPO,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture(scope="module")
def site(admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    name = f"pgtasks_b_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_db)
            )
        )
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    dsn = make_conninfo("", **params)
    out = tmp_path_factory.mktemp("dashboard-browser")
    shots = [out / "screenshots"]
    if os.environ.get("PGTASKS_SCREENSHOTS"):
        shots.append(Path(os.environ["PGTASKS_SCREENSHOTS"]))
    app = make_app(dsn)
    app.schedules.sync()
    echo, fail, sleep = app.tasks["dash.echo"], app.tasks["dash.fail"], app.tasks["dash.sleep"]
    jobs: dict[str, int] = {}
    for i in range(12):
        echo.apply_async(args=(i,), tenant=("acme", "globex", "initech")[i % 3])
    for i in range(3):
        jobs[f"failed{i}"] = fail.apply_async(args=(f"user{i}", "pw-hunter2-secret"), tenant="acme").id
    jobs["xss"] = echo.apply_async(args=(XSS,), kwargs={"password": "pw-hunter2-secret"}, tenant="acme").id
    jobs["running"] = sleep.apply_async(args=(600.0,), tenant="globex").id
    jobs["later"] = echo.apply_async(args=("later",), countdown=3600, tenant="initech").id
    for i in range(6):
        echo.apply_async(args=(i,), countdown=3600, queue="reports", tenant="acme")
    jobs["run"] = app.schedules.trigger(NIGHTLY, requested_by="ops").id

    procs: list[subprocess.Popen[bytes]] = []
    driver: WebDriver | None = None
    try:
        for i in range(2):
            procs.append(
                _spawn(["worker", "-Q", "default,mail,backup", "-c", "2", "--shutdown-timeout", "1",
                        "--poll-interval", "0.2", "-n", f"web-{i + 1}"], dsn, out / f"worker{i}.log")
            )  # fmt: skip
        procs.append(_spawn(["scheduler", "--interval", "0.2"], dsn, out / "scheduler.log"))
        port = _free_port()
        procs.append(
            _spawn(
                ["dashboard", "--port", str(port)], dsn, out / "dashboard.log", PGTASKS_DASHBOARD_TOKEN=TOKEN
            )
        )

        def settled() -> bool:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'queued' AND run_at <= now()"
                    "                        AND queue <> 'reports'),"
                    "       count(*) FILTER (WHERE status = 'running' AND started_at IS NOT NULL),"
                    "       (SELECT last_outcome FROM pgtasks.schedules WHERE name = %s)"
                    " FROM pgtasks.jobs",
                    (NIGHTLY,),
                ).fetchone()
            return row is not None and row[0] == 0 and row[1] == 1 and row[2] == "partial_failure"

        eventually(settled, timeout=60, interval=0.2, message="jobs run by the workers")

        def serving() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return True
            except OSError:
                return False

        eventually(serving, timeout=30, interval=0.1, message="dashboard listening")
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--window-size=1366,900", "--disable-gpu", "--hide-scrollbars"):  # fmt: skip
            options.add_argument(argument)
        with pytest.MonkeyPatch.context() as mp:
            # Selenium Manager would download a driver: it must never run.
            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise AssertionError("Selenium Manager was asked for a driver")

            mp.setattr(SeleniumManager, "binary_paths", refuse)
            driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
        driver.set_page_load_timeout(20)
        yield Site(
            url=f"http://127.0.0.1:{port}",
            dsn=dsn,
            app=app,
            driver=driver,
            shots=shots,
            worker_pids=[p.pid for p in procs[:2]],
            jobs=jobs,
        )
    finally:
        if driver is not None:
            driver.quit()
        for proc in procs:
            _stop(proc)
        app.close()
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_every_page_renders_what_the_database_holds(site: Site) -> None:
    site.get("/")
    assert site.driver.title.startswith("Overview")
    # htmx (which refreshes the overview) comes from the package, and nothing from elsewhere.
    assert site.driver.execute_script("return typeof htmx") == "object"
    sources = site.driver.execute_script(
        "return [...document.querySelectorAll('script[src], link[href]')].map(e => e.src || e.href)"
    )
    assert sources and all(str(u).startswith(site.url + "/static/") for u in sources)
    default = site.text('#queues tr[data-queue="default"]')
    assert "13" in default  # 12 echo jobs and the <script> one succeeded
    mail = site.driver.find_element(By.CSS_SELECTOR, '#queues tr[data-queue="mail"] td[data-status="failed"]')
    assert mail.text == "3"
    assert "100.0 %" in site.text('#queues tr[data-queue="mail"]')
    assert len(site.driver.find_elements(By.CSS_SELECTOR, "#throughput rect")) >= 2
    site.screenshot("overview")

    site.click("#nav-jobs")
    assert site.driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    site.driver.find_element(By.CSS_SELECTOR, "#f-status option[value='failed']").click()
    site.driver.find_element(By.ID, "f-queue").send_keys("mail")
    site.click("#f-apply")
    rows = site.driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert {int(r.get_attribute("data-job") or 0) for r in rows} == {
        site.jobs[f"failed{i}"] for i in range(3)
    }
    site.screenshot("jobs")
    site.driver.find_element(By.ID, "f-queue").clear()
    site.driver.find_element(By.ID, "f-queue").send_keys("no-such-queue")
    site.click("#f-apply")
    assert site.text("#empty") == "No jobs match these filters."

    site.get(f"/jobs/{site.jobs['failed0']}")
    timeline = site.driver.find_elements(By.CSS_SELECTOR, "#timeline li.attempt")
    assert len(timeline) == 2 and "trigger retry" in timeline[1].text
    assert "pw-hunter2-secret" not in site.driver.page_source
    site.driver.find_element(By.CSS_SELECTOR, "#timeline details summary").click()
    assert "ValueError" in site.text("#timeline details pre")
    site.screenshot("job")

    site.click("#nav-workers")
    rows = site.driver.find_elements(By.CSS_SELECTOR, "#workers tbody tr")
    assert sorted(int(r.find_elements(By.TAG_NAME, "td")[1].text) for r in rows) == sorted(site.worker_pids)
    assert all("alive" in r.text for r in rows)
    running = sum(int(r.find_elements(By.TAG_NAME, "td")[6].text) for r in rows)
    assert running == 1  # the sleeping job
    site.screenshot("workers")

    site.click("#nav-schedules")
    assert "partial failure" in site.text(f'#schedules tr[data-schedule="{NIGHTLY}"]')
    site.click(f'#schedules tr[data-schedule="{NIGHTLY}"] a')
    assert len(site.driver.find_elements(By.CSS_SELECTOR, "#next-fires li")) == 5
    run = site.text(f'#runs tr[data-run="{site.jobs["run"]}"]')
    assert "manual" in run and "partial failure" in run and "files_failed=1" in run
    site.screenshot("schedule")

    site.click("#nav-tenants")
    tenants = {
        r.get_attribute("data-tenant")
        for r in site.driver.find_elements(By.CSS_SELECTOR, "#tenants tbody tr")
    }
    assert tenants == {"acme", "globex", "initech"}  # each has a backlog (queued later, or running)
    assert "75.0 %" in site.text('#tenants tr[data-tenant="acme"]')  # 6 of the 8 unfinished jobs
    site.screenshot("tenants")


def test_markup_in_arguments_renders_inert(site: Site) -> None:
    site.get(f"/jobs/{site.jobs['xss']}")
    with pytest.raises(NoAlertPresentException):
        site.driver.switch_to.alert.text  # noqa: B018
    shown = site.text("#job-args")
    # The text itself is visible (as JSON: the quotes escaped).
    assert "<script>alert('pgtasks')</script>" in shown and "<img src=x onerror=" in shown
    assert not site.driver.find_elements(By.CSS_SELECTOR, "main img")
    assert site.driver.execute_script("return document.querySelectorAll('main script').length") == 0
    assert "pw-hunter2-secret" not in site.driver.page_source


def test_log_in_and_act_from_the_browser(site: Site) -> None:
    site.get("/")
    site.click("#login-link")
    site.driver.find_element(By.ID, "token").send_keys("not the token")
    site.click("#login-submit")
    assert site.text("#problem") == "wrong token"
    site.driver.find_element(By.ID, "token").send_keys(TOKEN)
    site.click("#login-submit")
    assert "actions enabled" in site.text("header")

    # Cancel a job that waits, then retry it.
    later = site.jobs["later"]
    site.get(f"/jobs/{later}")
    site.click("#cancel")
    assert site.text("#flash") == f"job {later} cancelled"
    assert site.sql("SELECT status FROM pgtasks.jobs WHERE id = %s", later) == [("cancelled",)]
    site.click("#retry")
    assert site.text("#flash") == f"job {later} requeued"
    history = site.sql("SELECT attempts FROM pgtasks.jobs WHERE id = %s", later)[0][0]
    assert history[-1]["by"] == "dashboard" and history[-1]["from_status"] == "cancelled"

    # Requeue the failed mail jobs in bulk: the workers run them (and they fail again).
    site.get("/jobs?queue=mail")
    site.click("#bulk-requeue-submit")
    assert site.text("#flash") == "3 failed job(s) requeued"
    rounds = site.sql("SELECT count(*) FROM pgtasks.jobs WHERE queue = 'mail' AND attempt_base = 2")
    assert rounds == [(3,)]

    # Trigger, pause and resume the schedule.
    site.get(f"/schedules/{NIGHTLY}")
    before = site.sql("SELECT count(*) FROM pgtasks.jobs WHERE schedule_name = %s", NIGHTLY)[0][0]
    site.click("#trigger")
    assert "triggered: run" in site.text("#flash")
    assert site.sql("SELECT count(*) FROM pgtasks.jobs WHERE schedule_name = %s", NIGHTLY)[0][0] == before + 1
    site.click("#pause")
    assert site.text("#sched-state") == "paused"
    assert site.sql("SELECT paused FROM pgtasks.schedules WHERE name = %s", NIGHTLY) == [(True,)]
    site.screenshot("schedule-paused")
    site.click("#resume")
    assert site.text("#sched-state") == "active"
    assert site.sql("SELECT paused FROM pgtasks.schedules WHERE name = %s", NIGHTLY) == [(False,)]

    # A finished job offers no cancel; forcing one is refused and changes nothing.
    done = site.sql("SELECT id FROM pgtasks.jobs WHERE status = 'succeeded' ORDER BY id LIMIT 1")[0][0]
    site.get(f"/jobs/{done}")
    assert not site.driver.find_elements(By.ID, "cancel")
    site.driver.execute_script(
        "const f = document.createElement('form'); f.method = 'post';"
        "f.action = arguments[0]; const t = document.createElement('input'); t.name = 'csrf_token';"
        "t.value = document.querySelector('input[name=csrf_token]').value; f.appendChild(t);"
        "document.body.appendChild(f); f.submit();",
        f"{site.url}/jobs/{done}/cancel",
    )
    eventually(lambda: site.driver.find_elements(By.ID, "problem"), timeout=10)
    assert "already finished (succeeded); nothing changed" in site.text("#problem")
    assert site.sql("SELECT status FROM pgtasks.jobs WHERE id = %s", done) == [("succeeded",)]

    # Cancelling the running job asks its worker to stop it.
    site.get(f"/jobs/{site.jobs['running']}")
    site.click("#cancel")
    assert "asked to stop" in site.text("#flash")
    asked = site.sql("SELECT cancel_requested FROM pgtasks.jobs WHERE id = %s", site.jobs["running"])
    assert asked == [(True,)]
