"""Open the HTML report in headless Chromium: it renders, every figure loads, no console errors."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from powertrain.analyze import synthetic
from powertrain.report import build_report

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]


# Chromium logs page console messages as "INFO:CONSOLE:<line>" (older builds "CONSOLE(<line>)").
CONSOLE_PROBLEM = r"CONSOLE[:(]\d+|Uncaught|Failed to load resource"


def _chromium(args: list[str], profile) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.parametrize("kind", ["run", "sweep"])
def test_report_renders_in_chromium(tmp_path, kind):
    if kind == "run":
        src = synthetic.write_run(tmp_path / "run", hosts=2, devices_per_host=2, steps=3, straggle_s=0.02)
    else:
        src = synthetic.write_sweep(tmp_path / "sweep")
    html = build_report(src, tmp_path / "out", ("png",))
    url = html.resolve().as_uri()

    shot = tmp_path / "shot.png"
    r = _chromium(["--window-size=1300,2400", f"--screenshot={shot}", url], tmp_path / "profile1")
    assert shot.is_file() and shot.stat().st_size > 20_000, r.stderr[-2000:]
    assert not re.search(CONSOLE_PROBLEM, r.stderr), r.stderr[-2000:]

    dom = _chromium(["--dump-dom", url], tmp_path / "profile2")
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stderr[-2000:]
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    html_tag = re.search(r"<html([^>]*)>", dom.stdout)
    assert html_tag and "data-errors" not in html_tag.group(1), html_tag
    n_img = len(re.findall(r"<img ", html.read_text()))
    assert int(attrs["figures"]) == n_img >= 3
    assert attrs["loaded"] == attrs["figures"]  # every figure decoded (complete and naturalWidth > 0)
    assert not re.search(CONSOLE_PROBLEM, dom.stderr), dom.stderr[-2000:]
