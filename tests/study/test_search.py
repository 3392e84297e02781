"""promptopt search: encoding, strategies, reproducibility, resume, heartbeat recovery, bad input,
several workers on one PostgreSQL study."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml

from promptopt.errors import ConfigError, UserError
from promptopt.prompts import load_card
from promptopt.study import SearchConfig, get_strategy, load_space, parse_space, run_search, stability
from promptopt.study.space import builtin_space_names
from promptopt.tasks import builtin_task_names, load_task

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def config(tmp_path, tiny_llama_dir):
    return SearchConfig.build(
        task="sst2",
        strategy="tcb",
        trials=5,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "run"),
        dev_limit=12,
        test_limit=6,
        minibatch=4,
        device="cpu",
        incumbent="none",  # these tests are about the study's own trials (tests/study/test_incumbent.py: the incumbent)
        scan="off",
    )


def test_every_builtin_task_has_a_valid_space():
    assert set(builtin_space_names()) == set(builtin_task_names())
    for name in builtin_space_names():
        space = load_space(name)
        assert space.check_against(load_task(name))
        assert {"none", "zero_shot_cot" if name != "humaneval" else "none"} <= set(space.instructions)


def test_random_key_encoding_decodes_to_valid_prompts():
    space = load_space("sst2")
    data = load_task("sst2")
    candidates = space.check_against(data)
    sampler = optuna.samplers.RandomSampler(seed=0)
    study = optuna.create_study(sampler=sampler)
    seen_orders = set()
    for _ in range(60):
        trial = study.ask()
        prompt = space.suggest(trial, candidates, data.spec)
        ids = [ex.id for ex in prompt.exemplars]
        assert len(ids) == len(set(ids)) == trial.params["k"]  # distinct shots, exactly k of them
        assert set(ids) <= {c.id for c in candidates}  # only pool candidates, never dev/test
        assert prompt.template.name == trial.params["template"]
        seen_orders.add(tuple(ids))
        study.tell(trial, 0.0)
    assert len(seen_orders) > 30


def test_stability_transform_and_strategies():
    assert stability([0.1, 1.0, 1e5, np.inf, np.nan]).tolist() == pytest.approx([0.0, 1 / 6, 1.0, 1.0, 0.0])
    table = pd.DataFrame({"correct": [True, False], "tcb": [1e5, 1e5], "ppl": [1.0, np.e]})
    assert get_strategy("accuracy").values(table) == (0.5,)
    assert get_strategy("acc_ppl").item_values(table).tolist() == pytest.approx([1.0, -0.1])  # the former ppl blend
    assert get_strategy("ppl").item_values(table).tolist() == pytest.approx(
        [0.0, -1.0]
    )  # −NLL of the answer, nothing else
    with_span = table.assign(answer_nll=[0.5, 2.0])
    assert get_strategy("ppl").item_values(with_span).tolist() == pytest.approx([-0.5, -2.0])
    assert get_strategy("ppl_solution").item_values(with_span).tolist() == pytest.approx([0.0, -1.0])
    assert get_strategy("tcb").item_values(table).tolist() == pytest.approx([1.25, -0.25])  # stably wrong is penalized
    assert get_strategy("pareto").values(table) == pytest.approx((0.5, 0.0))
    with pytest.raises(ConfigError, match="unknown strategy 'best'"):
        get_strategy("best")


def test_tcb_selects_the_most_stable_trial_among_those_dev_cannot_tell_from_the_best():
    """Every strategy chooses through the one selection rule (metrics/stats/selection.py): the trials not significantly
    worse than the most accurate on the same dev items (paired) tie; the strategy's tie-break chooses among them."""
    from promptopt.study.strategies import select_winner

    def trial(number, right, value, stability, n=48):
        return {
            "number": number,
            "value": value,
            "accuracy": right / n,
            "n": n,
            "signed_stability": stability,
            "correct": [i < right for i in range(n)],  # nested: the less accurate trial's right items are the best's
        }

    trials = [
        trial(0, 36, 0.80, 0.20),
        trial(1, 39, 0.86, 0.22),  # best accuracy
        trial(2, 34, 0.78, 0.45),  # 5 items behind, all discordant one way: McNemar p = 0.0625, a tie; most stable
        trial(3, 24, 0.50, 0.90),  # stabler, but significantly worse
    ]
    winner, how = select_winner(get_strategy("tcb"), trials)
    assert winner["number"] == 2 and "tie-break 'stability'" in how and "#0, #1, #2" in how, how
    assert select_winner(get_strategy("acc_tcb"), trials)[0]["number"] == 1  # its own value breaks the tie
    # accuracy breaks ties by the run's --tie-break, `stability` by default (it took the best point estimate, #1)
    assert select_winner(get_strategy("accuracy"), trials)[0]["number"] == 2
    assert select_winner(get_strategy("accuracy"), trials, tie_break="value")[0]["number"] == 1
    tight = [dict(t, correct=t["correct"] * 50, n=2400) for t in trials]  # 50× the items: #2 is significantly worse
    assert select_winner(get_strategy("tcb"), tight)[0]["number"] == 1


def test_space_validation_names_file_and_key(tmp_path):
    good = yaml.safe_load(open(load_space("sst2").where))
    with pytest.raises(ConfigError, match=r"s.yaml: exemplars.k: expected \[min, max\]"):
        parse_space({**good, "exemplars": {"k": [3, 1]}}, "s.yaml")
    with pytest.raises(ConfigError, match=r"exemplars.split: expected pool"):
        parse_space({**good, "exemplars": {"k": 2, "split": "dev"}}, "s.yaml")
    big = parse_space({**good, "exemplars": {"k": [0, 100], "candidates": 100}}, "s.yaml")
    with pytest.raises(ConfigError, match="k up to 100 but the pool has only 64 items"):
        big.check_against(load_task("sst2"))
    words = parse_space({**good, "templates": {"t": {"query": "{question}", "label_words": ["a", "b", "c"]}}}, "s.yaml")
    with pytest.raises(ConfigError, match="templates.t.label_words: 3 words for 2 choices"):
        words.check_against(load_task("sst2"))


def test_search_writes_run_directory_and_is_reproducible(config, tmp_path):
    first = run_search(config, show_progress=False)
    out = tmp_path / "run"
    for name in (
        "config.json",
        "splits.json",
        "trials.parquet",
        "trials.csv",
        "best_card.yaml",
        "summary.json",
        "study.db",
        "cache.sqlite",
    ):
        assert (out / name).is_file(), name
    prompt, provenance = load_card(out / "best_card.yaml")
    assert provenance["trial"] == first.best_number and provenance["strategy"] == "tcb"
    assert {ex.id for ex in prompt.exemplars} <= {i.id for i in load_task("sst2").pool}
    done = first.trials[first.trials["state"].isin(["COMPLETE", "PRUNED"])]
    assert len(done) == 5
    # study.db is in WAL mode (no fsync per Optuna commit); a finished run folds the log back into the file,
    # so study.db copied on its own holds every trial
    assert not (out / "study.db-wal").exists()
    (tmp_path / "copy").mkdir()
    shutil.copy(out / "study.db", tmp_path / "copy" / "study.db")
    copied = optuna.load_study(study_name=config.name, storage=f"sqlite:///{tmp_path / 'copy' / 'study.db'}")
    assert len(copied.trials) == len(first.trials) == 5
    second = run_search(config.replace(out=str(tmp_path / "again")), show_progress=False)
    columns = [c for c in first.trials.columns if c.startswith(("params_", "value"))] + ["state"]
    assert "value_tcb" in columns
    pd.testing.assert_frame_equal(first.trials[columns], second.trials[columns])


def test_resume_continues_and_cache_makes_repeats_free(config):
    first = run_search(config.replace(trials=1), show_progress=False)
    with pytest.raises(UserError, match="already exists.*--resume"):
        run_search(config, show_progress=False)
    resumed = run_search(config.replace(trials=8, resume=True), show_progress=False)
    assert resumed.trials["number"].tolist() == list(range(8))
    assert resumed.trials["state"].isin(["COMPLETE", "PRUNED"]).sum() == 8
    params = sorted(c for c in resumed.trials.columns if c.startswith("params_"))
    kept = [c for c in params + ["number", "state", "value_tcb"] if c in first.trials]
    pd.testing.assert_frame_equal(
        resumed.trials[kept].iloc[:1], first.trials[kept], check_dtype=False
    )  # trial 0 is kept as it was
    # Trials 1..7 continue the sequence instead of replaying trial 0's parameters: the resumed sampler is
    # still in its random start-up (2 trials of 8), so one seeded as in the first run would draw them again.
    rows = [tuple(r) for r in resumed.trials[params].astype(str).itertuples(index=False)]
    assert rows[0] not in rows[1:], rows
    space = load_space("sst2")
    assert set(resumed.trials["params_template"]) <= set(space.templates)
    assert set(resumed.trials["params_instruction"]) <= set(space.instructions)
    assert resumed.cache_hit_rate > 0


@pytest.mark.parametrize("strategy", ["accuracy", "ppl", "pareto"])
def test_other_strategies(config, strategy):
    result = run_search(config.replace(strategy=strategy, trials=4), show_progress=False)
    assert result.trials["state"].isin(["COMPLETE", "PRUNED"]).sum() == 4
    if strategy == "pareto":
        assert result.pareto is not None and len(result.pareto) >= 1
        assert {"accuracy", "signed_stability"} <= set(result.pareto.columns)


def _study_rows(url_path) -> int:
    if not url_path.exists():
        return 0
    with sqlite3.connect(url_path) as db:
        try:
            return db.execute("SELECT COUNT(*) FROM studies").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def test_bad_input_writes_no_study_rows(config, tmp_path):
    db = tmp_path / "run" / "study.db"
    with pytest.raises(ConfigError, match="unknown strategy"):
        run_search(config.replace(strategy="fastest"), show_progress=False)
    space = tmp_path / "space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "task": "sst2",
                "instructions": {"none": ""},
                "templates": {"t": {"query": "{question}"}},
                "exemplars": {"k": [0, 80], "candidates": 80},
            }
        )
    )
    with pytest.raises(ConfigError, match="the pool has only 64 items"):
        run_search(config.replace(space=str(space)), show_progress=False)
    with pytest.raises(UserError, match="model file not found"):
        run_search(config.replace(model=str(tmp_path / "missing.gguf")), show_progress=False)
    with pytest.raises(UserError, match="cannot open storage postgresql://u:\\*\\*\\*@127.0.0.1:1/x"):
        run_search(config.replace(storage="postgresql://u:secret@127.0.0.1:1/x"), show_progress=False)
    assert _study_rows(db) == 0


def test_missing_split_in_task_is_reported_before_any_study(tmp_path, config):
    task = tmp_path / "t.yaml"
    spec = yaml.safe_load(open(load_task("sst2").spec.where))
    spec["splits"]["dev"]["from"] = "train"
    task.write_text(yaml.safe_dump(spec))
    with pytest.raises(Exception, match="split 'train' not found"):
        run_search(config.replace(task=str(task), space=load_space("sst2").where), show_progress=False)
    assert _study_rows(tmp_path / "run" / "study.db") == 0


@pytest.mark.long
def test_killed_worker_trial_is_failed_and_rerun(config, tmp_path, tiny_llama_dir):
    out = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "promptopt",
        "search",
        "--task",
        "sst2",
        "--strategy",
        "tcb",
        "--model",
        str(tiny_llama_dir),
        "--trials",
        "500",
        "--dev-limit",
        "12",
        "--test-limit",
        "4",
        "--minibatch",
        "4",
        "--no-pruning",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--incumbent",  # as the `config` fixture the run is resumed with
        "none",
        "--scan",
        "off",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = out / "study.db"
    deadline = time.time() + 120
    running = None
    while time.time() < deadline and running is None:
        time.sleep(0.2)
        if db.exists():
            with sqlite3.connect(db) as conn:
                try:
                    row = conn.execute("SELECT number FROM trials WHERE state='RUNNING' AND number >= 2").fetchone()
                except sqlite3.OperationalError:
                    row = None
            running = row[0] if row else None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert running is not None, "no running trial seen"
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    killed_study = optuna.load_study(study_name="sst2-tcb", storage=storage)
    done_before = sum(t.state.is_finished() and t.state.name != "FAIL" for t in killed_study.trials)
    time.sleep(2)
    cfg = config.replace(
        out=str(out), resume=True, trials=done_before + 2, pruning=False, grace_period=1, heartbeat_interval=1
    )
    result = run_search(cfg, show_progress=False)
    study = optuna.load_study(study_name="sst2-tcb", storage=storage)
    states = {t.number: t.state.name for t in study.trials}
    assert "RUNNING" not in states.values()
    assert states[running] == "FAIL"
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == running]
    assert retried and retried[0].state.name == "COMPLETE"
    assert (
        sum(s == "COMPLETE" for s in states.values()) == done_before + 2 == (result.trials["state"] == "COMPLETE").sum()
    )


def test_two_workers_share_one_postgres_study(config):
    url = os.environ.get("PROMPTOPT_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("CI must provide PostgreSQL: .ci/run starts it and sets PROMPTOPT_TEST_POSTGRES_URL")
        pytest.skip("PROMPTOPT_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL and sets it)")
    name = f"pg-{os.getpid()}-{int(time.time())}"
    result = run_search(config.replace(storage=url, study_name=name, n_workers=2, trials=8), show_progress=False)
    study = optuna.load_study(study_name=name, storage=url)
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers)) == len(result.trials)  # each trial once, in the study and the table
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert 8 <= len(finished) <= 9  # the budget, plus at most one trial already running in the other worker
    assert not [t for t in study.trials if t.state.name == "RUNNING"]
    workers = {t.user_attrs.get("worker") for t in finished}
    assert len(workers) == 2  # both worker processes contributed


def test_compare_same_budget_seed_and_items(config, tmp_path):
    from promptopt.workflows.compare import run_compare

    result = run_compare(
        config.replace(trials=3, out=str(tmp_path / "cmp")), ["ppl", "tcb"], suite="quick", show_progress=False
    )
    table = result.table
    assert table["strategy"].tolist() == ["baseline", "ppl", "tcb"]
    assert (table["n_test"] == 6).all()
    assert {
        "avg_acc",
        "avg_tcb",
        "avg_ppl",
        "search_seconds",
        "acc_var_pert",
        "pdr",
        "acc_worst",
        "taboo_retention_i1",
    } <= set(table.columns)
    assert table["acc_worst"].notna().all() and table["acc_worst_family"].notna().all()
    assert (tmp_path / "cmp" / "compare.csv").is_file() and (tmp_path / "cmp" / "tcb" / "best_card.yaml").is_file()
    studies = optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'cmp' / 'study.db'}")
    assert sorted(s.study_name for s in studies) == ["sst2-ppl", "sst2-tcb"]
    with pytest.raises(ConfigError, match="unknown strategy"):
        run_compare(config.replace(out=str(tmp_path / "cmp2")), ["tcb", "nope"], show_progress=False)


def test_a_model_without_a_chat_template_searches_the_plain_templates_only(capsys):
    """Gemma-3-270M base has no chat template: the space's chat templates leave this run (said in a note), and a
    space of chat templates only is one error line."""
    import types
    from dataclasses import replace

    from promptopt.errors import ConfigError
    from promptopt.study.context import build_context, fit_space_to_model
    from promptopt.tasks import load_task

    config = SearchConfig.build(task="sst2", trials=1)
    ctx = build_context(config, load_task("sst2"))
    chat = {n for n, t in ctx.space.templates.items() if t.chat}
    assert chat, "the built-in sst2 space has a chat template"
    plain_tokenizer = types.SimpleNamespace(chat_template=None)
    notes = []
    fit_space_to_model(ctx, plain_tokenizer, notes.append)
    assert not any(t.chat for t in ctx.space.templates.values()) and ctx.space.templates
    assert notes and all(name in notes[0] for name in chat)
    only_chat = build_context(config, load_task("sst2"))
    only_chat.space = replace(only_chat.space, templates={n: t for n, t in only_chat.space.templates.items() if t.chat})
    with pytest.raises(ConfigError, match="every template is a chat template"):
        fit_space_to_model(only_chat, plain_tokenizer)
    chatty = build_context(config, load_task("sst2"))
    fit_space_to_model(chatty, types.SimpleNamespace(chat_template="{{ messages }}"))
    assert chat <= set(chatty.space.templates)  # a model with a chat template keeps them
