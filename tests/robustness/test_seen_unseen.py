"""Seen and unseen perturbations: a judged family the search suite has (by name or operator) is reported as
seen, every other as unseen, in compare's tables, summary.json and robustness_items.parquet. Plumbing on the
tiny random model with hand-made suites."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from promptopt.metrics.stats import PerItemRobustness
from promptopt.robustness.suite import load_suite, parse_suite, seen_families
from tests.clirun import promptopt as run_cli

REPO = Path(__file__).resolve().parents[2]
JUDGE = """name: judge
seed: 7
similarity_threshold: 0.5
distractors: {distractors}
families:
  typo: {{operator: keyboard_typos, max_chars: 1, max_words: 2}}
  distractor: {{operator: distractor}}
  reorder: {{operator: exemplar_reorder}}
"""
# `typo` is in both suites (same name); `reorder` has a search-suite family's operator under another name
SEARCH = """name: searched
seed: 7
families:
  typo: {operator: keyboard_typos, max_chars: 1, max_words: 2}
  swap: {operator: exemplar_reorder}
"""


@pytest.fixture(scope="module")
def suites(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("suites")
    (folder / "judge.yaml").write_text(JUDGE.format(distractors=REPO / "perturbations" / "distractors.txt"))
    (folder / "searched.yaml").write_text(SEARCH)
    return folder / "judge.yaml", folder / "searched.yaml"


def _config(tiny_llama_dir, out):
    from promptopt.study import SearchConfig

    return SearchConfig.build(
        task="sst2",
        trials=2,
        model=str(tiny_llama_dir),
        out=str(out),
        dev_limit=4,
        test_limit=6,
        minibatch=2,
        device="cpu",
    )


STRATEGIES = ["accuracy", "robust"]  # robust trains on the search suite


@pytest.fixture(scope="module")
def compared(tiny_llama_dir, suites, tmp_path_factory):
    from promptopt.workflows.compare import run_compare

    judge, searched = suites
    out = tmp_path_factory.mktemp("seen") / "cmp"
    result = run_compare(
        _config(tiny_llama_dir, out),
        STRATEGIES,
        top_n=1,
        suite=str(judge),
        search_suite=str(searched),
        show_progress=False,
    )
    return out, result


def test_seen_families_by_name_or_operator(tmp_path):
    judge = parse_suite(
        {
            "families": {
                "typo": {"operator": "keyboard_typos"},
                "distractor": {"operator": "distractor"},
                "wordnet": {"operator": "synonym", "max_words": 6},
            }
        },
        str(tmp_path / "j.yaml"),
    )
    searched = parse_suite(
        {"families": {"typo": {"operator": "spelling_typos"}, "syn": {"operator": "synonym"}}}, str(tmp_path / "s.yaml")
    )
    assert seen_families(judge, searched) == {"typo", "wordnet"}  # typo by its name, wordnet by its operator
    assert seen_families(judge, None) == frozenset()
    assert seen_families(load_suite("unseen"), load_suite("cheap")) == frozenset()  # the built-in default: disjoint
    assert seen_families(load_suite("quick"), load_suite("cheap")) == {"synonym", "exemplar_reorder", "typos_keyboard"}


def test_a_family_in_both_suites_is_reported_as_seen(compared):
    out, result = compared
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["suite"], summary["search_suite"]) == ("judge", "searched")
    assert summary["families_seen"] == ["typo", "reorder"] and summary["families_unseen"] == ["distractor"]
    items = pd.read_parquet(out / "robustness_items.parquet")
    variants = items[items["family"].notna()]
    assert set(variants["family"]) == {"typo", "distractor", "reorder"}
    assert (variants["seen"] == variants["family"].isin(["typo", "reorder"])).all()
    assert items.loc[items["family"].isna(), "seen"].isna().all()  # clean rows are neither
    runs = pd.read_csv(out / "compare_runs.csv")
    for split in ("seen", "unseen"):
        assert runs[f"acc_worst_{split}"].map(math.isfinite).all() and f"acc_worst_{split}_ci_low" in runs
        assert f"delta_acc_worst_{split}" in result.paired and f"delta_pdr_{split}_ci_high" in result.paired
    assert "acc_worst_unseen" in pd.read_csv(out / "compare.csv")


def test_format_spread_is_labelled_seen_or_unseen(tiny_llama_dir, tmp_path):
    """A format family is seen when the search suite perturbs formats too (same operator), unseen otherwise;
    the summary labels its spread accordingly and leaves the other split NaN."""
    judge = tmp_path / "judge.yaml"
    judge.write_text(
        yaml.safe_dump(
            {
                "name": "judge",
                "families": {
                    "typo": {"operator": "keyboard_typos", "max_chars": 2},
                    "layout": {"operator": "format", "variants": 2},
                },
            }
        )
    )
    for searched_families, split in (
        ({"typo": {"operator": "keyboard_typos"}}, "unseen"),
        ({"formats": {"operator": "format", "variants": 2}}, "seen"),
    ):
        searched = tmp_path / f"searched-{split}.yaml"
        searched.write_text(yaml.safe_dump({"name": "searched", "families": searched_families}))
        out = tmp_path / f"robustness-{split}"
        proc = run_cli(
            "evaluate",
            "--task",
            "sst2",
            "--model",
            tiny_llama_dir,
            "--suite",
            judge,
            "--search-suite",
            searched,
            "--limit",
            3,
            "--out",
            out,
            "--device",
            "cpu",
        )
        assert proc.code == 0, proc.stderr
        summary = json.loads(out.with_suffix(".json").read_text())
        other = "seen" if split == "unseen" else "unseen"
        assert summary["format_spread_family"] == summary[f"format_spread_{split}_family"] == "layout"
        assert summary[f"format_spread_{split}"] == summary["format_spread"] and math.isfinite(summary["format_spread"])
        assert summary[f"format_spread_{split}_ci95"] == summary["format_spread_ci95"]
        assert math.isnan(summary[f"format_spread_{other}"]) and summary[f"format_spread_{other}_family"] is None


def test_evaluate_labels_families_by_the_search_suite(tiny_llama_dir, suites, tmp_path):
    judge, searched = suites
    proc = run_cli(
        "evaluate",
        "--task",
        "sst2",
        "--model",
        tiny_llama_dir,
        "--suite",
        judge,
        "--search-suite",
        searched,
        "--limit",
        3,
        "--out",
        tmp_path / "robustness",
        "--device",
        "cpu",
    )
    assert proc.code == 0, proc.stderr
    families = pd.read_csv(tmp_path / "robustness.csv").set_index("family")
    assert families["seen"].to_dict() == {"typo": True, "distractor": False, "reorder": True}
    summary = json.loads((tmp_path / "robustness.json").read_text())
    assert summary["families_seen"] == ["typo", "reorder"] and summary["search_suite"] == "searched"
    assert "seen" in proc.stdout and "unseen" in proc.stdout
    items = pd.read_parquet(tmp_path / "robustness_items.parquet")
    assert len(items[items["family"].isna()]) == 3 and set(items["variant_kind"]) <= {"clean", "question", "prompt"}


# --- every answer kept ---------------------------------------------------------------------------------------------
def recompute(items: pd.DataFrame, split: str | None = None) -> dict:
    """acc_worst and pdr of one prompt from its rows of robustness_items.parquet alone."""
    clean = items[items["family"].isna()].set_index("item_id")["clean_correct"].astype(bool)
    variants = items[items["family"].notna()]
    if split is not None:
        variants = variants[variants["seen"].astype(bool) == (split == "seen")]
    rows = variants.rename(columns={"perturbed_correct": "correct"})[["item_id", "family", "correct"]].astype(
        {"correct": bool}
    )
    return PerItemRobustness(clean, rows).metrics()


def test_compare_numbers_are_recomputed_from_robustness_items(compared):
    out, _ = compared
    items = pd.read_parquet(out / "robustness_items.parquet")
    runs = pd.read_csv(out / "compare_runs.csv")
    table = pd.read_csv(out / "compare.csv").set_index("strategy")
    for _, row in runs[runs["winner"]].iterrows():
        mine = items[(items["strategy"] == row["strategy"]) & (items["seed"] == row["seed"])]
        for split, suffix in ((None, ""), ("unseen", "_unseen"), ("seen", "_seen")):
            again = recompute(mine, split)
            for key in ("acc_worst", "pdr"):
                assert again[key] == pytest.approx(row[f"{key}{suffix}"], nan_ok=True), (row["strategy"], key, split)
                assert again[key] == pytest.approx(table.loc[row["strategy"], f"{key}{suffix}"], nan_ok=True)


def test_a_resumed_compare_writes_the_same_items(compared, tiny_llama_dir, suites):
    from promptopt.workflows.compare import run_compare

    out, _ = compared
    before = pd.read_parquet(out / "robustness_items.parquet")
    again = run_compare(
        _config(tiny_llama_dir, out).replace(resume=True),
        STRATEGIES,
        top_n=1,
        suite=str(suites[0]),
        search_suite=str(suites[1]),
        show_progress=False,
    )
    assert again.summary["evaluations_resumed"] == again.summary["evaluations"]  # nothing scored again
    pd.testing.assert_frame_equal(pd.read_parquet(out / "robustness_items.parquet"), before)
    from promptopt.errors import UserError

    assert json.loads((out / "search_suite.json").read_text())["name"] == "searched"
    with pytest.raises(UserError, match="robust strategy under --search-suite searched"):  # its studies trained on that
        run_compare(
            _config(tiny_llama_dir, out).replace(resume=True),
            STRATEGIES,
            top_n=1,
            suite=str(suites[0]),
            search_suite="cheap",
            show_progress=False,
        )


@pytest.mark.slow
def test_evaluate_summary_is_recomputed_from_its_items_on_the_embedded_model(embedded_lm, suites, tmp_path):
    """SmolLM2 changes some answers under typos (seen) and distractors (unseen): the kept answers give back
    every summary number, overall and per split."""
    from promptopt.models import ModelConfig
    from promptopt.scoring import Scorer
    from promptopt.tasks.data import DataConfig
    from promptopt.workflows import evaluate
    from promptopt.workflows.session import Session

    suite = tmp_path / "two.yaml"
    suite.write_text("\n".join(line for line in suites[0].read_text().splitlines() if "reorder" not in line))
    session = Session(model=ModelConfig(spec="smollm2-135m-instruct", device="cpu"), data=DataConfig(task="sst2"))
    session.__dict__["scorer"] = Scorer(embedded_lm, session.data)  # the session's model is the one already loaded
    _, result = evaluate.evaluate(
        session, card=None, suite=str(suite), split="test", limit=6, out=tmp_path / "rob", search_suite=str(suites[1])
    )
    summary = json.loads((tmp_path / "rob.json").read_text())
    assert summary["families_seen"] == ["typo"] and summary["families_unseen"] == ["distractor"]
    items = pd.read_parquet(tmp_path / "rob_items.parquet")
    variants = items[items["family"].notna()]
    assert (variants["clean_prediction"] != variants["perturbed_prediction"]).any()  # something to recompute
    for split, suffix in ((None, ""), ("unseen", "_unseen"), ("seen", "_seen")):
        again = recompute(items, split)
        for key in ("acc_worst", "pdr"):
            assert again[key] == pytest.approx(summary[f"{key}{suffix}"], nan_ok=True), (key, split)
            assert again[key] == pytest.approx(result.summary[f"{key}{suffix}"], nan_ok=True)
    assert np.isfinite(
        variants[
            ["clean_tcb", "perturbed_tcb", "clean_margin", "clean_top_prob", "clean_entropy", "clean_v_eff"]
        ].to_numpy()
    ).all()


# --- the item-level AUROC ------------------------------------------------------------------------------------------
def _answers() -> pd.DataFrame:
    """Six answers of one prompt, a..g: a and c change under an unseen family; f changes only under a seen one."""
    clean = {  # item: (δ_TCB, margin, P(top1), entropy, V_eff)
        "a": (0.5, 0.1, 0.55, 0.6, 1.9),
        "b": (2.0, 2.0, 0.9, 0.1, 1.1),
        "c": (1.0, 0.5, 0.6, 0.2, 1.5),
        "d": (4.0, 3.0, 0.95, 0.3, 1.05),
        "e": (1.0, 0.2, 0.7, 0.05, 1.2),
        "f": (0.1, 0.1, 0.5, 0.7, 2.0),
        "g": (math.inf, 5.0, 1.0, 0.0, 1.0),
    }
    variants = [
        ("a", "para", False, "0"),
        ("a", "para", False, "1"),
        ("b", "para", False, "1"),
        ("c", "dis", False, "1"),
        ("c", "dis", False, "0"),
        ("d", "dis", False, "1"),
        ("e", "para", False, "1"),
        ("f", "typo", True, "0"),
        ("g", "para", False, "1"),
        ("b", "typo", True, "1"),
    ]
    rows = [
        {"item_id": i, "family": None, "seen": None, "clean_prediction": "1", "perturbed_prediction": None}
        for i in clean
    ]
    rows += [
        {"item_id": i, "family": fam, "seen": seen, "clean_prediction": "1", "perturbed_prediction": pred}
        for i, fam, seen, pred in variants
    ]
    frame = pd.DataFrame(rows)
    for j, name in enumerate(("tcb", "margin", "top_prob", "entropy", "v_eff")):
        frame[f"clean_{name}"] = frame["item_id"].map(lambda i, j=j: clean[i][j])
    frame["seen"] = frame["seen"].astype("boolean")
    return frame


def test_item_auroc_against_hand_values():
    from promptopt.analyses.item_auroc import answers, item_auroc

    table = answers(_answers())
    assert sorted(table["item_id"]) == list("abcdeg")  # f has no unseen variant: left out
    assert table.set_index("item_id")["changed"].to_dict() == {
        "a": True,
        "b": False,
        "c": True,
        "d": False,
        "e": False,
        "g": False,
    }
    result = item_auroc(_answers(), n_boot=200).set_index("signal")
    # positives a, c; negatives b, d, e, g: 8 pairs.
    # δ_TCB, score −log10 δ: a 0.30, c 0, b −0.30, d −0.60, e 0 (ties c), g −inf (δ = +inf ranks lowest, kept):
    #   a beats all 4; c beats b, d, g and ties e (½) -> 7.5 / 8
    assert result.loc["log10_tcb", "auroc"] == pytest.approx(7.5 / 8)
    # margin, score −margin: a −0.1 beats all; c −0.5 beats b −2, d −3, g −5, loses to e −0.2 -> 7 / 8
    assert result.loc["margin", "auroc"] == pytest.approx(7 / 8)
    # entropy, score +entropy: a 0.6 beats all; c 0.2 beats b 0.1, e 0.05, g 0, loses to d 0.3 -> 7 / 8
    assert result.loc["entropy", "auroc"] == pytest.approx(7 / 8)
    # P(top1), score −P: a −0.55 and c −0.6 both beat b −0.9, d −0.95, e −0.7, g −1 -> 8 / 8
    assert result.loc["top_prob", "auroc"] == pytest.approx(1.0)
    assert (result["n_answers"] == 6).all() and (result["n_changed"] == 2).all()
    assert (result["ci_low"] <= result["auroc"]).all() and (result["auroc"] <= result["ci_high"]).all()
    seen = item_auroc(_answers(), split="seen", n_boot=50).set_index("signal")
    assert seen.loc["log10_tcb", "n_answers"] == 2  # b and f have a seen variant; f changed: −log10 0.1 > −log10 2
    assert seen.loc["log10_tcb", "auroc"] == pytest.approx(1.0)


def test_diagnose_proxy_reads_the_answers_a_compare_kept(compared):
    out, _ = compared
    proc = run_cli("diagnose", "proxy", out)
    assert proc.code == 0, proc.stderr
    table = pd.read_csv(out / "proxy_item_auroc.csv")
    assert table["signal"].tolist() == ["log10_tcb", "margin", "top_prob", "entropy", "v_eff"]
    assert (table["split"] == "unseen").all() and "item-level AUROC" in proc.stdout


def test_search_robust_trains_on_its_search_suite_and_resume_keeps_it(tiny_llama_dir, suites, tmp_path):
    """`search --strategy robust --search-suite S`: the suite is part of the study's identity, so a resume that would
    score other variants is refused in one line before any scoring."""
    judge, searched = suites
    out = tmp_path / "robust"
    args = [
        "search",
        "--task",
        "sst2",
        "--model",
        tiny_llama_dir,
        "--strategy",
        "robust",
        "--trials",
        "2",
        "--dev-limit",
        "4",
        "--test-limit",
        "4",
        "--minibatch",
        "2",
        "--device",
        "cpu",
        "--out",
        out,
    ]
    first = run_cli(*args, "--search-suite", searched)
    assert first.code == 0, first.stderr
    refused = run_cli(*args, "--search-suite", judge, "--resume")
    assert refused.code == 2 and "search_suite_sha256=" in refused.stderr and refused.stderr.count("\n") == 1, (
        refused.stderr
    )
    again = run_cli(*args, "--search-suite", searched, "--resume", "--trials", "3")
    assert again.code == 0, again.stderr


def test_exported_card_carries_the_seen_and_unseen_numbers(compared, tmp_path):
    """The card of a compare's winner states robustness over the families no search saw apart from the seen ones,
    each equal to what compare measured, with the family lists."""
    from promptopt.workflows.export import export_run

    out, _ = compared
    exported = export_run(out, out=tmp_path / "card.yaml", strategy="accuracy")
    robust = exported.card["metrics"]["robustness"]
    runs = pd.read_csv(out / "compare_runs.csv")
    row = runs[(runs["strategy"] == "accuracy") & runs["winner"].astype(bool)].iloc[0]
    assert robust["families_unseen"] == ["distractor"] and robust["families_seen"] == ["typo", "reorder"]
    summary = json.loads((out / "summary.json").read_text())
    assert robust["n"] == summary["n_robust"] and robust["n"] > 0  # how many test items were stressed
    for split in ("unseen", "seen"):
        assert robust[f"acc_worst_{split}"] == pytest.approx(row[f"acc_worst_{split}"])
        assert robust[f"acc_worst_{split}_ci95"] == pytest.approx(
            [row[f"acc_worst_{split}_ci_low"], row[f"acc_worst_{split}_ci_high"]]
        )
        assert robust[f"pdr_{split}"] == pytest.approx(row[f"pdr_{split}"], nan_ok=True)


def test_a_suites_hash_is_its_content_wherever_its_file_lies(tmp_path):
    """The same suite from two places (another clone, another worker's install) is one suite: a robust study's
    identity (the expander's fingerprint) and the compare's search-suite marker agree (the marker's hash is the one
    the evaluation keys use); a changed option does not."""
    from promptopt.errors import UserError
    from promptopt.robustness.suite import VariantExpander, suite_sha256
    from promptopt.workflows.compare.plan import SEARCH_SUITE_FILE, search_suite_marker

    cheap = Path(load_suite("cheap").where).read_text(encoding="utf-8")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    here, there = tmp_path / "a" / "cheap.yaml", tmp_path / "b" / "cheap.yaml"
    here.write_text(cheap, encoding="utf-8")
    there.write_text(cheap, encoding="utf-8")
    assert load_suite(str(here)).where != load_suite(str(there)).where
    assert (
        suite_sha256(load_suite(str(here))) == suite_sha256(load_suite(str(there))) == suite_sha256(load_suite("cheap"))
    )
    assert VariantExpander(str(here)).fingerprint() == VariantExpander(str(there)).fingerprint()
    out = tmp_path / "run"
    out.mkdir()
    (out / SEARCH_SUITE_FILE).write_text(json.dumps(search_suite_marker(out, load_suite(str(here)), resume=False)))
    search_suite_marker(out, load_suite(str(there)), resume=True)  # resumes from the other copy
    changed = yaml.safe_load(cheap)
    changed["similarity_threshold"] = 0.5
    there.write_text(yaml.safe_dump(changed), encoding="utf-8")
    assert suite_sha256(load_suite(str(there))) != suite_sha256(load_suite(str(here)))
    with pytest.raises(UserError, match="with other content .*resume it with the suite it started with"):
        search_suite_marker(out, load_suite(str(there)), resume=True)
