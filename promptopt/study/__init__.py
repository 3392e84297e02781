"""Search: one Optuna study over instructions × exemplar sets × orders × templates. It receives a scorer and
never imports robustness.

- space.py: search space YAML -> Optuna parameters · strategies.py: what a trial is worth, who wins
- config.py: run settings · context.py: a run's resolved inputs, params -> Prompt
- study.py: run_search, top to bottom · trial.py: one trial and the trial loop · workers.py: worker processes
- storage.py: Optuna storage, sampler, pruner · identity.py: what may be resumed · recovery.py: abandoned trials
- outputs.py: the run directory (trials table, card, summary, ranking)
"""

from promptopt.study.config import SearchConfig, StudyConfig
from promptopt.study.context import SearchResult, check_search, decode_params
from promptopt.study.space import SearchSpace, load_space, parse_space
from promptopt.study.strategies import STRATEGIES, Strategy, get_strategy, register_strategy, stability
from promptopt.study.study import may_run, run_search, study_exists

__all__ = [
    "STRATEGIES",
    "SearchConfig",
    "SearchResult",
    "SearchSpace",
    "Strategy",
    "StudyConfig",
    "check_search",
    "decode_params",
    "get_strategy",
    "load_space",
    "may_run",
    "parse_space",
    "register_strategy",
    "run_search",
    "stability",
    "study_exists",
]
