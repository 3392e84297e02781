"""The HTML report answers the run's question first: the verdict sentences and the paired table must say what
compare_paired.csv says, the family section what was measured, the card section the card `export` writes.
It is one self-contained file (no CDN, plotly.js inlined once) that a real browser renders — headless
Chromium, with the network unreachable, runs its scripts, draws every plot with data in it, takes a
screenshot that is not blank, and logs no console error. Every kind of run directory renders (search,
compare with one seed and with several, evaluate, sweep). Bad input is one `error:` line.

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
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.clirun import assert_one_line_error
from tests.clirun import promptopt as run_cli
from tests.study.test_table_sets import reseal

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

# Prepended to a copy of the page: records console.error, warnings (console.warn, and plotly's "WARN:" lines
# through console.trace/log: a bad attribute it ignores), uncaught errors and failed resource loads in a
# DOM attribute that --dump-dom shows (headless Chromium's stderr does not say which console level); once the
# page has loaded, how many marks (points, heatmap images, lines) each plot container drew.
_HOOK = """<script>(function(){var errs=[];function keep(m){errs.push(String(m));
document.documentElement.setAttribute('data-console-errors',JSON.stringify(errs));}
var orig=console.error;console.error=function(){keep(Array.prototype.join.call(arguments,' '));return orig.apply(console,arguments);};
['warn','trace','log'].forEach(function(level){var f=console[level];console[level]=function(){var m=Array.prototype.join.call(arguments,' ');
if(level==='warn'||m.indexOf('WARN:')===0)keep('warning: '+m);return f.apply(console,arguments);};});
window.addEventListener('error',function(e){keep(e.message||('failed to load '+((e.target&&(e.target.src||e.target.href))||'resource')));},true);
window.addEventListener('unhandledrejection',function(e){keep('unhandled rejection: '+e.reason);});
window.addEventListener('load',function(){setTimeout(function(){var out=[];
document.querySelectorAll('div.plot').forEach(function(p){
out.push([p.getAttribute('data-plot'),p.querySelectorAll('path.point, .hm image, .js-line').length]);});
document.documentElement.setAttribute('data-plot-marks',JSON.stringify(out));},0);});})();</script>"""


def need_chromium() -> str:
    if CHROMIUM:
        return CHROMIUM
    if os.environ.get("CI"):
        pytest.fail("CI must provide Chromium: .ci/run installs the Debian package chromium")
    pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run installs it)")


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with no network (every host name fails to resolve) and a private profile."""
    command = [
        need_chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=20000",
        *args,
    ]
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


def plot_marks(dom: str) -> dict[str, int]:
    """Plot container name -> marks drawn (summed over containers of one name)."""
    found = re.search(r"data-plot-marks=\"([^\"]*)\"", dom)
    assert found, "the plot counter never ran"
    marks: dict[str, int] = {}
    for name, n in json.loads(found.group(1).replace("&quot;", '"')):
        marks[name] = marks.get(name, 0) + n
    return marks


class Cells(HTMLParser):
    """Rows of one table (by id): the row's data-* attributes and its cells' (text, data-* attributes); and
    the text of every verdict sentence (li.verdict), keyed by its pair."""

    def __init__(self, table_id: str):
        super().__init__()
        self.table_id, self.depth, self.rows, self.verdicts = table_id, 0, [], {}
        self._cell = self._li = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.depth += 1 if (self.depth or attrs.get("id") == self.table_id) else 0
        elif self.depth and tag == "tr":
            self.rows.append((attrs, []))
        elif self.depth and tag == "td":
            self._cell = [attrs, ""]
        if tag == "li" and attrs.get("class") == "verdict":
            self._li = [(attrs["data-a"], attrs["data-b"]), ""]

    def handle_endtag(self, tag):
        if tag == "table" and self.depth:
            self.depth -= 1
        elif tag == "td" and self._cell is not None:
            self.rows[-1][1].append((self._cell[1].strip(), self._cell[0]))
            self._cell = None
        elif tag == "li" and self._li is not None:
            self.verdicts[self._li[0]] = " ".join(self._li[1].split())
            self._li = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data + " "
        if self._li is not None:
            self._li[1] += data


def parse(page: str, table_id: str) -> Cells:
    cells = Cells(table_id)
    cells.feed(page)
    return cells


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?", text.replace("\u2212", "-"))]


# --- the runs the report is about --------------------------------------------------------------------------
SUITE = """name: tiny
seed: 7
similarity_threshold: 0.5
variants_per_item: 1
distractors: {distractors}
families:
  typo: {{operator: keyboard_typos, max_chars: 1, max_words: 2}}
  distractor: {{operator: distractor}}
"""
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
def suite_file(tmp_path_factory) -> Path:
    """Two cheap families (no WordNet to load), for `evaluate`."""
    path = tmp_path_factory.mktemp("suite") / "tiny.yaml"
    path.write_text(SUITE.format(distractors=REPO / "perturbations" / "distractors.txt"))
    return path


def _config(tiny_llama_dir, out, **extra):
    from promptopt.study import SearchConfig

    settings = {"task": "sst2", "trials": 3, "dev_limit": 6, "test_limit": 8, "minibatch": 3, "seed": 2, **extra}
    return SearchConfig.build(model=str(tiny_llama_dir), out=str(out), device="cpu", **settings)


@pytest.fixture(scope="module")
def compare_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    """A real compare (tiny model, one seed, top 2, robustness on 4 items under the built-in quick suite)."""
    from promptopt.workflows.compare import run_compare

    out = tmp_path_factory.mktemp("report") / "cmp"
    run_compare(
        _config(tiny_llama_dir, out), ["tcb", "ppl"], top_n=2, suite="quick", robust_limit=4, show_progress=False
    )
    return out


@pytest.fixture(scope="module")
def seeds_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    from promptopt.workflows.compare import run_compare

    out = tmp_path_factory.mktemp("report") / "seeds"
    run_compare(
        _config(tiny_llama_dir, out, trials=2, dev_limit=4, test_limit=4, minibatch=2),
        ["accuracy", "tcb"],
        seeds=2,
        top_n=1,
        suite=None,
        show_progress=False,
    )
    return out


@pytest.fixture(scope="module")
def report(compare_dir) -> Path:
    from promptopt.report import write_report

    return write_report(compare_dir, out=compare_dir.parent / "report.html")


@pytest.fixture(scope="module")
def dom(report, tmp_path_factory) -> str:
    page, stderr = rendered_dom(report, tmp_path_factory.mktemp("dom"))
    assert not console_errors(page, stderr), console_errors(page, stderr)
    return page


# --- the page itself ------------------------------------------------------------------------------------------
def test_report_is_one_self_contained_file(report):
    from plotly.offline import get_plotlyjs

    from promptopt.report import MAX_BYTES

    page = report.read_text(encoding="utf-8")
    assert page.count(get_plotlyjs()) == 1  # plotly.js inlined once
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=\"?https?:", page)
    assert page.count("Plotly.newPlot(") == page.count('<div class="plot"')
    assert (
        page.index('id="verdict"')
        < page.index('id="paired"')
        < page.index('id="strategies"')
        < page.index('id="robustness"')
    )
    assert report.stat().st_size < MAX_BYTES


@pytest.mark.long
def test_report_renders_in_headless_chromium(report, dom, tmp_path):
    figures = report.read_text(encoding="utf-8").count("Plotly.newPlot(")
    assert dom.count('class="plot-container plotly"') == figures  # every figure built its SVG after the scripts ran
    marks = plot_marks(dom)
    # the forest plot, the winners' robustness, one history per strategy, accuracy vs δ_TCB
    assert {"forest", "robustness-winners", "history-tcb", "history-ppl", "scatter"} <= set(marks), marks
    assert all(n > 0 for n in marks.values()), marks  # every plot container holds data
    shot = tmp_path / "report.png"
    proc = chromium(tmp_path / "profile-shot", "--window-size=1280,2400", f"--screenshot={shot}", report.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    colours, inked = ink(shot)
    assert colours > 20 and inked > 0.03, (colours, inked)  # not a blank page


def test_the_browser_checks_can_fail(tmp_path):
    """Guard against vacuous checks: a console error or warning, a failed script load, a blank page and an
    empty plot container are all seen."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head></head><body><script>console.error("broken plot");console.warn("bad colour");console.trace("WARN:","plotly ignored it")</script>'
        '<script src="https://cdn.example.invalid/plotly.js"></script><div class="plot" data-plot="empty"></div></body></html>'
    )
    dom, stderr = rendered_dom(bad, tmp_path)
    errors = console_errors(dom, stderr)
    assert any("broken plot" in e for e in errors) and any("failed to load" in e for e in errors), errors
    assert "warning: bad colour" in errors and "warning: WARN: plotly ignored it" in errors
    assert plot_marks(dom) == {"empty": 0}
    shot = tmp_path / "blank.png"
    chromium(tmp_path / "profile-blank", "--window-size=400,300", f"--screenshot={shot}", bad.as_uri())
    assert ink(shot)[1] < 0.01


# --- what it says ---------------------------------------------------------------------------------------------
def assert_page_says(page: str, paired) -> None:
    """The paired table holds compare_paired.csv's numbers (exactly in data-*, rounded on screen) and each
    verdict clause says significant exactly where compare's flags do."""
    from promptopt.report.verdict import metrics_of

    found = parse(page, "paired-table")
    rows = {(attrs["data-a"], attrs["data-b"]): cells for attrs, cells in found.rows if "data-a" in attrs}
    assert set(rows) == set(zip(paired["a"], paired["b"]))
    metrics = metrics_of(paired)  # quick judged under the search suite cheap: seen and unseen families, labelled
    assert [m.col for m in metrics] == [
        "delta_acc",
        "delta_acc_worst_seen",
        "delta_acc_worst_unseen",
        "delta_pdr_seen",
        "delta_pdr_unseen",
    ]
    for _, r in paired.iterrows():
        cells = {attrs["data-col"]: (text, attrs) for text, attrs in rows[(r["a"], r["b"])] if "data-col" in attrs}
        for col in [m.col for m in metrics] + ["mcnemar_p", "n_pairs"]:
            text, attrs = cells[col]
            assert float(attrs["data-v"]) == r[col], (col, attrs, r[col])  # the exact number
            shown = numbers(text)
            assert shown[0] == pytest.approx(r[col], abs=0.0051), (col, text)  # and what the reader sees, rounded
            if col.startswith("delta_"):
                assert (float(attrs["data-low"]), float(attrs["data-high"])) == (
                    r[f"{col}_ci_low"],
                    r[f"{col}_ci_high"],
                )
                assert shown[1:] == pytest.approx([r[f"{col}_ci_low"], r[f"{col}_ci_high"]], abs=0.0051), (col, text)
        sentence = found.verdicts[(r["a"], r["b"])]
        flags = {
            m.label: str(r["significant"]).lower() == "true"
            if m.base == "acc"
            else bool(r[f"{m.col}_ci_low"] > 0 or r[f"{m.col}_ci_high"] < 0)
            for m in metrics
        }
        if "no difference" in sentence:
            assert not any(flags.values()) and r["only_a_correct"] == r["only_b_correct"] == 0, sentence
            continue
        clauses = dict(
            re.match(r"(accuracy|(?:Acc_worst|PDR)(?: \((?:seen|unseen)\))?) (.*)", c.strip()).groups()
            for c in sentence.split(":", 1)[1].split(";")
        )
        for label, flag in flags.items():
            assert ("significant (favours" in clauses[label]) == flag, (label, sentence)
            assert ("not significant" in clauses[label]) == (not flag), (label, sentence)
            if label == "accuracy" and not flag:  # one rule, said where it decides: which of its two parts held
                low, high, p = r["delta_acc_ci_low"], r["delta_acc_ci_high"], r["mcnemar_p"]
                excludes = low > 0 or high < 0
                if excludes != (p < 0.05):
                    assert ("excludes 0 but McNemar" if excludes else "but its interval includes 0") in sentence, (
                        sentence
                    )
                else:
                    assert "both must agree" not in clauses[label], sentence


def test_paired_table_and_verdict_say_what_compare_paired_csv_says(compare_dir, dom):
    import pandas as pd

    paired = pd.read_csv(compare_dir / "compare_paired.csv")
    assert (
        len(paired) == 3
    )  # tcb vs ppl and each against the default prompt (ties or not: the next test edits in differences)
    assert_page_says(dom, paired)


def test_paired_table_and_verdict_follow_an_edited_csv(compare_dir, tmp_path):
    """The same checks on numbers no rounding hides, with significant differences of each kind."""
    import pandas as pd

    from promptopt.report import build_report

    run = tmp_path / "cmp"
    shutil.copytree(compare_dir, run)
    paired = pd.read_csv(run / "compare_paired.csv")
    paired["delta_acc"], paired["delta_acc_ci_low"], paired["delta_acc_ci_high"] = 0.0371, 0.0123, 0.0618
    paired["mcnemar_p"], paired["significant"], paired["only_a_correct"] = 0.0312, True, 5
    paired.loc[1, ["mcnemar_p", "significant"]] = [
        0.0714,
        False,
    ]  # interval excludes 0, McNemar does not: not significant
    for split in ("", "_seen", "_unseen"):
        (
            paired[f"delta_acc_worst{split}"],
            paired[f"delta_acc_worst{split}_ci_low"],
            paired[f"delta_acc_worst{split}_ci_high"],
        ) = -0.1666, -0.2917, -0.0417
        paired[f"delta_pdr{split}"], paired[f"delta_pdr{split}_ci_low"], paired[f"delta_pdr{split}_ci_high"] = (
            0.0833,
            -0.0417,
            0.2083,
        )
    paired.to_csv(run / "compare_paired.csv", index=False)
    reseal(run)  # changed on purpose: sealed again as a complete set
    page = build_report(run)
    assert_page_says(page, pd.read_csv(run / "compare_paired.csv"))
    # compare's flag decides, not the interval alone, and the sentence says so where it decides
    assert (
        "McNemar p = 0.07, not significant: its interval excludes 0 but McNemar p = 0.07 ≥ 0.05, and both must agree"
        in page
    )


def test_verdict_sentences_follow_the_significance_flags():
    """Constructed pairs, significant and not, with seen/unseen robustness columns as a later compare may write."""
    import pandas as pd

    from promptopt.report.verdict import metrics_of, paired_section, sentence, verdict_compare

    row = {
        "a": "tcb",
        "b": "ppl",
        "n_pairs": 300,
        "delta_acc": 0.017,
        "delta_acc_ci_low": -0.027,
        "delta_acc_ci_high": 0.060,
        "only_a_correct": 20,
        "only_b_correct": 15,
        "mcnemar_p": 0.5,
        "significant": False,
        "delta_acc_worst_seen": 0.17,
        "delta_acc_worst_seen_ci_low": 0.06,
        "delta_acc_worst_seen_ci_high": 0.29,
        "delta_acc_worst_unseen": -0.05,
        "delta_acc_worst_unseen_ci_low": -0.12,
        "delta_acc_worst_unseen_ci_high": 0.02,
        "delta_pdr": -0.2,
        "delta_pdr_ci_low": -0.3,
        "delta_pdr_ci_high": -0.1,
    }
    strong = {
        **row,
        "a": "tcb",
        "b": "accuracy",
        "delta_acc": 0.1,
        "delta_acc_ci_low": 0.05,
        "delta_acc_ci_high": 0.15,
        "mcnemar_p": 0.001,
        "significant": True,
    }
    paired = pd.DataFrame([row, strong])
    metrics = metrics_of(paired)
    assert [m.label for m in metrics] == ["accuracy", "Acc_worst (seen)", "Acc_worst (unseen)", "PDR"]
    text = sentence(paired.iloc[0], metrics, "300 paired test items").replace("\u2212", "-")
    assert "accuracy +0.017 [-0.027, 0.060], McNemar p = 0.50, not significant" in text
    assert "Acc_worst (seen) +0.17 [0.06, 0.29], significant (favours tcb)" in text
    assert "Acc_worst (unseen) -0.050 [-0.120, 0.020], not significant" in text
    assert "PDR -0.20 [-0.30, -0.10], significant (favours tcb)" in text  # a lower drop rate is the better one
    assert "accuracy +0.100 [0.050, 0.150], McNemar p = 1.0e-03, significant (favours tcb)" in sentence(
        paired.iloc[1], metrics, "n"
    )
    page = verdict_compare(paired, {"seeds": 1, "n_robust": 100, "suite": "unseen"})
    assert "2 of 2 pairs of strategies differ significantly" in page and page.index("tcb vs ppl") < page.index(
        "tcb vs accuracy"
    )
    # two seeds: the p is the sign-flip test over items, and every place that shows it names it
    two = paired.assign(paired_test="exact sign-flip over items (2 seeds)")
    assert "accuracy +0.017 [-0.027, 0.060], sign-flip over items (2 seeds) p = 0.50, not significant" in sentence(
        two.iloc[0], metrics, "n"
    ).replace("\u2212", "-")
    assert "McNemar" not in sentence(two.iloc[0], metrics, "n")
    table = paired_section(two, {"seeds": 2})
    assert "0.50 (sign-flip over items (2 seeds))" in table and "sign-flip test over items" in table
    from promptopt.report.recommend import against

    assert "sign-flip over items (2 seeds) p = 0.50" in against(two.iloc[0].to_dict(), "tcb", "ppl")


def test_numbers_are_rounded_to_their_interval():
    from promptopt.report.numbers import estimate, sig

    assert estimate(0.0167, -0.0271, 0.0604, signed=True) == "+0.017 [\u22120.027, 0.060]"
    assert estimate(0.1712, 0.0633, 0.2891, signed=True) == "+0.17 [0.06, 0.29]"
    assert estimate(0.725, 0.5717, 0.8389) == "0.72 [0.57, 0.84]"
    assert estimate(0.5, None, None) == "0.500" and sig(39716.27) == "39,716" and sig(2.0783) == "2.08"


def test_family_section_lists_the_families_measured(dom):
    section = dom[dom.index('id="robustness"') : dom.index('id="card"')]
    listed = re.search(r'class="families" data-families="([^"]*)"', section)
    assert listed and listed.group(1).split(",") == ["synonym", "exemplar_reorder", "distractor", "typos_keyboard"], (
        section[:2000]
    )
    assert "Families measured (robustness_items.parquet)" in section  # compare keeps every answer now
    assert "distractor (unseen)" in section and "synonym (seen)" in section  # judged under quick, searched under cheap
    assert "not measured here" not in dom


def test_card_section_shows_the_card_export_writes(compare_dir, dom, tmp_path):
    from promptopt.workflows.export import export_run

    exported = export_run(compare_dir, out=tmp_path / "card.yaml")
    section = dom[dom.index('id="card"') : dom.index('id="search"')]
    search = exported.card["search"]
    assert "version 2" in section and f"export picked strategy <b>{search['strategy']}</b> (of tcb, ppl)" in section
    assert f"trial #{search['trial']}" in section
    test = exported.card["metrics"]["test"]
    assert re.search(rf'<td class="l">test</td><td>{test["n"]}</td>', section), section[:3000]
    assert "promptopt_card: 2" in section and "promptopt_card: 1" not in dom
    assert not list(compare_dir.glob("**/card.yaml"))  # nothing exported into the run directory


def test_strategy_table_has_intervals_and_readable_headers(dom):
    found = parse(dom, "strategies-table")
    body = [(attrs, cells) for attrs, cells in found.rows if "data-strategy" in attrs]
    assert {a["data-strategy"] for a, _ in body} == {"baseline", "tcb", "ppl"}
    for _, cells in body:
        accuracy = next(text for text, attrs in cells if attrs.get("data-col") == "avg_acc")
        assert re.search(r"\[\d\.\d+, \d\.\d+\]", accuracy), accuracy  # every estimate with its interval
    assert (
        "avg_acc" not in dom[dom.index('id="strategies"') : dom.index('id="robustness"')].split("<tbody>")[0]
    )  # no raw column names


def test_scatter_draws_pruned_trials_apart_and_nudges_overlaps():
    import pandas as pd

    from promptopt.report.scatter import trials_scatter

    rows = [
        {
            "strategy": s,
            "seed": 0,
            "trial": t,
            "state": state,
            "accuracy": 0.5,
            "tcb_mean": 2.0,
            "n_dev": n,
            "template": "a",
            "k": 1,
        }
        for s in ("tcb", "ppl")
        for t, state, n in ((0, "COMPLETE", 8), (1, "COMPLETE", 8), (2, "PRUNED", 3))
    ]
    fig = trials_scatter(pd.DataFrame(rows))
    finished = [t for t in fig.data if "finished" in fig.layout.annotations[int(t.xaxis[1:] or 1) - 1].text]
    pruned = [t for t in fig.data if "pruned" in fig.layout.annotations[int(t.xaxis[1:] or 1) - 1].text]
    assert len(finished) == 2 and len(pruned) == 2  # one facet per strategy, pruned trials in a row of their own
    assert all(tr.marker.symbol != "circle" for tr in pruned)
    for trace in finished:
        assert len(set(zip(trace.x, trace.y))) == 2  # two trials at one point are drawn apart


# --- every kind of directory ----------------------------------------------------------------------------------
def _text(page: str, section: str) -> str:
    start = page.index(f'id="{section}"')
    end = page.find("<section", start)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page[start : end if end > 0 else None]))


def test_a_search_directory(compare_dir):
    from promptopt.report import build_report

    page = build_report(compare_dir / "tcb")
    assert "A single tcb search" in _text(page, "verdict") and "Nothing paired" in _text(page, "paired")
    assert "version 2" in _text(page, "card") and 'data-plot="history-tcb"' in page and 'data-plot="scatter"' in page


def test_a_compare_with_several_seeds(seeds_dir):
    import pandas as pd

    from promptopt.report import build_report

    page = build_report(seeds_dir)
    strategies = _text(page, "strategies")
    assert "Mean ± sd over 2 seeds" in strategies and re.search(r"\d\.\d+ ± \d\.\d+", strategies)
    folded = page[page.index('<details id="per-seed">') :]
    folded = folded[: folded.index("</details>")]
    winners = pd.read_csv(seeds_dir / "compare_runs.csv")
    assert folded.count("<tr data-strategy") == len(winners)  # one row per seed (and candidate), folded away
    assert "paired (seed, item) answers" in _text(page, "verdict") or "no difference" in _text(page, "verdict")
    assert "accuracy: optimization history (2 seeds)" in page
    assert "compare ran without a perturbation suite" in _text(page, "robustness")


def test_an_evaluate_directory(tiny_llama_dir, suite_file, tmp_path):
    from promptopt.report import build_report

    out = tmp_path / "eval"
    out.mkdir()
    proc = run_cli(
        "evaluate",
        "--task",
        "sst2",
        "--model",
        tiny_llama_dir,
        "--suite",
        suite_file,
        "--limit",
        3,
        "--out",
        out / "robustness",
        "--device",
        "cpu",
    )
    assert proc.code == 0, proc.stderr
    page = build_report(out)
    assert "Robustness of one prompt" in _text(page, "verdict") and "Suite tiny on 3 items" in _text(page, "verdict")
    assert re.search(r'data-families="typo,distractor"', page) and 'data-plot="families"' in page
    assert "No card: no search in this directory" in _text(page, "card") and "No search in this directory" in _text(
        page, "search"
    )


def test_a_sweep_directory(tiny_llama_dir, tmp_path):
    from promptopt.report import build_report

    protocol = tmp_path / "tiny.yaml"
    protocol.write_text(
        'name: tiny\nn: 3\nseed: 3\nranks: [1]\nmax_new_tokens: 4\nstop: ["\\nQuestion:"]\ntasks:\n'
        '  triviaqa:\n    template: {query: "Question: {question}\\nAnswer:"}\n'
        '    exemplars: [{question: "Which planet is red?", answer: "Mars"}]\n'
    )
    proc = run_cli(
        "stress",
        "--models",
        tiny_llama_dir,
        "--tasks",
        "triviaqa",
        "--protocol",
        protocol,
        "--out",
        tmp_path / "sweep",
        "--device",
        "cpu",
    )
    assert proc.code == 0, proc.stderr
    page = build_report(tmp_path / "sweep")
    assert "Taboo stress sweep" in _text(page, "verdict") and "retention at i=1" in _text(page, "verdict")
    sweep = parse(page, "sweep-table")
    assert len(sweep.rows) == 1 + 2  # header, baseline and rank 1
    section = page[page.index('<section id="sweep"') :]
    assert (
        section.count('<img alt="figure') == 3 and section.count('src="data:image/png;base64,') == 3
    )  # Figures 1, 3 and 8
    assert "Nothing paired" in _text(page, "paired")


# --- what only some runs have -----------------------------------------------------------------------------------
def _items(compare_dir):
    """A robustness_items.parquet as the robustness work will write it: seen and unseen families, variants."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for strategy in ("tcb", "ppl"):
        for item in range(4):
            clean = bool(rng.integers(0, 2))
            for family, seen in (("typo", True), ("distractor", False)):
                for variant in range(2):
                    flipped = bool(rng.integers(0, 2))
                    rows.append(
                        {
                            "strategy": strategy,
                            "seed": 0,
                            "item_id": f"sst2-{item}",
                            "family": family,
                            "variant": variant,
                            "seen": seen,
                            "clean_correct": clean,
                            "perturbed_correct": clean != flipped,
                            "clean_prediction": "positive",
                            "perturbed_prediction": "negative" if flipped else "positive",
                            "variant_text": f"{family} variant {variant} of item {item} <b>",
                        }
                    )
    return pd.DataFrame(rows)


def test_what_only_some_runs_have_is_drawn(compare_dir, tmp_path):
    """robustness_items.parquet (per-family intervals, the flip map), an evaluate family table, a taboo table,
    diagnose proxy correlations and an item-level AUROC table, found beside the run."""
    import pandas as pd

    from promptopt.analyses.proxy import correlation_table
    from promptopt.report import write_report

    run = tmp_path / "cmp"
    shutil.copytree(compare_dir, run)
    _items(compare_dir).to_parquet(run / "robustness_items.parquet")
    reseal(run)  # changed on purpose: sealed again as a complete set
    (run / "robustness.csv").write_text(FAMILIES)
    (run / "tcb" / "taboo.csv").write_text(TABOO)
    prompts = pd.DataFrame(
        {
            "log10_tcb": [0.1, 0.3, 0.2, 0.5],
            "signed_stability": [0.1, 0.2, 0.0, 0.3],
            "ppl": [3, 2, 4, 1],
            "margin": [1, 2, 1.5, 3],
            "v_eff": [2, 3, 2, 4],
            "accuracy": [0.5, 0.6, 0.4, 0.7],
            "acc_worst": [0.2, 0.4, 0.1, 0.5],
            "pdr": [0.3, 0.2, 0.4, 0.1],
        }
    )
    correlation_table(prompts, n_boot=200).to_csv(run / "proxy_correlations.csv", index=False)
    pd.DataFrame(
        {"signal": ["log10_tcb", "margin"], "auroc": [0.61, 0.55], "ci_low": [0.5, 0.45], "ci_high": [0.72, 0.66]}
    ).to_csv(run / "proxy_item_auroc.csv", index=False)
    page_path = write_report(run, out=tmp_path / "all.html")
    page = page_path.read_text(encoding="utf-8")
    robustness = page[page.index('id="robustness"') : page.index('id="card"')]
    assert (
        'data-families="typo,distractor"' in robustness
        and "typo (seen)" in robustness
        and "distractor (unseen)" in robustness
    )
    assert "sst2-3" in robustness and "distractor variant 1 of item 3" in robustness  # the variant text, for the hover
    assert "item 3 <b>" not in robustness and "item 3 \\u003cb\\u003e" not in robustness  # escaped, not markup
    assert 'data-plot="flips"' in robustness and 'data-plot="taboo"' in robustness and "robustness.csv" in robustness
    assert 'id="proxy-table"' in page and 'id="auroc-table"' in page and "Not measured" not in _text(page, "proxy")
    dom, stderr = rendered_dom(page_path, tmp_path)
    assert not console_errors(dom, stderr), console_errors(dom, stderr)
    marks = plot_marks(dom)
    assert {"families", "flips", "taboo", "proxy", "forest"} <= set(marks) and all(n > 0 for n in marks.values()), marks
    assert page_path.stat().st_size < 6_000_000


def test_report_cli_and_bad_input(compare_dir, tmp_path):
    run = tmp_path / "cmp"
    shutil.copytree(compare_dir, run)
    (run / "tcb" / "taboo.csv").write_text(TABOO)
    proc = run_cli("report", run / "tcb", "--out", tmp_path / "tcb.html", "--taboo", run / "tcb" / "taboo.csv")
    assert proc.returncode == 0, proc.stderr
    assert (
        "wrote" in proc.stdout and (tmp_path / "tcb.html").read_text(encoding="utf-8").count('data-plot="taboo"') == 1
    )
    unfinished = tmp_path / "unfinished"
    shutil.copytree(compare_dir / "tcb", unfinished)
    (unfinished / "summary.json").unlink()
    out = tmp_path / "nothing.html"
    assert_one_line_error(run_cli("report", unfinished, "--out", out), "no finished study")
    assert_one_line_error(run_cli("report", tmp_path / "empty-nothing", "--out", out), "no such run directory")
    (tmp_path / "plain").mkdir()
    assert_one_line_error(run_cli("report", tmp_path / "plain", "--out", out), "not a run directory")
    assert_one_line_error(
        run_cli("report", compare_dir, "--out", out, "--taboo", tmp_path / "none.csv"), "--taboo", "file not found"
    )
    (tmp_path / "wrong.csv").write_text("a,b\n1,2\n")
    assert_one_line_error(
        run_cli("report", compare_dir, "--out", out, "--robustness", tmp_path / "wrong.csv"),
        "--robustness",
        "missing column",
    )
    assert not out.exists()


# --- the first screen: what to ship ------------------------------------------------------------------------------
# After load, the top and bottom (page pixels) and the text of every element of the recommendation a reader must
# see on the first screen: the ship sentence, why, the export command, each warning export prints, and the
# "nothing beats the default prompt" line where there is one.
_FIRST_SCREEN = """<script>window.addEventListener('load',function(){setTimeout(function(){var out=[];
document.querySelectorAll('#nothing-beats, #ship, #why, #export-command, #export-warnings, .export-warning').forEach(function(e){
var r=e.getBoundingClientRect();out.push([e.id||e.className,r.top+window.scrollY,r.bottom+window.scrollY,e.textContent]);});
document.documentElement.setAttribute('data-first-screen',JSON.stringify(out));},0);});</script>"""
SCREEN = 1000  # px: the first screen of a 1280 × 1000 window


def first_screen(page: Path, tmp_path: Path) -> list[tuple[str, float, float, str]]:
    """(id or class, top, bottom, text) of the recommendation's elements, as headless Chromium lays them out in a
    1280 × 1000 window."""
    import html as html_lib

    hooked = tmp_path / ("screen-" + page.name)
    hooked.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>" + _FIRST_SCREEN, 1), encoding="utf-8")
    proc = chromium(tmp_path / "profile-screen", "--window-size=1280,1000", "--dump-dom", hooked.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'data-first-screen="([^"]*)"', proc.stdout)
    assert found, "the first-screen hook never ran"
    return [tuple(x) for x in json.loads(html_lib.unescape(found.group(1)))]


def assert_first_screen_says(elements, exported, root: Path) -> None:
    """Within the first 1,000 px: which card (strategy, trial) and why (export's rule, dev numbers only), the
    export command, and exactly the warnings export prints; a card no better than the default prompt says so
    first."""
    seen = {}
    for name, top, bottom, text in elements:
        seen.setdefault(name, []).append((top, bottom, " ".join(text.split())))
    for name in ("ship", "why", "export-command", "export-warnings"):
        assert name in seen, (name, elements)
        for _top, bottom, text in seen[name]:
            assert bottom <= SCREEN, f"{name} ends at {bottom:.0f} px, below the first screen: {text[:200]}"
    search = exported.card["search"]
    ship = seen["ship"][0][2]
    assert f"{search['strategy']} (trial {search['trial']} of study {search['study']}" in ship, ship
    assert "against the task's default prompt" in ship or "nothing-beats" in seen, ship
    said = ship + " ".join(text for _, _, text in seen.get("nothing-beats", []))
    assert "McNemar p =" in said and "significant" in said, said  # every Δ with its test and the one rule
    why = seen["why"][0][2]
    assert "dev numbers only" in why and search["selection"] in why, why
    assert seen["export-command"][0][2] == f"promptopt export {root} --out {root / 'card.yaml'}"
    shown = [text.removeprefix("warning: ") for _, _, text in seen.get("export-warning", [])]
    assert shown == [" ".join(w.split()) for w in exported.warnings], (shown, exported.warnings)
    for _top, bottom, text in seen.get("export-warning", []):
        assert bottom <= SCREEN, f"a warning export prints ends at {bottom:.0f} px: {text}"
    test = exported.card["metrics"]["test"]["accuracy"]
    worse = exported.default["accuracy"] >= test
    assert ("nothing-beats" in seen) == worse, (test, exported.default["accuracy"], seen.keys())
    if worse:
        top, bottom, text = seen["nothing-beats"][0]
        assert bottom <= SCREEN and top < seen["ship"][0][0], "the default prompt's line comes first"
        assert text.startswith("Keep the task's default prompt"), text
        assert any("not better than the task's default prompt" in w for w in exported.warnings)
    else:
        assert ship.startswith(f"Ship {search['strategy']}"), ship


@pytest.fixture(scope="module")
def search_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    """A standalone search (tiny model)."""
    from promptopt.study import run_search

    out = tmp_path_factory.mktemp("report") / "search"
    run_search(_config(tiny_llama_dir, out, strategy="tcb", trials=4), show_progress=False)
    return out


WORSE_SPACE = """task: sst2
description: one prompt whose label words are swapped (a negative review reads "positive"), worse by construction
instructions: {none: ""}
exemplars: {candidates: 4, k: [0, 0]}
templates:
  swapped: {query: "Review: {question}\\nSentiment:", label_words: [positive, negative]}
"""


@pytest.fixture(scope="module")
def worse_dir(tmp_path_factory) -> Path:
    """A search on the embedded model whose only prompt swaps SST-2's label words: its winner is worse than the
    task's default prompt (a real model reads the words; a random one would not)."""
    from promptopt.study import SearchConfig, run_search

    folder = tmp_path_factory.mktemp("worse")
    (folder / "space.yaml").write_text(WORSE_SPACE)
    config = SearchConfig.build(
        model="smollm2-135m-instruct",
        out=str(folder / "run"),
        device="cpu",
        task="sst2",
        strategy="accuracy",
        trials=1,
        dev_limit=6,
        test_limit=16,
        space=str(folder / "space.yaml"),
        incumbent="none",  # the strategy's own winner, which may be worse (with the default incumbent it is kept)
    )
    run_search(config, show_progress=False)
    return folder / "run"


@pytest.mark.parametrize("kind", ["compare", "search", "worse"])
@pytest.mark.long
def test_the_first_screen_says_which_card_to_ship(kind, compare_dir, request, tmp_path):
    """In the rendered DOM of headless Chromium, the first 1,000 px of a compare's report, a search's, and a search
    whose winner is worse than the default prompt: the card, why, the export command, and export's warnings."""
    from promptopt.report import write_report
    from promptopt.workflows.export import export_run

    root = compare_dir if kind == "compare" else request.getfixturevalue(f"{kind}_dir")
    page = write_report(root, out=tmp_path / f"{kind}.html")
    exported = export_run(root, out=tmp_path / "card.yaml")  # what `promptopt export` prints and writes
    if kind == "worse":
        assert exported.card["metrics"]["test"]["accuracy"] < exported.default["accuracy"]
    assert_first_screen_says(first_screen(page, tmp_path), exported, root)
    assert page.read_text(encoding="utf-8").index('id="recommendation"') < page.read_text(encoding="utf-8").index(
        'id="verdict"'
    )


@pytest.mark.long
def test_the_first_screen_check_can_fail(compare_dir, tmp_path):
    """Guard against a vacuous check: the same page with the recommendation pushed below the first screen, or a
    warning export prints left out, fails it."""
    from promptopt.report import write_report
    from promptopt.workflows.export import export_run

    page = write_report(compare_dir, out=tmp_path / "cmp.html")
    exported = export_run(compare_dir, out=tmp_path / "card.yaml")
    text = page.read_text(encoding="utf-8")
    pushed = tmp_path / "pushed.html"
    pushed.write_text(
        text.replace(
            '<section id="recommendation">', '<div style="height:1200px"></div><section id="recommendation">', 1
        )
    )
    with pytest.raises(AssertionError, match="below the first screen"):
        assert_first_screen_says(first_screen(pushed, tmp_path), exported, compare_dir)
    exported.warnings.append("a warning the page does not show")
    with pytest.raises(AssertionError):
        assert_first_screen_says(first_screen(page, tmp_path), exported, compare_dir)


def test_the_scatter_marks_winners_and_the_tcb_rule(compare_dir, search_dir):
    """★ on each search's winner (compare's pick), ringed on the card export writes; in a tcb column the dashed
    line sits at the lowest dev accuracy of the tie set the tcb search itself recorded."""
    from promptopt.report.card import chosen_card
    from promptopt.report.scatter import trials_scatter
    from promptopt.report.source import read_source
    from promptopt.report.trials import trials_frame

    for root in (compare_dir, search_dir):
        source = read_source(root)
        chosen = chosen_card(source)
        trials = trials_frame(source, chosen)
        won = trials[trials["winner"]]
        assert len(won) == len(source.studies)  # one winner per search
        if source.candidates is not None:
            picked = source.candidates[source.candidates["winner"].astype(str).str.lower() == "true"]
            assert set(zip(won["strategy"], won["trial"])) == {
                (s, int(t)) for s, t in zip(picked["strategy"], picked["trial"]) if t == t
            }
        assert trials["exported"].sum() == 1
        assert trials.loc[trials["exported"], "trial"].item() == chosen.card["search"]["trial"]
        for s in source.studies:
            if s.run.config.study.strategy == "tcb":
                bound = trials.loc[trials["strategy"] == s.strategy, "rule_low"].iloc[0]
                tied = s.run.summary["selection_detail"]["tie_set"]  # the tie set the tcb search recorded
                assert bound == min(t["dev_accuracy"] for t in tied), (bound, s.run.summary["selection"])
        fig = trials_scatter(trials)
        stars = [t for t in fig.data if t.marker.symbol == "star"]
        assert sum(len(t.x) for t in stars) == int(won["state"].eq("COMPLETE").sum())
        assert sum(1 for t in stars for w in t.marker.line.width if w == 3) == 1  # the ringed one: export's card
        lines = [sh for sh in fig.layout.shapes if sh.line.dash == "dash"]
        assert len(lines) == sum(1 for s in source.studies if s.run.config.study.strategy == "tcb")


def test_the_recommendation_shows_compare_s_own_interval_for_the_same_pair(compare_dir, tmp_path):
    """One comparison, one interval: the recommendation's Δ accuracy of the card against the default prompt and
    against the next best is compare_paired.csv's row for that pair (read back, oriented card − other), never a
    second bootstrap draw. On the real run the rows are equal; with the csv's intervals edited to numbers no
    bootstrap gives, the first screen shows the edited ones."""
    import html as html_lib

    import pandas as pd

    from promptopt.report.card import chosen_card
    from promptopt.report.numbers import estimate
    from promptopt.report.recommend import _next_best, _paired, _test_answers, recommendation
    from promptopt.report.source import read_source

    def pairs(source, chosen):
        entry = chosen.exported.run.compare_row["strategy"]
        ids = chosen.exported.default["item_ids"]
        nxt, _ = _next_best(source, chosen)
        return entry, ids, [other for other in ("baseline", nxt["strategy"]) if other != entry]

    source = read_source(compare_dir)
    chosen = chosen_card(source)
    entry, ids, others = pairs(source, chosen)
    paired = pd.read_csv(compare_dir / "compare_paired.csv")
    for other in others:
        mine, theirs = (_test_answers(compare_dir, name, 0, ids) for name in (entry, other))
        shown = _paired(source, mine, theirs, ids, (entry, other))
        stored = paired[paired["a"].isin([entry, other]) & paired["b"].isin([entry, other])].iloc[0]
        sign = 1 if stored["a"] == entry else -1
        assert shown["delta_acc"] == pytest.approx(sign * stored["delta_acc"])
        bounds = sorted([sign * stored["delta_acc_ci_low"], sign * stored["delta_acc_ci_high"]])
        assert [shown["delta_acc_ci_low"], shown["delta_acc_ci_high"]] == pytest.approx(bounds)
        assert shown["mcnemar_p"] == pytest.approx(stored["mcnemar_p"])

    run = tmp_path / "cmp"
    shutil.copytree(compare_dir, run)
    edited = pd.read_csv(run / "compare_paired.csv")
    edited["delta_acc"], edited["delta_acc_ci_low"], edited["delta_acc_ci_high"] = 0.0371, -0.0123, 0.0618
    edited["only_a_correct"], edited["only_b_correct"], edited["mcnemar_p"], edited["significant"] = 3, 2, 0.5, False
    edited.to_csv(run / "compare_paired.csv", index=False)
    reseal(run)
    source = read_source(run)
    chosen = chosen_card(source)
    text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", recommendation(source, chosen))).split())
    entry, ids, others = pairs(source, chosen)
    for other in others:
        stored = edited[edited["a"].isin([entry, other]) & edited["b"].isin([entry, other])].iloc[0]
        sign = 1 if stored["a"] == entry else -1
        low, high = sorted([sign * stored["delta_acc_ci_low"], sign * stored["delta_acc_ci_high"]])
        assert f"Δ accuracy {estimate(sign * stored['delta_acc'], low, high, signed=True)}" in text, (other, text)


def test_the_report_shows_delta_tcb_by_median_and_geomean_not_a_mean_one_item_makes():
    """pmi: one item's δ_TCB of 2.78e8 made compare's mean 2.78e6; the report's strategy table shows the median
    and the geometric mean."""
    import pandas as pd

    from promptopt.report.numbers import sig
    from promptopt.report.verdict import strategy_section

    compare = pd.DataFrame(
        [
            {"strategy": s, "n_seeds": 1, "n_test": 100, "avg_acc": 0.8, "acc_ci_low": 0.7, "acc_ci_high": 0.9,
             "avg_tcb": 2.78e6, "tcb_median": 3.5, "tcb_geomean": 4.1, "avg_ppl": 1.5, "selected_by": "x"}
            for s in ("baseline", "tcb")
        ]
    )  # fmt: skip
    page = strategy_section(compare, None, {"seeds": 1})
    assert "median δ_TCB" in page and "geomean δ_TCB" in page and ">mean δ_TCB<" not in page
    assert 'data-v="3.5">3.50<' in page and sig(2.78e6) not in page and "2780000" not in page
