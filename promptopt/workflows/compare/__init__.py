"""`promptopt compare`: do δ_TCB-guided prompts hold up better than PPL-guided ones on this task and model?

Every strategy searches with the same budget, dev and test items; with `seeds` > 1 each is searched
several times (sampler seed and exemplar-candidate draw vary per seed). For each search the top-N
distinct trials are scored on the same held-out test items and stressed (perturbation suite, and taboo
retention at i = 1 for generative tasks); a prompt two searches share is evaluated once. The winner of a
search is the strategy's own choice (`select="strategy"`) or, with `select="robust"`, the trial with the
best Acc_worst on dev items under the search suite among those whose dev accuracy is inside the best one's
95% interval.

Seen and unseen: `search_suite` (default `cheap`) holds the families a search may look at (the `robust`
strategy trains on them, `select="robust"` reads them on dev items); `suite` (default `unseen`) the families
the winners are judged on. A judged family with the name or the operator of a search-suite family is
*seen*, any other *unseen* (`promptopt.robustness.suite.seen_families`), and every robustness number comes
three ways: over all judged families (`acc_worst`, `pdr`, ... as before), over the unseen ones
(`acc_worst_unseen`, ...) and over the seen ones (`acc_worst_seen`, ...; NaN when none is judged). Every
answer goes to `robustness_items.parquet` (one row per strategy, seed, item, family and variant of the
winners, and one clean row per item: family null), from which every robustness number can be recomputed;
every winner's test answers go to `test_items.parquet` (one row per strategy, seed and item).

Then: per strategy mean ± sd over seeds, and for every pair of strategies (and each against the task's
default prompt) the paired difference on the same test items — accuracy, Acc_worst, PDR — with a seeded
95% paired-bootstrap interval and an exact McNemar p-value on per-item correctness (pairs are the same
seed of both strategies; items of all seeds are pooled).

One session: the model is loaded once, one result cache serves every study, all studies live in one
storage (`study.db` in the run directory by default).

A compare is one resumable unit: `resume=True` continues whatever exists (finished studies reused, a killed
one resumed, missing ones created) and reuses every finished evaluation (`evaluations/` in the run
directory), so a compare killed anywhere ends with the tables the uninterrupted run writes. Whether each
study may be resumed or created is decided before anything is scored.

- workflow.py: run_compare, stage by stage (plan, evaluator and its resume key, baseline, searches, tables, files)
- plan.py: study configs per (strategy, seed), what may be resumed
- records.py: what compare hands export and the report: RunRow (a compare_runs.csv row) and the column names
- evaluate.py: a prompt's test answers and stress, once per distinct prompt, kept on disk for a resumed compare
- choose.py: which of a search's top trials wins · tables.py: per-candidate rows, per-strategy table
- paired.py: strategies paired on the same items, seeds pooled · write.py: the files of the run directory
"""

from promptopt.workflows.compare.choose import WINNER_SELECTIONS
from promptopt.workflows.compare.evaluate import Evaluated
from promptopt.workflows.compare.paired import SPLITS, cluster_resamples, paired_table
from promptopt.workflows.compare.workflow import CompareResult, run_compare
from promptopt.workflows.compare.write import ITEMS_FILE, TEST_ITEMS_FILE

__all__ = [
    "ITEMS_FILE",
    "WINNER_SELECTIONS",
    "SPLITS",
    "TEST_ITEMS_FILE",
    "CompareResult",
    "Evaluated",
    "cluster_resamples",
    "paired_table",
    "run_compare",
]
