"""Open the HTML report in headless Chromium: it renders, every figure loads, no console errors."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from powertrain.analyze import synthetic
from powertrain.report import build_report
from powertrain.report.figures import TIME_AXIS_GID

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


def _axis_texts(svg_dom: str, gid: str) -> list[str]:
    """The text of the SVG group ``gid`` up to the next axis group (matplotlib writes the y axis next)."""
    start = svg_dom.find(f'id="{gid}"')
    assert start >= 0, f"no {gid} group in the rendered SVG"
    end = svg_dom.find('id="matplotlib.axis_', start)
    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg_dom[start:end if end > 0 else None])]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_run_timelines_carry_time_tick_labels(tmp_path):
    # Telemetry of 8 s: the shared time axis must show its values under the lowest data panel, even
    # with a "not measured" panel below it (this run lists power, temperature and clocks there).
    src = synthetic.write_run(tmp_path / "run", hosts=1, devices_per_host=2, fields=["util_pct", "mem_used_bytes"],
                              steps=6)
    build_report(src, tmp_path / "out", ("png", "svg"))
    svg = tmp_path / "out" / "figures" / "timelines.svg"
    dom = _chromium(["--dump-dom", svg.resolve().as_uri()], tmp_path / "profile")
    texts = _axis_texts(dom.stdout, TIME_AXIS_GID)
    ticks = [float(t.replace("\u2212", "-")) for t in texts if re.fullmatch(r"[\u2212-]?\d+(\.\d+)?", t)]
    assert len(ticks) >= 3, texts
    assert ticks == sorted(ticks) and ticks[0] <= 0.0 < ticks[-1], ticks  # seconds since the run started
    assert any("time since run start" in t for t in texts), texts
