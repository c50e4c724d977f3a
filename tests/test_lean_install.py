"""Lean installs: pgtasks without its extras, and workers that load only what they use.

``pip install pgtasks`` leaves out the OCR plugin's libraries (``pgtasks[ocr]``:
pypdfium2 and Pillow). Each case runs in a fresh interpreter in which the libraries
of the case cannot be imported (an import hook refuses them, as if they were not
installed), with the built-in plugins loaded through their entry points as in any
app.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from pgtasks.plugins import _missing_library

# Makes the modules named in BLOCKED (top-level names) impossible to import.
BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


def _run(code: str, *, blocked: set[str], dsn: str) -> tuple[dict[str, Any], str]:
    """Run ``code`` (which sets ``out``, a JSON-able dict) in a fresh interpreter with
    ``blocked`` not importable; returns ``out`` and what was logged on stderr."""
    script = BLOCKER.format(blocked=sorted(blocked)) + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-c", "import json, logging; logging.basicConfig(level=logging.INFO)\n" + script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PGTASKS_DSN": dsn, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_without_the_ocr_extra_the_plugin_reads_text_and_refuses_pdfs(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("quarterly invoice", encoding="utf-8")
    (tmp_path / "scan.pdf").write_bytes(b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    out, _ = _run(
        f"""
        import sys, pgtasks
        from pgtasks_ocr import extract_text
        from pgtasks.errors import Reject
        app = pgtasks.App("lean")
        out = {{"plugins": sorted(app.plugin_manager.skipped), "has_ocr_task": "pgtasks.ocr" in app.tasks}}
        out["text"] = extract_text({str(tmp_path / "note.txt")!r}, roots=[{str(tmp_path)!r}]).text
        for name in ("scan.pdf", "photo.png"):
            try:
                extract_text({str(tmp_path)!r} + "/" + name, roots=[{str(tmp_path)!r}])
            except Reject as exc:
                out[name] = [exc.code, str(exc)]
        """,
        blocked={"PIL", "pypdfium2"},
        dsn=dsn,
    )
    assert out["plugins"] == [] and out["has_ocr_task"] is True
    assert out["text"] == "quarterly invoice"
    for name, libraries in (("scan.pdf", "pypdfium2 and Pillow"), ("photo.png", "Pillow")):
        code, message = out[name]
        assert code == "OCR_UNAVAILABLE"
        assert libraries in message and "pip install 'pgtasks[ocr]'" in message


def test_a_built_in_plugin_whose_library_is_missing_is_skipped_with_one_log_line(dsn: str) -> None:
    out, log = _run(
        """
        import pgtasks
        apps = [pgtasks.App("lean"), pgtasks.App("lean-again")]
        out = {"skipped": apps[0].plugin_manager.skipped, "tasks": sorted(apps[1].tasks)}
        """,
        blocked={"prometheus_client"},
        dsn=dsn,
    )
    reason = "it needs prometheus_client, which is not installed (pip install 'pgtasks[metrics]')"
    assert out["skipped"] == {"pgtasks_metrics": reason}
    assert "pgtasks.ocr" in out["tasks"]  # the other built-in plugins load as usual
    assert log.count("built-in plugin pgtasks_metrics skipped") == 1, log


def test_a_worker_does_not_load_the_ocr_libraries_until_a_job_needs_them(dsn: str) -> None:
    out, _ = _run(
        """
        import sys, pgtasks
        from pgtasks.worker import Worker, WorkerConfig
        app = pgtasks.App("lean")
        Worker(app, WorkerConfig(queues=("ocr",), burst=True, poll_interval=0.1)).run()
        out = {"loaded": sorted(m for m in ("PIL", "pypdfium2") if m in sys.modules)}
        """,
        blocked=set(),
        dsn=dsn,
    )
    assert out["loaded"] == []


def test_a_missing_module_of_a_third_party_or_of_the_plugin_itself_stays_an_error() -> None:
    missing = ModuleNotFoundError("No module named 'PIL'", name="PIL")
    third_party = importlib.metadata.EntryPoint("other", "other_plugin.plugin", "pgtasks")
    assert _missing_library(third_party, missing) is None  # no distribution: not built in
    ocr = next(ep for ep in importlib.metadata.entry_points(group="pgtasks") if ep.name == "pgtasks_ocr")
    reason = "it needs PIL, which is not installed (pip install 'pgtasks[ocr]')"
    assert _missing_library(ocr, missing) == reason
    own = ModuleNotFoundError("No module named 'pgtasks_ocr.gone'", name="pgtasks_ocr.gone")
    assert _missing_library(ocr, own) is None  # a broken install of the plugin itself
