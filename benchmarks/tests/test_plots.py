"""The report's charts: drawn from the summary, a bar only where a system has a number."""

from __future__ import annotations

from pathlib import Path

from benchmarks.plots import CHARTS, UNITS, write_plots


def _cell(median: float) -> dict[str, float | int | None]:
    return {"median": median, "min": median * 0.9, "max": median * 1.1, "n": 3}


def _empty() -> dict[str, float | int | None]:
    return {"median": None, "min": None, "max": None, "n": 0}


def test_each_chart_with_a_number_is_written_beside_the_report(tmp_path: Path) -> None:
    keys = [key for chart in CHARTS for key in chart.labels]
    summary = {key: {"raw": _cell(1000.0), "pgtasks": _cell(800.0)} for key in keys}
    summary["latency_p99"]["pgtasks"] = _empty()  # a failed figure: no bar, the chart still drawn
    written = write_plots(summary, ["raw", "pgtasks"], tmp_path / "report.md")
    assert [name for _, name in written] == ["report-throughput.png", "report-latency.png"]
    for _, name in written:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_chart_without_any_number_is_left_out(tmp_path: Path) -> None:
    summary = {key: {"raw": _cell(5000.0)} for key in CHARTS[0].labels}
    summary.update({key: {"raw": _empty()} for key in CHARTS[1].labels})
    written = write_plots(summary, ["raw"], tmp_path / "report.md")
    assert [name for _, name in written] == ["report-throughput.png"]
    assert not (tmp_path / "report-latency.png").exists()


def test_each_chart_shows_known_metrics_of_one_unit() -> None:
    # The y-axis label is the unit of the chart's first metric: it must be every one's.
    for chart in CHARTS:
        assert set(chart.labels) <= set(UNITS), chart.suffix
        assert len({UNITS[key] for key in chart.labels}) == 1, chart.suffix
