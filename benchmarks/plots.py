"""PNG bar charts of the report's throughput and latency figures, drawn with matplotlib.

Each chart groups the figures on the x axis and gives every system one bar per
figure: the median over the repetitions, with a whisker from the minimum to the
maximum. Throughput spans three orders of magnitude between the systems, so its
axis is logarithmic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

from matplotlib import pyplot as plt  # after the backend is chosen

from benchmarks.figures import METRICS, Summary

UNITS = {metric.key: metric.unit for metric in METRICS}


@dataclass(frozen=True, slots=True)
class Chart:
    """One PNG: its file suffix, caption, the metrics it shows (key -> x-axis label; one
    unit, that of the metrics), and whether its axis is logarithmic."""

    suffix: str
    caption: str
    labels: dict[str, str]
    log: bool


CHARTS = (
    Chart(
        "throughput",
        "Throughput (jobs/s, log scale; whiskers: min-max)",
        {
            "enqueue_one": "enqueue,\none call per job",
            "enqueue_bulk": "bulk enqueue",
            "process": "processing,\nno ANALYZE",
            "process_stats_empty": "processing,\nstats while empty",
            "process_analyzed": "processing,\nanalyzed",
            "deep_small": "deep queue,\nshallow table",
            "deep_large": "deep queue,\ndeep table",
        },
        log=True,
    ),
    Chart(
        "latency",
        "Latency, enqueue call to task start (ms; whiskers: min-max)",
        {"latency_p50": "p50", "latency_p95": "p95", "latency_p99": "p99"},
        log=False,
    ),
)


def write_plots(summary: Summary, systems: list[str], markdown_path: Path) -> list[tuple[str, str]]:
    """Draw every chart of `CHARTS` next to the report; return its (caption, file name) pairs.

    Args:
        summary: `benchmarks.report.summarize` of the results.
        systems: the systems to draw, in the order of their bars.
        markdown_path: the report; chart ``X`` goes to ``<its stem>-X.png`` beside it.

    A figure without a number for a system (skipped, failed) has no bar for it; a
    chart with no number at all is not written.
    """
    written = []
    for chart in CHARTS:
        path = markdown_path.with_name(f"{markdown_path.stem}-{chart.suffix}.png")
        if _draw(chart, summary, systems, path):
            written.append((chart.caption, path.name))
    return written


def _draw(chart: Chart, summary: Summary, systems: list[str], path: Path) -> bool:
    keys = list(chart.labels)
    width = 0.8 / max(len(systems), 1)
    figure, axes = plt.subplots(figsize=(9.0, 4.5))
    drawn = False
    for i, system in enumerate(systems):
        xs: list[float] = []
        medians: list[float] = []
        below: list[float] = []
        above: list[float] = []
        for j, key in enumerate(keys):
            cell = summary.get(key, {}).get(system, {})
            median, low, high = cell.get("median"), cell.get("min"), cell.get("max")
            if median is None or low is None or high is None or (chart.log and median <= 0):
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            medians.append(float(median))
            below.append(float(median) - float(low))
            above.append(float(high) - float(median))
        if xs:
            axes.bar(xs, medians, width, yerr=[below, above], capsize=2, label=system)
            drawn = True
    if drawn:
        axes.set_xticks(range(len(keys)), [chart.labels[k] for k in keys])
        axes.set_ylabel(UNITS[keys[0]])
        if chart.log:
            axes.set_yscale("log")
        axes.grid(axis="y", alpha=0.3)
        # Below the axes: inside, it would cover the tallest bars.
        axes.legend(fontsize="small", ncols=len(systems), loc="upper center", bbox_to_anchor=(0.5, -0.16))
        axes.set_title(chart.caption)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return drawn
