"""The report's first screen: which card to ship and why, the command that writes it, and every warning `export`
prints about it.

The card is the one `promptopt export RUN_DIR` writes, built by export itself (card.py), so it is chosen by
export's rule on dev numbers only (workflows/export/select.py) and the warnings are export's own
(`Exported.warnings`, from export/workflow.py's `warnings_for`). The next best candidate is export's rule applied
to the other search winners (`select_by_dev`). Both comparisons pair answers on the same test items: where compare
already paired the same two answer vectors, its row of compare_paired.csv is shown (one comparison, one interval,
on every page and table); otherwise compare's own function (`paired_table`) with compare's seed. Δ accuracy with its
paired-bootstrap interval, the exact McNemar p, and the one significance rule (both must agree; where they do not,
the text says which one held). When the card does not beat
the task's default prompt on the test items, the page says that first."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from promptopt.report.numbers import esc, estimate, finite, note, num
from promptopt.report.verdict import disagreement, pvalue, test_name
from promptopt.workflows.compare.records import ACCURACY, DELTA_ACCURACY, interval_columns


def _paired(source, a: list[bool], b: list[bool], ids: list[str], names: tuple[str, str] | None = None) -> dict:
    """Δ accuracy of answers `a` − `b` on the items `ids`, paired. Where compare already paired the same two
    answer vectors (`names`: the two entries of compare_paired.csv, whose test answers in test_items.parquet are
    `a` and `b`), its row is read back, so the report shows the interval compare wrote, never a second draw of the
    same bootstrap; otherwise compare's own function with compare's seed."""
    row = compare_row(source, names, a, b, ids) if names is not None else None
    if row is not None:
        return row
    from promptopt.workflows.compare import Evaluated, paired_table

    tables = [Evaluated(pd.DataFrame({"item_id": ids, "correct": list(x)})) for x in (a, b)]
    return paired_table({"a": [tables[0]], "b": [tables[1]]}, seed=_seed(source)).iloc[0].to_dict()


def _seed(source) -> int:
    """The bootstrap seed compare used (its base study's), 0 for a run without one."""
    return int(source.config.study.seed) if source.config is not None else 0


def compare_row(source, names: tuple[str, str], a: list[bool], b: list[bool], ids: list[str]) -> dict | None:
    """compare_paired.csv's row for `names` (first − second; a row stored the other way round is flipped), when
    the compare has one seed and its test answers of both entries are exactly `a` and `b`: the same pair, the
    same numbers. None where compare did not pair these answers."""
    if source.kind != "compare" or source.paired is None or source.seeds != 1:
        return None
    first, second = names
    if _test_answers(source.root, first, 0, ids) != list(a) or _test_answers(source.root, second, 0, ids) != list(b):
        return None
    for _, row in source.paired.iterrows():
        if (row["a"], row["b"]) == (first, second):
            return row.to_dict()
        if (row["a"], row["b"]) == (second, first):
            return flipped(row.to_dict())
    return None


def flipped(row: dict) -> dict:
    """A paired row read the other way round (b − a): every Δ negated with its interval mirrored, the discordant
    counts swapped; p-values and the significance flag are symmetric."""
    out = dict(row, a=row["b"], b=row["a"], only_a_correct=row["only_b_correct"], only_b_correct=row["only_a_correct"])
    for key in row:
        if key.startswith("delta_") and not key.endswith(("_ci_low", "_ci_high")):
            out[key] = -row[key]
            low_column, high_column = interval_columns(key)
            low, high = row.get(low_column), row.get(high_column)
            if low is not None and high is not None:
                out[low_column], out[high_column] = -high, -low
    return out


def against(row: dict, first: str, second: str) -> str:
    """'Δ accuracy +0.05 [−0.10, 0.20], McNemar p = 0.75 (3 / 1 discordant), not significant' (first − second)."""
    low, high = (row[c] for c in interval_columns(DELTA_ACCURACY))
    p = row["mcnemar_p"]
    test = test_name(row)
    if int(row["only_a_correct"]) == int(row["only_b_correct"]) == 0:
        return (
            f"the same right and wrong answers on all {int(row['n_pairs'])} items: Δ accuracy 0, {test} p = "
            f"{pvalue(p)} (no discordant item), not significant"
        )
    text = (
        f"Δ accuracy {estimate(row[DELTA_ACCURACY], low, high, signed=True)}, {test} p = {pvalue(p)} "
        f"({int(row['only_a_correct'])} right only with {first}, {int(row['only_b_correct'])} only with {second})"
    )
    if row["significant"]:
        return text + f", significant (favours {first if row[DELTA_ACCURACY] > 0 else second})"
    return text + ", not significant" + disagreement(low, high, p, test)


def _entry(exported) -> str | None:
    """The compare entry (strategy) whose winner export picked, or None outside a compare."""
    row = exported.run.compare_row or {}
    return row.get("strategy")


def _card_answers(card: dict, default: dict) -> list[bool] | None:
    correct = (card.get("metrics", {}).get("test") or {}).get("correct")
    if not correct or len(correct) != default["n"]:
        return None
    return [c == "1" for c in correct]


def _test_answers(root: Path, strategy: str, seed: int, ids: list[str]) -> list[bool] | None:
    """A compare winner's test answers (test_items.parquet) in the order of `ids`, or None where not kept."""
    path = root / "test_items.parquet"
    if not path.is_file():
        return None
    table = pd.read_parquet(path, columns=["strategy", "seed", "item_id", "correct"])
    mine = table[(table["strategy"] == strategy) & (table["seed"] == seed)].set_index("item_id")["correct"]
    mine.index = mine.index.astype(str)
    if set(mine.index) != set(ids):
        return None
    return [bool(mine[i]) for i in ids]


def _next_best(source, chosen) -> tuple[dict | None, str]:
    """The candidate export's rule ranks next (the selection rule over the other search winners), or why there is
    none."""
    if source.kind != "compare":
        return None, (
            "a single search measures only its winner on test items (`promptopt compare` pairs several winners)"
        )
    from promptopt.workflows.export import compare_candidates, select_by_dev

    candidates = compare_candidates(source.root)
    row = chosen.exported.run.compare_row or {}
    others = candidates[
        ~(
            (candidates["strategy"] == row.get("strategy"))
            & (candidates["seed"] == row.get("seed"))
            & (candidates["trial"] == row.get("trial"))
        )
    ]
    if not others["winner"].astype(bool).any():
        return None, "no other search winner in this compare"
    best, _, _ = select_by_dev(others)
    return best.to_dict(), ""


def _worst_unseen(card: dict) -> str:
    robust = card.get("metrics", {}).get("robustness") or {}
    for key, label in (("acc_worst_unseen", "Acc_worst (unseen)"), ("acc_worst", "Acc_worst (all judged families)")):
        if finite(robust.get(key)):
            low, high = (robust.get(f"{key}_ci95") or [None, None])[:2]
            return f"{label} {estimate(robust[key], low, high)} on {robust.get('n') or '?'} stressed test items"
    return "Acc_worst not measured (compare with a --suite measures it; a search alone does not)"


def _command(source) -> str:
    return f"promptopt export {source.root} --out {source.root / 'card.yaml'}"


def recommendation(source, chosen) -> str:
    """The first screen, as HTML (empty for a directory with no search: evaluate, sweep, proxy)."""
    if source.kind not in ("compare", "search", "rounds"):
        return ""
    command = f'<pre class="command" id="export-command">{esc(_command(source))}</pre>'
    if chosen.card is None:
        return (
            f'<p class="headline" id="ship">No recommendation: export could not build this run\'s card '
            f"({esc(chosen.problem)}). Run it to see why:</p>{command}"
        )
    if chosen.exported is None:  # a card given with --card: export's own pick was not run
        return (
            f'<p class="headline" id="ship">This report shows the card given with --card ({esc(chosen.path)}); '
            "without --card it shows the card export picks, with export's warnings. Export's pick:</p>" + command
        )
    exported, card = chosen.exported, chosen.card
    search, test = card.get("search") or {}, card["metrics"]["test"]
    default = exported.default
    name = str(search.get("strategy"))
    where = f"trial {search.get('trial')} of study {search.get('study')}" + (
        f", seed {chosen.seed}" if source.seeds > 1 else ""
    )
    low, high = (test.get("accuracy_ci95") or [None, None])[:2]
    parts = [f"accuracy {estimate(test['accuracy'], low, high)} on {test['n']} test items", _worst_unseen(card)]
    ours = _card_answers(card, default) if default else None
    beats = default is None or test["accuracy"] > default["accuracy"]
    entry = _entry(exported)
    if ours is not None:
        vs_default = _paired(
            source, ours, default["correct"], default["item_ids"], (entry, "baseline") if entry else None
        )
    if ours is not None and beats:
        parts.append(
            f"against the task's default prompt ({num(default['accuracy'], 3)} on the same items): "
            + against(vs_default, name, "the default prompt")
        )
    elif ours is None:
        vs_default = None
        parts.append("against the task's default prompt: not paired (the card records no per-item answers)")
    nxt, why_none = _next_best(source, chosen)
    if nxt is not None:
        other = f"{nxt['strategy']}" + (f" seed {int(nxt['seed'])}" if source.seeds > 1 else "")
        theirs = _test_answers(source.root, nxt["strategy"], int(nxt["seed"]), default["item_ids"]) if ours else None
        head = f"against the next best by the same rule ({other}, trial {int(nxt['trial'])}, dev accuracy {num(nxt['dev_accuracy'], 3)}): "
        parts.append(
            head
            + against(
                _paired(source, ours, theirs, default["item_ids"], (entry, nxt["strategy"]) if entry else None),
                name,
                other,
            )
            if theirs is not None
            else head + "not paired (test_items.parquet does not hold its answers)"
        )
    else:
        parts.append(f"against the next best: none ({why_none})")
    out = []
    if not beats:
        out.append(_nothing_beats(source, test, default, vs_default))
    verb = "Ship" if beats else "If you ship a searched prompt anyway, export's card is"
    out.append(
        f'<p class="headline" id="ship">{verb} <b>{esc(name)}</b> ({esc(where)}; run {esc(exported.run.path)}): '
        + "; ".join(esc(p) for p in parts)
        + ".</p>"
    )
    out.append(
        '<p id="why"><b>Why this card:</b> export\'s rule, on dev numbers only (the same code as '
        f"<code>promptopt export</code>): {esc(search.get('selection') or exported.run.selection)}. The test numbers "
        "above measure the choice; they made none.</p>"
    )
    out.append(f"<p>Write it with:</p>{command}")
    if exported.warnings:
        items = "".join(f'<li class="export-warning">warning: {esc(w)}</li>' for w in exported.warnings)
        out.append(f'<ul class="warnings" id="export-warnings">{items}</ul>')
        out.append(note("export prints these same warnings on stderr when it writes the card."))
    else:
        out.append(note('<span id="export-warnings">export prints no warning for this card.</span>'))
    return "".join(out)


def _nothing_beats(source, test: dict, default: dict, vs_default: dict | None) -> str:
    """The first line when export's card is not better than the default prompt on the test items."""
    paired = f", {against(vs_default, 'the card', 'the default prompt')}" if vs_default is not None else ""
    others = _winners_above(source, default)
    if others:
        lead = (
            "Keep the task's default prompt: the card export picks (by dev) does not beat it on the test items "
            f"({num(test['accuracy'], 3)} vs {num(default['accuracy'], 3)} on {default['n']} items{paired}). "
            f"{others} score higher on test, but test items never choose."
        )
    else:
        lead = (
            "Keep the task's default prompt: nothing here beats it on the test items (export's card "
            f"{num(test['accuracy'], 3)} vs the default prompt's {num(default['accuracy'], 3)} on {default['n']} "
            f"items{paired})."
        )
    return f'<p class="headline nothing-beats" id="nothing-beats">{esc(lead)}</p>'


def _winners_above(source, default: dict) -> str:
    """Which other search winners of a compare score above the default prompt on test ('' if none)."""
    if source.kind != "compare" or source.candidates is None:
        return ""
    frame = source.candidates
    ensemble = frame["strategy"].astype(str).str.contains(r"\+ens\d+$", regex=True)
    winners = frame[frame["winner"].astype(str).str.lower().eq("true") & (frame["strategy"] != "baseline") & ~ensemble]
    above = winners[winners[ACCURACY] > default["accuracy"]]
    if above.empty:
        return ""
    names = ", ".join(
        f"{r['strategy']}" + (f" seed {int(r['seed'])}" if source.seeds > 1 else "") for _, r in above.iterrows()
    )
    return f"{len(above)} other search winner{'s' if len(above) > 1 else ''} ({names})"
