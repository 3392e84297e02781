"""Docs that cannot drift.

- Every `promptopt …` command in README.md, CONTRIBUTING.md and docs/*.md (in shell code blocks, `\\`-continued
  lines joined, and in inline code; `.venv/bin/promptopt …` too) is checked against the real CLI: the sub-command
  (and the sub-sub-command, e.g. `diagnose proxy`) exists, and every `--flag` it uses exists on that command,
  placeholders such as `[--mid-word]` included. An inline span that starts with a sub-command and uses a flag
  (`compare --seeds 3`) is checked as `promptopt compare --seeds 3`.
- Every `make TARGET` the docs run is a target of the Makefile; every relative link in README.md and
  CONTRIBUTING.md resolves (mkdocs build --strict checks the links inside docs/).
- Every Python block marked `<!-- runnable -->` on the line before its fence runs, on the embedded model, in a
  folder holding `card.yaml` (a card built for SST-2); a block that cannot run says why with
  `<!-- not runnable: … -->`. See CONTRIBUTING.md.

- No guide page (docs/*.md) is more than a quarter run log; the dated run logs live in the Lab notebook
  (docs/lab/), every page of which is in mkdocs.yml's nav. How a run log is recognised: see `run_log_words`.

The checks are shown to fail: a copy of a doc with one flag or sub-command renamed is reported, naming it; a Lab
notebook page read as a guide page is over the limit.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL = {"", "bash", "sh", "shell", "console", "text"}
RUNNABLE = "<!-- runnable -->"
NOT_RUNNABLE = re.compile(r"<!-- not runnable: .+ -->")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_OPERATORS = {"&&", "||", "|", ";"}


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, the 1-based line of its first code line, its code, the marker before it."""

    lang: str
    line: int
    code: str
    marker: str


@dataclass(frozen=True)
class Snippet:
    """A command line found in a doc: where it is and its words (shell comments removed)."""

    where: str
    words: tuple[str, ...]

    @property
    def text(self) -> str:
        return shlex.join(self.words)


def blocks(text: str) -> list[Block]:
    found, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        marker = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        code = "\n".join(ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j])
        found.append(Block(lang, i + 2, code, marker))
        i = j + 1
    return found


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an apostrophe in prose-like text: plain words, comment cut by hand
        return text.split(" #")[0].split()


def _shell_lines(block: Block) -> list[tuple[int, str]]:
    """Logical lines of a shell block (a line ending in a backslash continues on the next), with their line."""
    out, pending, start = [], "", 0
    for offset, line in enumerate(block.code.split("\n")):
        if not pending:
            start = block.line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def _outside_blocks(text: str) -> str:
    """The text with every fenced block blanked (line numbers kept), for inline code spans."""
    lines = text.split("\n")
    for block in blocks(text):
        for k in range(block.line - 2, block.line - 1 + len(block.code.split("\n")) + 1):
            if 0 <= k < len(lines):
                lines[k] = ""
    return "\n".join(lines)


def _is_promptopt(word: str) -> bool:
    return word == "promptopt" or word.endswith("/promptopt")


def _cut(words: list[str]) -> list[str]:
    """The words of one command: up to the first shell operator or redirection."""
    for k, word in enumerate(words):
        if word in _OPERATORS or word.startswith((">", "2>", "<")):
            return words[:k]
    return words


def commands_in(text: str, source: str, top_level: set[str]) -> tuple[list[Snippet], list[Snippet]]:
    """(promptopt invocations, make invocations) in a Markdown text: each as the words after the program."""
    found: list[tuple[str, list[str]]] = []
    for block in blocks(text):
        if block.lang in SHELL:
            found += [(f"{source}:{line}", _words(logical)) for line, logical in _shell_lines(block)]
    outside = _outside_blocks(text)
    for m in _SPAN.finditer(outside):
        line = outside.count("\n", 0, m.start()) + 1
        words = _words(" ".join(m.group(1).split()))
        if words and words[0] in top_level and any(w.lstrip("[(").startswith("--") for w in words):
            words = ["promptopt", *words]  # `compare --seeds 3` in prose
        found.append((f"{source}:{line}", words))
    cli, make = [], []
    for where, words in found:
        for k, word in enumerate(words):
            if _is_promptopt(word):
                cli.append(Snippet(where, tuple(_cut(words[k + 1 :]))))
                break
            if word == "make" and (k == 0 or words[k - 1] in _OPERATORS):
                make.append(Snippet(where, tuple(_cut(words[k + 1 :]))))
                break
    return cli, make


def flags(word: str) -> list[str]:
    """The option names a word uses: `--a=1` -> --a; `[--mid-word]` -> --mid-word; `--[no-]pruning` -> both;
    `--log-tcb-low/--log-tcb-high` -> both."""
    word = word.strip("[](),.;:")
    if not word.startswith("--"):
        return []
    names = []
    for part in word.split("/"):
        part = part.strip("[](),.;:").split("=")[0]
        if "[no-]" in part:
            names += [part.replace("[no-]", ""), part.replace("[no-]", "no-")]
        elif part.startswith("--"):
            names.append(part)
    return names


# Typer ships its own copy of click (typer._click), so commands are told apart by what they have, not by class.
def _is_group(command) -> bool:
    return hasattr(command, "commands")


def _options(command) -> set[str]:
    names = {"--help"}
    for param in command.params:
        if param.param_type_name == "option":
            names.update(n for n in (*param.opts, *param.secondary_opts) if n.startswith("--"))
    return names


def check_command(snippet: Snippet, group) -> list[str]:
    """What is wrong with one documented `promptopt` invocation: [] when the CLI has it as written."""
    words, command, path = list(snippet.words), group, ["promptopt"]
    if words[:1] in (["…"], ["..."]):  # `promptopt …`: any command, in prose
        return []
    while _is_group(command) and words:
        if words[0].startswith(
            "-"
        ):  # a group's own option before its sub-command: `promptopt --unsafe-sandbox rlimit score`
            option = next((p for p in command.params if words[0].split("=")[0] in p.opts), None)
            if option is None or not words[1:]:
                break
            del words[: 1 if option.is_flag or "=" in words[0] else 2]
            continue
        if words[0] in ("…", "..."):  # `promptopt --unsafe-sandbox rlimit …`: any command
            return []
        name = words.pop(0)
        if name not in command.commands:
            return [
                f"{snippet.where}: `promptopt {snippet.text}`: {' '.join(path)} has no sub-command {name!r} "
                f"(it has: {', '.join(sorted(command.commands))})"
            ]
        command, path = command.commands[name], [*path, name]
    known = _options(command)
    return [
        f"{snippet.where}: `promptopt {snippet.text}`: {' '.join(path)} has no option {flag}"
        for word in words
        for flag in flags(word)
        if flag not in known
    ]


def cli_group():
    """The real command tree: the Typer app as the click group it runs as."""
    import typer

    from promptopt.cli import app

    return typer.main.get_command(app)


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)} - {".PHONY"}


def check_docs(paths: list[Path]) -> tuple[list[str], int]:
    """(every problem found in these docs, how many promptopt commands were checked)."""
    group, targets = cli_group(), make_targets()
    problems, checked = [], 0
    for path in paths:
        source = path.name if path.parent == REPO else str(path.relative_to(path.parent.parent))
        cli, make = commands_in(path.read_text(encoding="utf-8"), source, set(group.commands))
        checked += len(cli)
        for snippet in cli:
            problems += check_command(snippet, group)
        for snippet in make:
            problems += [
                f"{snippet.where}: `make {snippet.text}`: the Makefile has no target {word!r}"
                for word in snippet.words
                if not word.startswith("-") and "=" not in word and word not in targets
            ]
    return problems, checked


# --- the CLI commands and make targets the docs use ----------------------------------------------------------
def test_every_documented_command_and_flag_exists():
    problems, checked = check_docs(DOCS)
    assert checked > 80, f"only {checked} promptopt commands found: the extraction is broken"
    assert not problems, "\n".join(problems)


def test_every_cli_command_is_documented():
    group = cli_group()
    used = set()
    for path in DOCS:
        for snippet in commands_in(path.read_text(encoding="utf-8"), path.name, set(group.commands))[0]:
            used.add(tuple(w for w in snippet.words[:2] if not w.startswith("-")))
    missing = []
    for name, command in group.commands.items():
        if _is_group(command):
            missing += [f"{name} {sub}" for sub in command.commands if (name, sub) not in used]
        elif not any(u[:1] == (name,) for u in used):
            missing.append(name)
    assert not missing, f"commands no doc shows: {', '.join(missing)}"


@pytest.mark.parametrize(
    ("doc", "old", "new", "expected"),
    [
        # a flag on a plain command line
        (
            "docs/getting-started.md",
            "--max-new-tokens 32",
            "--max-tokens 32",
            "promptopt trace has no option --max-tokens",
        ),
        # a flag on a `\`-continued line
        (
            "docs/lab/strategies.md",
            "--top-n 1 --out runs/r18/sst2 ",
            "--top 1 --out runs/r18/sst2 ",
            "promptopt compare has no option --top",
        ),
        # a placeholder flag
        ("docs/robustness.md", "[--mid-word]", "[--midword]", "promptopt stress has no option --midword"),
        # a sub-sub-command
        ("docs/diagnose.md", "diagnose regimes", "diagnose regime", "promptopt diagnose has no sub-command 'regime'"),
        # a command in prose
        ("README.md", "`compare --seeds 3`", "`compare --sedes 3`", "promptopt compare has no option --sedes"),
        ("docs/search.md", "`compare --resume`", "`compare --resumed`", "promptopt compare has no option --resumed"),
        # a make target
        ("CONTRIBUTING.md", "make lint", "make lints", "the Makefile has no target 'lints'"),
    ],
)
def test_a_renamed_flag_or_command_is_reported(tmp_path, doc, old, new, expected):
    """Break one name in a copy of a doc: the checker names it (and the original is clean)."""
    text = (REPO / doc).read_text(encoding="utf-8")
    assert old in text, f"{doc} no longer contains {old!r}: pick another example"
    (tmp_path / "docs").mkdir()
    copy = tmp_path / "docs" / Path(doc).name
    copy.write_text(text.replace(old, new, 1), encoding="utf-8")
    before, _ = check_docs([REPO / doc])
    after, _ = check_docs([copy])
    assert before == []
    assert len(after) == 1 and expected in after[0], after
    line = text[: text.index(old)].count("\n") + 1  # a continued command is reported at its first line
    reported = int(re.match(rf"(?:docs/)?{re.escape(Path(doc).name)}:(\d+): ", after[0]).group(1))
    assert line - 2 <= reported <= line, after[0]


def test_the_extraction_reads_continued_lines_placeholders_and_prose():
    group = set(cli_group().commands)
    text = (
        "```bash\n.venv/bin/promptopt compare --task sst2 \\\n    --seeds 3 [--resume]  # --not-a-flag\n```\n"
        "Then `evaluate --out OUT`, and `promptopt diagnose\nproxy DIR` (a span over a line break), `pip install x`.\n"
    )
    cli, make = commands_in(text, "x.md", group)
    assert [(s.where, s.words) for s in cli] == [
        ("x.md:2", ("compare", "--task", "sst2", "--seeds", "3", "[--resume]")),
        ("x.md:5", ("evaluate", "--out", "OUT")),
        ("x.md:5", ("diagnose", "proxy", "DIR")),
    ]
    assert make == []
    assert flags("--[no-]pruning") == ["--pruning", "--no-pruning"]
    assert flags("`--log-tcb-low/--log-tcb-high`".strip("`")) == ["--log-tcb-low", "--log-tcb-high"]


def test_links_from_the_front_page_resolve():
    """README.md and CONTRIBUTING.md are not part of the mkdocs build: their relative links are checked here."""
    broken = []
    for doc in (REPO / "README.md", REPO / "CONTRIBUTING.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" not in target and not (doc.parent / target).exists():
                broken.append(f"{doc.name}: {target}")
    assert not broken, broken


def test_links_inside_the_site_stay_inside_it():
    """mkdocs --strict (make docs, CI) fails on a relative link out of docs/; this finds one without the docs extra."""
    docs = (REPO / "docs").resolve()
    leaving = []
    for page in sorted(docs.rglob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not target.startswith("mailto:"):
                if docs not in (page.parent / target).resolve().parents:
                    leaving.append(f"{page.relative_to(REPO)}: {target}")
    assert not leaving, leaving


# --- guide pages guide; run logs live in the Lab notebook --------------------------------------------------
GUIDE_PAGES = sorted((REPO / "docs").glob("*.md"))
LAB = REPO / "docs" / "lab"
MAX_RUN_LOG_SHARE = 0.25
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_HEADING = re.compile(r"^(#{1,6})\s")
_NUMBER = re.compile(r"^[\[(−+~≈*-]*\d[\d.,:/×%–-]*[a-zµ%×*)\],;:.]*$")  # 0.82, [−0.14,, 1.7×, 95%, 3.8–4.9, 12s
_DENSE_SECTION, _DENSE_BLOCK, _MIN_WORDS = 0.12, 0.20, 12


def _text_words(text: str) -> list[str]:
    """Words as a reader counts them: whitespace-separated tokens with a letter or digit (a table's `|` is none)."""
    return [w for w in text.split() if re.search(r"\w", w)]


def _number_share(text: str) -> float:
    """The share of a text's words, fenced code left out, that are numbers."""
    words = _text_words(re.sub(r"^(\s*)(`{3,}|~{3,}).*?^\1\2", "", text, flags=re.S | re.M))
    return sum(bool(_NUMBER.match(w)) for w in words) / len(words) if words else 0.0


def _sections(text: str) -> list[tuple[int, str, list[str]]]:
    """(heading level, heading line, body lines) for each heading's own text, down to the next heading of any level;
    the text before the first heading is level 0. A `#` line inside a fenced block is code, not a heading."""
    out, level, heading, body, fence = [], 0, "", [], None
    for line in text.split("\n"):
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(2)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None and _HEADING.match(line):
            out.append((level, heading, body))
            level, heading, body = len(_HEADING.match(line).group(1)), line, []
            continue
        body.append(line)
    out.append((level, heading, body))
    return out


def _paragraphs(lines: list[str]) -> list[str]:
    """A section's blocks: paragraphs, tables and list items (a new `- ` item starts a block; a fenced block is one)."""
    out, current, fence = [], [], None
    for line in lines:
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(2)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None and (not line.strip() or (re.match(r"^\s*([-*+]|\d+\.)\s", line) and current)):
            out.append("\n".join(current))
            current = [] if not line.strip() else [line]
            continue
        current.append(line)
    return [*out, "\n".join(current)]


def run_log_words(text: str) -> tuple[int, int]:
    """(words of run log, all words) of a Markdown page. A run log is what a dated experiment leaves behind:
    - a section whose heading carries a date (2026-12-04), with every section under it;
    - a section whose own text is measurement-dense: at least 12% of its prose words (fenced code left out) are
      numbers (a guide section explains in words; a run log's tables and findings are numbers);
    - a block (paragraph, table, list item) of at least 12 words, 20% of them numbers, in any other section:
      a wall of measurements inside guide text.
    Guide text that cites a number or two with its interval stays guide text."""
    total = logged = 0
    dated_level = None
    for level, heading, body in _sections(text):
        if dated_level is not None and level <= dated_level:
            dated_level = None
        if dated_level is None and level and _DATE.search(heading):
            dated_level = level
        words = len(_text_words(heading + "\n" + "\n".join(body)))
        total += words
        if dated_level is not None or (words >= 30 and _number_share("\n".join(body)) >= _DENSE_SECTION):
            logged += words
            continue
        for block in _paragraphs(body):
            n = len(_text_words(block))
            if n >= _MIN_WORDS and _number_share(block) >= _DENSE_BLOCK:
                logged += n
    return logged, total


def run_log_share(path: Path) -> float:
    logged, total = run_log_words(path.read_text(encoding="utf-8"))
    return logged / total if total else 0.0


def test_no_guide_page_is_more_than_a_quarter_run_log():
    shares = {p.name: run_log_share(p) for p in GUIDE_PAGES}
    over = {name: f"{share:.0%}" for name, share in shares.items() if share > MAX_RUN_LOG_SHARE}
    assert len(shares) >= 10
    assert not over, f"guide pages more than {MAX_RUN_LOG_SHARE:.0%} run log (move the logs to docs/lab/): {over}"


def test_the_run_log_measure_can_fail():
    """The Lab notebook's run logs, read as guide pages, are far over the limit; a guide page that grows a dated
    section or a wall of measurements crosses it; a number cited with its interval in prose does not."""
    for name in ("strategies", "decisions", "diagnose", "serving", "performance"):
        assert run_log_share(LAB / f"{name}.md") > MAX_RUN_LOG_SHARE, name
    guide = "# Rules\n\n" + "A rule decides each answer from the label log-probabilities it reads. " * 12 + "\n"
    assert run_log_words(guide)[0] == 0
    prose = guide.rstrip() + " On SST-2 it raised Acc_worst by +0.180 [0.067, 0.303] over argmax (three seeds).\n"
    assert run_log_words(prose)[0] == 0
    table = (
        "| entry | Acc | Acc_worst |\n|---|---|---|\n"
        + "| `batch` | 0.863 [0.834, 0.889] | 0.300 [0.217, 0.393] |\n" * 4
    )
    dated = guide + "\n## Three seeds (2026-12-05)\n\n" + "It ran three seeds on the dev items of each task. " * 10
    walled = guide + "\n" + table
    for page in (dated, walled):
        logged, total = run_log_words(page)
        assert logged / total > MAX_RUN_LOG_SHARE, page
    # a dated section ends at the next heading of its level: what follows is guide text again
    after = dated + "\n## In production\n\n" + "Load the card and decide by its rule. " * 40
    assert run_log_words(after)[0] == len(_text_words(dated.split("\n## ")[1]))


def _nav_pages() -> set[str]:
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    return set(re.findall(r":\s*([\w/.-]+\.md)\s*(?:#.*)?$", nav, re.M))


def test_every_run_log_is_reachable():
    """Every Lab notebook page is in the site's nav, and every one but the index is linked from a guide page or the
    Lab notebook's index (the guides' summaries point to their logs)."""
    lab_pages = sorted(p.relative_to(REPO / "docs").as_posix() for p in LAB.glob("*.md"))
    assert "lab/index.md" in lab_pages and len(lab_pages) >= 6
    assert not set(lab_pages) - _nav_pages(), f"lab pages not in mkdocs.yml's nav: {set(lab_pages) - _nav_pages()}"
    linking = "".join(p.read_text(encoding="utf-8") for p in [*GUIDE_PAGES, LAB / "index.md"])
    unlinked = [
        page
        for page in lab_pages
        if page != "lab/index.md" and f"({page}" not in linking and f"({page.removeprefix('lab/')}" not in linking
    ]
    assert not unlinked, f"lab pages no guide page or lab/index.md links to: {unlinked}"


# --- runnable Python blocks ------------------------------------------------------------------------------
def python_blocks() -> list[tuple[str, Block]]:
    found = []
    for path in DOCS:
        for block in blocks(path.read_text(encoding="utf-8")):
            if block.lang in ("python", "py"):
                found.append((f"{path.relative_to(REPO)}:{block.line}", block))
    return found


def run_block(where: str, block: Block) -> None:
    """Run a block as a script would (its own globals); a failure names the doc and line it came from."""
    try:
        exec(compile(block.code, where, "exec"), {"__name__": "__main__"})
    except Exception as exc:
        raise AssertionError(f"{where}: the runnable block fails: {type(exc).__name__}: {exc}") from exc


def test_every_python_block_is_marked():
    unmarked = [where for where, b in python_blocks() if b.marker != RUNNABLE and not NOT_RUNNABLE.fullmatch(b.marker)]
    assert not unmarked, f"mark these {RUNNABLE} or <!-- not runnable: why -->: {unmarked}"
    assert sum(b.marker == RUNNABLE for _, b in python_blocks()) >= 5


def test_a_broken_block_is_reported_with_its_place():
    block = blocks("<!-- runnable -->\n```python\nimport promptopt\n\nresult.table\n```\n")[0]
    assert block.marker == RUNNABLE and block.line == 3
    with pytest.raises(AssertionError, match=r"docs/x\.md:3: the runnable block fails: NameError: name 'result'"):
        run_block("docs/x.md:3", block)


@pytest.fixture(scope="module")
def card_folder(tmp_path_factory) -> Path:
    """A folder holding card.yaml: the SST-2 default prompt as a version-2 card on the embedded model."""
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.export import build_card
    from promptopt.workflows.formats import card_yaml
    from promptopt.workflows.session import Session

    # ModelConfig() loads as the blocks' load_model("smollm2-135m-instruct") does: one load (tests/conftest.py)
    session = Session(model=ModelConfig(), data=DataConfig(task="sst2", dev_limit=4, test_limit=4))
    card = build_card(
        session, session.data.default_prompt(), dev_items=session.items("dev"), test_items=session.items("test")
    )
    folder = tmp_path_factory.mktemp("docs-card")
    (folder / "card.yaml").write_text(card_yaml(card))
    return folder


LONG_BLOCKS = ("docs/python-api.md",)  # its blocks search, compare and serve: ~40 s on 2 cores, `make test-all`


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "block"),
    [
        pytest.param(w, b, id=w, marks=[pytest.mark.long] if w.startswith(LONG_BLOCKS) else [])
        for w, b in python_blocks()
        if b.marker == RUNNABLE
    ],
)
def test_runnable_block_runs(where, block, card_folder, monkeypatch):
    monkeypatch.chdir(card_folder)
    with registries_restored():  # docs/recipes.md registers entries in-process: they leave with the block
        run_block(where, block)


@contextlib.contextmanager
def registries_restored():
    from promptopt.decision import DECISION_RULES
    from promptopt.robustness.perturb import OPERATORS
    from promptopt.study.strategies import STRATEGIES
    from promptopt.tasks.answers import ANSWER_TYPES

    registries = (DECISION_RULES, OPERATORS, STRATEGIES, ANSWER_TYPES)
    before = [dict(registry._entries) for registry in registries]
    try:
        yield
    finally:
        for registry, entries in zip(registries, before):
            registry._entries.clear()
            registry._entries.update(entries)


# --- help texts point to pages and sections that exist ---------------------------------------------------------------
_REFERENCE = re.compile(r"\b(docs/[\w.-]+\.md)(?:#([\w-]+))?")
_LOOSE = re.compile(r"\b(README|docs)\s*:\s*[A-Z]")  # "README: Search", "docs: Serving": no page a reader can open


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown page as mkdocs makes them: an explicit `{#id}`, else the heading's toc slug."""
    import unicodedata

    found = set()
    for line in _outside_blocks(path.read_text(encoding="utf-8")).split("\n"):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if not heading:
            continue
        explicit = re.search(r"\{#([\w-]+)\}\s*$", heading.group(1))
        if explicit:
            found.add(explicit.group(1))
            continue
        text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.group(1))
        text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
        found.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower()))
    return found


def help_texts(command, path=("promptopt",)):
    """(where, text) for every command's help and every option's help of the CLI."""
    yield " ".join(path), command.help or ""
    for param in command.params:
        yield (
            f"{' '.join(path)} {'/'.join(getattr(param, 'opts', []) or [param.name])}",
            getattr(param, "help", "") or "",
        )
    for name, sub in getattr(command, "commands", {}).items():
        yield from help_texts(sub, (*path, name))


def check_references(texts) -> list[str]:
    """Every docs page a text names exists, with the section it names; a bare 'README: X' or 'docs: X' is
    reported (the README's sections moved to docs/: a reference names the page, docs/PAGE.md#section)."""
    problems = []
    for where, text in texts:
        text = " ".join(text.split())
        for loose in _LOOSE.finditer(text):
            problems.append(
                f"{where}: {text[loose.start() : loose.start() + 40]!r}: name the page (docs/PAGE.md#section)"
            )
        for page, anchor in _REFERENCE.findall(text):
            if not (REPO / page).is_file():
                problems.append(f"{where}: {page}: no such page")
            elif anchor and anchor not in anchors(REPO / page):
                problems.append(f"{where}: {page}#{anchor}: no such section")
    return problems


def test_help_texts_point_to_pages_and_sections_that_exist():
    texts = list(help_texts(cli_group()))
    assert len(texts) > 200, "the help texts were not collected"
    assert sum(bool(_REFERENCE.search(t)) for _, t in texts) >= 7, "no help text names a page: the search is broken"
    problems = check_references(texts)
    assert not problems, "\n".join(problems)


def test_a_help_text_pointing_nowhere_is_reported():
    assert check_references([("search --strategy", "tcb or ppl (README: Search)")])
    assert check_references([("x", "see docs: Serving")])
    assert check_references([("x", "(docs/searching.md)")]) == ["x: docs/searching.md: no such page"]
    assert check_references([("x", "(docs/search.md#nope)")]) == ["x: docs/search.md#nope: no such section"]
    assert not check_references([("x", "(docs/search.md#strategies), docs/diagnose.md, docs/search.md#proposals")])
    assert {"strategies", "proposals", "screening", "robust-multi-fidelity"} <= anchors(REPO / "docs" / "search.md")


def test_links_from_the_front_page_reach_their_sections():
    """README.md and CONTRIBUTING.md links with a #section into docs/ (mkdocs checks only the links inside docs/)."""
    broken = []
    for doc in (REPO / "README.md", REPO / "CONTRIBUTING.md"):
        for target, anchor in re.findall(r"\]\(([^)#\s]+\.md)#([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            page = doc.parent / target
            if page.is_file() and anchor not in anchors(page):
                broken.append(f"{doc.name}: {target}#{anchor}")
    assert not broken, broken


# --- docs/tasks.md's built-in list is the registry's -----------------------------------------------------------------
_TASKS_START = "<!-- builtin-tasks: the registry's list, checked by tests/test_docs.py (it prints the new one) -->"
_TASKS_END = "<!-- /builtin-tasks -->"


def builtin_tasks_list() -> str:
    """One line per built-in task, as `promptopt tasks` lists them: name, answer type, description."""
    from promptopt.tasks import builtin_task_names, load_task_spec

    lines = []
    for name in builtin_task_names():
        spec = load_task_spec(name)
        lines.append(f"- `{name}` ({spec.answer_type}): {' '.join(spec.description.split())}")
    return "\n".join(lines)


def documented_tasks_list(text: str) -> str | None:
    if _TASKS_START not in text or _TASKS_END not in text:
        return None
    return text.split(_TASKS_START, 1)[1].split(_TASKS_END, 1)[0].strip()


def test_the_builtin_task_list_in_the_docs_is_the_registry_s():
    text = (REPO / "docs" / "tasks.md").read_text(encoding="utf-8")
    expected = builtin_tasks_list()
    assert "`mrpc`" in expected and "`rte`" in expected and "`sst2`" in expected
    assert documented_tasks_list(text) == expected, (
        f"docs/tasks.md's built-in list differs from the registry; between its two markers put:\n{expected}"
    )
    stale = documented_tasks_list(text.replace("- `rte`", "- `rte_old`"))
    assert stale != expected  # the check can fail: a renamed (or missing) task is caught


# --- each time stated once ----------------------------------------------------------------------------------------
_TIME_CLAIM = re.compile(r"`make (demo|test)`[^.\n]{0,60}\babout \d")


def time_claims(text: str) -> list[str]:
    """'`make demo` ... about N min' statements outside code blocks."""
    return [m.group(0) for m in _TIME_CLAIM.finditer(_outside_blocks(text))]


def test_the_set_up_times_are_stated_once():
    """How long `make demo` and `make test` take is written in the README alone; getting-started.md includes those
    lines from it (a snippet, so the built page shows them) and CONTRIBUTING.md links to it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(time_claims(readme)) == 2, time_claims(readme)
    elsewhere = {p.name: time_claims(p.read_text(encoding="utf-8")) for p in DOCS if p.name != "README.md"}
    assert not any(elsewhere.values()), elsewhere
    assert '--8<-- "README.md:setup-times"' in (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = readme.split("[start:setup-times]", 1)[1].split("[end:setup-times]", 1)[0]
    assert len(time_claims(section)) == 2  # the included lines are the README's statements
    assert time_claims("`make test` about 5–6 min on 2 CPU cores") and not time_claims("`make test` runs the suite")
