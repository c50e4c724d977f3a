"""Smoke test of the benchmark harness: a tiny quick run, report checked figure by figure.

Runs ``python -m benchmarks run --quick --systems raw,pgtasks --n 500`` against the test
server and reads the Markdown report and the JSON of raw numbers it writes. Every
figure must have a table whose row for each system holds a positive median, and every
repetition must have produced a number.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DSN = os.environ.get("PGTASKS_TEST_DSN", "")
SYSTEMS = ("raw", "pgtasks")

# Section titles of docs/benchmarks.md, one per figure (benchmarks/figures.py).
FIGURE_SECTIONS = (
    "Enqueue, one call per job (jobs/s)",
    "Bulk enqueue (jobs/s)",
    "Processing throughput (jobs/s)",
    "Latency p50 (ms)",
    "Latency p95 (ms)",
    "Latency p99 (ms)",
    "Fairness: tenant B behind tenant A's backlog (s)",
    "Deep queue: throughput, shallow table (jobs/s)",
    "Deep queue: throughput, deep table (jobs/s)",
    "Table + index size after the shallow run (MiB)",
    "Table + index size after the deep run (MiB)",
    "Worker memory, peak RSS (MiB)",
    "Worker memory, peak anonymous RSS (MiB)",
    "Worker memory at equal work, peak RSS (MiB)",
    "Bulk enqueue in calls of 1,000 (jobs/s)",
    "Enqueue from 1 concurrent producer (jobs/s)",
    "Enqueue from 4 concurrent producers (jobs/s)",
    "Enqueue from 16 concurrent producers (jobs/s)",
    "Enqueue from 64 concurrent producers (jobs/s)",
    "Latency p50 at half the maximum throughput (ms)",
    "Latency p99 at half the maximum throughput (ms)",
)
# Further references that only the raw-SQL driver measures.
REFERENCE_SECTIONS = ("Bulk enqueue, raw multi-row INSERT reference (jobs/s)",)
# Figures whose `vs raw` is over another raw figure (raw's plain processing), though raw
# runs them too (the same mixed work, with the least SQL that does it).
SUBJECT_SECTIONS = ("Processing mixed work (jobs/s)",)
UNSUPPORTED: set[tuple[str, str]] = set()

pytestmark = pytest.mark.skipif(not DSN, reason="PGTASKS_TEST_DSN is not set")


def _run(command: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``command`` from the repository root; output captured as text, exit status kept."""
    return subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _sections(markdown: str) -> dict[str, str]:
    parts = re.split(r"^## ", markdown, flags=re.MULTILINE)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


def _median(section: str, system: str) -> float:
    match = re.search(rf"^\| {re.escape(system)} \| ([0-9.,]+) \|", section, flags=re.MULTILINE)
    assert match, f"no number for {system} in:\n{section}"
    return float(match.group(1).replace(",", ""))


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench") / "benchmarks.md"


@pytest.fixture(scope="module")
def smoke_run(smoke_out: Path) -> tuple[str, dict[str, object]]:
    command = [
        sys.executable, "-m", "benchmarks", "run", "--quick", "--systems", ",".join(SYSTEMS),
        "--n", "500", "--dsn", DSN, "--out", str(smoke_out),
    ]  # fmt: skip
    # A first run also creates raw's and pgtasks' virtual environments (pip, about 10 s
    # from pip's cache, longer from the index).
    done = _run(command, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return smoke_out.read_text(), json.loads(smoke_out.with_suffix(".json").read_text())


def test_report_links_its_throughput_and_latency_charts(
    smoke_run: tuple[str, dict[str, object]], smoke_out: Path
) -> None:
    markdown, _ = smoke_run
    section = _sections(markdown)["Plots"]
    for name in ("benchmarks-throughput.png", "benchmarks-latency.png"):
        assert f"]({name})" in section, section
        data = (smoke_out.parent / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
        assert width > 400 and height > 200, (name, width, height)


def test_report_is_written_again_from_the_runs_numbers(
    smoke_run: tuple[str, dict[str, object]], smoke_out: Path, tmp_path: Path
) -> None:
    """``python -m benchmarks report`` renders the same report from the JSON a run wrote,
    and leaves that file as it was."""
    markdown, _ = smoke_run
    numbers = tmp_path / "copy.json"
    original = smoke_out.with_suffix(".json").read_text()
    numbers.write_text(original)
    again = tmp_path / "again.md"
    command = [sys.executable, "-m", "benchmarks", "report", "--json", str(numbers), "--out", str(again)]
    done = _run(command, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert again.read_text() == markdown.replace("benchmarks-", "again-")
    assert (tmp_path / "again-throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert numbers.read_text() == original


def test_report_refuses_a_file_that_is_not_a_runs_numbers(tmp_path: Path) -> None:
    numbers = tmp_path / "bad.json"
    out = tmp_path / "report.md"
    for text in ("{not json", '{"mode": "quick"}'):
        numbers.write_text(text)
        command = [sys.executable, "-m", "benchmarks", "report", "--json", str(numbers), "--out", str(out)]
        done = _run(command, timeout=60)
        assert done.returncode == 2, (text, done.stderr)
        assert str(numbers) in done.stderr
        assert not out.exists()


def test_report_has_a_positive_median_per_figure_and_system(smoke_run: tuple[str, dict[str, object]]) -> None:
    markdown, _ = smoke_run
    sections = _sections(markdown)
    for title in FIGURE_SECTIONS:
        assert title in sections, f"missing figure {title!r}; sections: {list(sections)}"
        for system in SYSTEMS:
            assert _median(sections[title], system) > 0, (title, system)
    for title in SUBJECT_SECTIONS:
        assert _median(sections[title], "pgtasks") > 0, title
        assert _median(sections[title], "raw") > 0, title


def test_report_judges_every_claim_path_target(smoke_run: tuple[str, dict[str, object]]) -> None:
    markdown, _ = smoke_run
    section = _sections(markdown)["Claim-path targets"]
    verdicts = re.findall(r"^\| [^|]+ \| [^|]+ \| (met|missed) \|$", section, flags=re.MULTILINE)
    assert len(verdicts) == 5, section
    mixed = re.search(
        r"^\| mixed work [^|]+ \| ([0-9,.]+) jobs/s over raw's ([0-9,.]+): ([0-9.]+)x \|", section, re.M
    )
    assert mixed and float(mixed.group(3)) > 0, section


def test_latency_under_load_runs_at_half_the_processing_figure(
    smoke_run: tuple[str, dict[str, object]],
) -> None:
    _, results = smoke_run
    for system in SYSTEMS:
        runs = results["systems"][system]["runs"]  # type: ignore[index]
        for processing, loaded in zip(runs["throughput"], runs["latency_load"], strict=True):
            assert loaded["result"]["rate"] == 0.5 * processing["result"]["process_jobs_per_s"], system


def test_every_repetition_measured_every_figure(smoke_run: tuple[str, dict[str, object]]) -> None:
    _, results = smoke_run
    systems = results["systems"]
    assert isinstance(systems, dict)
    for system in SYSTEMS:
        entry = systems[system]
        assert entry["status"] == "ok", entry
        for figure, records in entry["runs"].items():
            assert len(records) == results["reps"] == 3, figure
            failures = [r["error"] for r in records if not r["ok"]]
            if (system, figure) in UNSUPPORTED:
                assert len(failures) == 3 and all(f.startswith("Unsupported: ") for f in failures), failures
            else:
                assert not failures, (system, figure, failures)


def test_report_names_the_command_machine_and_server_settings(
    smoke_run: tuple[str, dict[str, object]],
) -> None:
    markdown, results = smoke_run
    assert f"--quick --systems {','.join(SYSTEMS)} --n 500" in markdown
    assert "nproc:" in markdown
    for setting in ("shared_buffers=", "synchronous_commit=", "max_connections=", "server_version="):
        assert setting in markdown, setting
    latency = results["systems"]["raw"]["runs"]["latency"][0]["result"]  # type: ignore[index]
    assert latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"]


def test_worker_memory_splits_off_the_anonymous_part(smoke_run: tuple[str, dict[str, object]]) -> None:
    _, results = smoke_run
    for system in SYSTEMS:
        for record in results["systems"][system]["runs"]["throughput"]:  # type: ignore[index]
            memory = record["result"]
            assert 0 < memory["rss_anon_peak_bytes"] < memory["rss_peak_bytes"], (system, memory)


def test_cpu_probe_reports_both_sides_for_each_system() -> None:
    """``python -m benchmarks.cpu`` runs real workers and splits their CPU per job.

    5,000 jobs: CPU time is read in clock ticks (10 ms), so a smaller run can show 0.
    """
    command = [sys.executable, "-m", "benchmarks.cpu", "--jobs", "5000", "--reps", "1", "--dsn", DSN]
    done = _run(command, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for system in SYSTEMS:
        match = re.search(
            rf"^{system}\s+([0-9,]+) jobs/s\s+workers\s+([0-9.]+) µs\s+PostgreSQL backends\s+([0-9.]+) µs",
            done.stdout,
            flags=re.MULTILINE,
        )
        assert match, done.stdout
        rate, workers, backends = (float(g.replace(",", "")) for g in match.groups())
        assert rate > 0 and workers > 0 and backends > 0, match.group(0)


def test_cpu_probe_refuses_unknown_systems() -> None:
    command = [sys.executable, "-m", "benchmarks.cpu", "--systems", "celery", "--dsn", DSN]
    done = _run(command, timeout=60)
    assert done.returncode == 2
    assert "--systems" in done.stderr


def test_idle_probe_reports_each_depth() -> None:
    """``python -m benchmarks.idle`` fills future jobs, idles a real worker above them and
    reads its backends' CPU; a tiny run must print one line per depth."""
    command = [
        sys.executable, "-m", "benchmarks.idle", "--depths", "200,50", "--seconds", "1", "--reps", "1",
        "--dsn", DSN,
    ]  # fmt: skip
    done = _run(command, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(
        r"^\s*([0-9,]+) jobs due later: PostgreSQL backends\s+([0-9.]+) ms CPU/s", done.stdout, re.M
    )
    assert [int(depth.replace(",", "")) for depth, _ in found] == [50, 200], done.stdout
    assert all(float(ms) >= 0 for _, ms in found)


@pytest.mark.parametrize("bad", [["--depths", "ten"], ["--depths", "0"], ["--seconds", "0"]])
def test_idle_probe_refuses_bad_arguments(bad: list[str]) -> None:
    command = [sys.executable, "-m", "benchmarks.idle", *bad, "--dsn", DSN]
    done = _run(command, timeout=60)
    assert done.returncode == 2, done.stderr
    assert bad[0] in done.stderr


def test_tenants_probe_reports_each_tenant_count() -> None:
    """``python -m benchmarks.tenants`` drains a backlog spread over each tenant count with
    real workers; a tiny run must print one rate per count, the smallest at 1.00x."""
    command = [
        sys.executable, "-m", "benchmarks.tenants", "--tenants", "7,1", "--jobs", "5000", "--reps", "1",
        "--dsn", DSN,
    ]  # fmt: skip
    done = _run(command, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(r"^\s*([0-9,]+) tenants:\s+([0-9,]+) jobs/s .*, ([0-9.]+)x of 1$", done.stdout, re.M)
    assert [int(count) for count, _, _ in found] == [1, 7], done.stdout
    assert all(float(rate.replace(",", "")) > 0 for _, rate, _ in found)
    assert found[0][2] == "1.00"


@pytest.mark.parametrize("bad", [["--tenants", "many"], ["--tenants", "0"], ["--jobs", "5"]])
def test_tenants_probe_refuses_bad_arguments(bad: list[str]) -> None:
    command = [sys.executable, "-m", "benchmarks.tenants", *bad, "--dsn", DSN]
    done = _run(command, timeout=60)
    assert done.returncode == 2, done.stderr
    assert bad[0] in done.stderr


def test_producers_probe_reports_each_producer_count() -> None:
    """``python -m benchmarks.producers`` enqueues from concurrent threads with the wake-up
    after the commit, with it inside the commit, without it, pgtasks' own INSERT by bare
    psycopg (the floor) and the raw INSERT; a tiny run prints one line per count with the
    five rates and the five ratios."""
    command = [
        sys.executable, "-m", "benchmarks.producers", "--producers", "3,1", "--jobs", "60", "--reps", "1",
        "--dsn", DSN,
    ]  # fmt: skip
    done = _run(command, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(
        r"^\s*(\d+) producers: jobs/s wakeup ([0-9,]+) .* in-commit ([0-9,]+) .* silent ([0-9,]+) .*"
        r" floor ([0-9,]+) .* raw ([0-9,]+) .*; wakeup/silent ([0-9.]+)x wakeup/raw ([0-9.]+)x"
        r" in-commit/silent ([0-9.]+)x floor/raw ([0-9.]+)x wakeup/floor ([0-9.]+)x$",
        done.stdout,
        re.M,
    )
    assert [int(line[0]) for line in found] == [1, 3], done.stdout
    assert all(float(value.replace(",", "")) > 0 for line in found for value in line[1:])


@pytest.mark.parametrize("bad", [["--producers", "many"], ["--producers", "0"], ["--jobs", "3"]])
def test_producers_probe_refuses_bad_arguments(bad: list[str]) -> None:
    command = [sys.executable, "-m", "benchmarks.producers", *bad, "--dsn", DSN]
    done = _run(command, timeout=60)
    assert done.returncode == 2, done.stderr
    assert bad[0] in done.stderr


def test_raw_alone_measures_the_multi_row_insert_reference(smoke_run: tuple[str, dict[str, object]]) -> None:
    markdown, results = smoke_run
    sections = _sections(markdown)
    for title in REFERENCE_SECTIONS:
        section = sections[title]
        assert _median(section, "raw") > 0
        assert not re.search(r"^\| pgtasks \|", section, flags=re.MULTILINE), section
        line = r"^pgtasks's bulk enqueue median over this reference's: ([0-9.]+)x\.$"
        ratio = re.search(line, section, flags=re.MULTILINE)
        assert ratio and float(ratio.group(1)) > 0, section
    for system in SYSTEMS:
        for record in results["systems"][system]["runs"]["throughput"]:  # type: ignore[index]
            assert ("bulk_insert_jobs_per_s" in record["result"]) == (system == "raw"), (system, record)
    subject = sections["pgtasks relative to each system"]
    row = r"^\| Bulk enqueue over raw's multi-row INSERT \(jobs/s\) \| [0-9.]+x \|$"
    assert re.search(row, subject, flags=re.MULTILINE), subject


def test_bulk_probe_reports_each_variant_against_raw() -> None:
    """``python -m benchmarks.bulk`` times the raw multi-row INSERT, the COPY floor of
    pgtasks' rows and ``delay_many`` side by side; a tiny run prints one rate each."""
    command = [
        sys.executable, "-m", "benchmarks.bulk", "--calls", "2", "--chunk", "50", "--reps", "1", "--dsn", DSN,
    ]  # fmt: skip
    done = _run(command, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(r"^\s*(\w+):\s+([0-9,]+) jobs/s \(.*\), ([0-9.]+)x raw$", done.stdout, re.M)
    assert [name for name, _, _ in found] == ["raw", "floor", "pgtasks"], done.stdout
    assert all(float(rate.replace(",", "")) > 0 for _, rate, _ in found)
    assert found[0][2] == "1.00"


@pytest.mark.parametrize("bad", [["--calls", "0"], ["--chunk", "0"], ["--reps", "0"]])
def test_bulk_probe_refuses_bad_arguments(bad: list[str]) -> None:
    command = [sys.executable, "-m", "benchmarks.bulk", *bad, "--dsn", DSN]
    done = _run(command, timeout=60)
    assert done.returncode == 2, done.stderr
    assert bad[0] in done.stderr


def test_floor_probe_drains_both_tables_and_reports_against_raw() -> None:
    """``python -m benchmarks.floor`` drains raw's table and pgtasks' own with raw's worker
    loop, and pgtasks' own with its claim and success statements, here over 7 tenants (it
    fails if a job is left unfinished); a tiny run prints one rate each."""
    command = [
        sys.executable, "-m", "benchmarks.floor", "--jobs", "300", "--batch", "50", "--tenants", "7",
        "--reps", "1", "--dsn", DSN,
    ]  # fmt: skip
    done = _run(command, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(r"^\s*(\w+):\s+([0-9,]+) jobs/s \(.*\), ([0-9.]+)x raw$", done.stdout, re.M)
    assert [name for name, _, _ in found] == ["raw", "floor", "statements"], done.stdout
    assert all(float(rate.replace(",", "")) > 0 for _, rate, _ in found)
    assert found[0][2] == "1.00"


@pytest.mark.parametrize("bad", [["--jobs", "0"], ["--batch", "0"], ["--tenants", "0"], ["--reps", "0"]])
def test_floor_probe_refuses_bad_arguments(bad: list[str]) -> None:
    command = [sys.executable, "-m", "benchmarks.floor", *bad, "--dsn", DSN]
    done = _run(command, timeout=60)
    assert done.returncode == 2, done.stderr
    assert bad[0] in done.stderr
