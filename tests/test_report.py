"""The HTML report: one self-contained file (no CDN, plotly.js inlined once) that a real browser renders —
headless Chromium, with the network unreachable, runs its scripts, draws every plot (SVG in the DOM), takes a
screenshot that is not blank, and logs no console error. Bad input is one `error:` line.

Chromium is a Debian package (`apt-get install chromium`; .ci/run installs it): without it the browser
tests skip locally and fail in CI."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.clirun import assert_one_line_error
from tests.clirun import promptopt as run_cli

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

# Prepended to a copy of the page: records console.error, uncaught errors and failed resource loads in a
# DOM attribute that --dump-dom shows (headless Chromium's stderr does not say which console level).
_HOOK = """<script>(function(){var errs=[];function keep(m){errs.push(String(m));
document.documentElement.setAttribute('data-console-errors',JSON.stringify(errs));}
var orig=console.error;console.error=function(){keep(Array.prototype.join.call(arguments,' '));return orig.apply(console,arguments);};
window.addEventListener('error',function(e){keep(e.message||('failed to load '+((e.target&&(e.target.src||e.target.href))||'resource')));},true);
window.addEventListener('unhandledrejection',function(e){keep('unhandled rejection: '+e.reason);});})();</script>"""


def need_chromium() -> str:
    if CHROMIUM:
        return CHROMIUM
    if os.environ.get("CI"):
        pytest.fail("CI must provide Chromium: .ci/run installs the Debian package chromium")
    pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run installs it)")


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with no network (every host name fails to resolve) and a private profile."""
    command = [need_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}",
               "--virtual-time-budget=20000", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def rendered_dom(page: Path, tmp_path: Path) -> tuple[str, str]:
    hooked = tmp_path / ("hooked-" + page.name)
    hooked.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>" + _HOOK, 1), encoding="utf-8")
    proc = chromium(tmp_path / "profile-dom", "--dump-dom", hooked.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def console_errors(dom: str, stderr: str) -> list[str]:
    found = re.search(r"data-console-errors=\"([^\"]*)\"", dom)
    errors = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")) if found else []
    errors += [line for line in stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]
    return errors


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """A PNG's rows of pixels (8-bit RGB or RGBA), decoded with the stdlib only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        prev = line
    return width, bpp, rows


def ink(path: Path) -> tuple[int, float]:
    """(distinct colours, fraction of sampled pixels that differ from the most common colour)."""
    width, bpp, rows = png_pixels(path)
    sample = [row[x * bpp : x * bpp + 3] for row in rows[::5] for x in range(0, width, 5)]
    counts: dict[bytes, int] = {}
    for pixel in sample:
        counts[pixel] = counts.get(pixel, 0) + 1
    return len(counts), 1 - max(counts.values()) / len(sample)


# --- the run the report is about -------------------------------------------------------------------------
FAMILIES = """family,n_variants,dropped_not_applicable,dropped_protection,dropped_similarity,acc_clean_same_items,acc_perturbed,pdr,tcb_clean_mean,tcb_perturbed_mean
synonym,8,0,1,1,0.75,0.625,0.1667,3.1,2.9
typo,8,0,0,2,0.75,0.5,0.3333,3.1,2.4
distractor,4,0,0,0,0.75,0.75,0.0,3.1,3.0
"""
TABOO = """rank,n,accuracy,retention,retention_ci_low,retention_ci_high,marginal_retention
0,20,0.6,,,,
1,20,0.5,0.8333,0.5520,0.9530,0.5
2,20,0.4,0.6667,0.3906,0.8619,0.4
4,20,0.3,0.5,0.2538,0.7462,0.3
"""


@pytest.fixture(scope="module")
def compare_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    """A compare directory (a single-objective and a two-objective strategy) with a perturbation-family
    table and a taboo table where `evaluate --out` / `stress --out` would put them."""
    from promptopt.experiments import run_compare
    from promptopt.search import SearchConfig

    out = tmp_path_factory.mktemp("report") / "cmp"
    config = SearchConfig.build(task="sst2", trials=3, model=str(tiny_llama_dir), out=str(out), dev_limit=6, test_limit=4,
                                minibatch=3, device="cpu")
    run_compare(config, ["tcb", "pareto"], suite=None, show_progress=False)
    (out / "robustness.csv").write_text(FAMILIES)
    (out / "tcb" / "taboo.csv").write_text(TABOO)
    return out


@pytest.fixture(scope="module")
def report(compare_dir) -> Path:
    from promptopt.experiments.report import write_report

    return write_report(compare_dir, out=compare_dir / "report.html")


def test_report_is_one_self_contained_file(report):
    from plotly.offline import get_plotlyjs

    page = report.read_text(encoding="utf-8")
    assert page.count(get_plotlyjs()) == 1  # plotly.js inlined once
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=\"?https?:", page)
    # per strategy history + Pareto front (2 × 2), accuracy vs δ_TCB, perturbation families, taboo retention
    assert page.count("Plotly.newPlot(") == 7
    for text in ("Comparison", "tcb: optimization history", "tcb: Pareto front", "pareto: Pareto front", "Accuracy vs δ_TCB</h2>",
                 "Perturbation families", "Taboo retention vs rank", "95% Wilson intervals", "promptopt_card: 1"):
        assert text in page, text
    assert 4e6 < report.stat().st_size < 8e6


def test_report_renders_in_headless_chromium(report, tmp_path):
    dom, stderr = rendered_dom(report, tmp_path)
    figures = report.read_text(encoding="utf-8").count("Plotly.newPlot(")
    drawn = dom.count('class="plot-container plotly"')
    assert drawn == figures, (drawn, figures)  # every figure built its SVG after the scripts ran
    assert dom.count('<svg class="main-svg"') >= figures
    assert not console_errors(dom, stderr), console_errors(dom, stderr)
    shot = tmp_path / "report.png"
    proc = chromium(tmp_path / "profile-shot", "--window-size=1280,2400", f"--screenshot={shot}", report.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    colours, inked = ink(shot)
    assert colours > 20 and inked > 0.03, (colours, inked)  # not a blank page


def test_the_browser_checks_can_fail(tmp_path):
    """Guard against vacuous checks: a console error, a failed script load and a blank page are all seen."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head></head><body><script>console.error("broken plot")</script>'
                   '<script src="https://cdn.example.invalid/plotly.js"></script></body></html>')
    dom, stderr = rendered_dom(bad, tmp_path)
    errors = console_errors(dom, stderr)
    assert any("broken plot" in e for e in errors) and any("failed to load" in e for e in errors), errors
    shot = tmp_path / "blank.png"
    chromium(tmp_path / "profile-blank", "--window-size=400,300", f"--screenshot={shot}", bad.as_uri())
    assert ink(shot)[1] < 0.01




def test_report_cli_and_bad_input(compare_dir, tmp_path):
    proc = run_cli("report", compare_dir / "tcb", "--out", tmp_path / "tcb.html", "--taboo", compare_dir / "tcb" / "taboo.csv")
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and (tmp_path / "tcb.html").is_file()
    unfinished = tmp_path / "unfinished"
    shutil.copytree(compare_dir / "tcb", unfinished)
    (unfinished / "summary.json").unlink()
    out = tmp_path / "nothing.html"
    assert_one_line_error(run_cli("report", unfinished, "--out", out), "no finished study")
    assert_one_line_error(run_cli("report", compare_dir, "--out", out, "--taboo", tmp_path / "none.csv"), "--taboo", "file not found")
    (tmp_path / "wrong.csv").write_text("a,b\n1,2\n")
    assert_one_line_error(run_cli("report", compare_dir, "--out", out, "--robustness", tmp_path / "wrong.csv"), "--robustness", "missing column")
    assert not out.exists()
