"""Search: spaces (YAML -> Optuna parameters), strategies (objectives), the study runner, the result cache."""

from promptopt.search.objectives import STRATEGIES, Strategy, get_strategy, stability
from promptopt.search.space import SearchSpace, load_space, parse_space
from promptopt.search.study import SearchConfig, SearchResult, run_search

__all__ = ["STRATEGIES", "SearchConfig", "SearchResult", "SearchSpace", "Strategy", "get_strategy", "load_space", "parse_space", "run_search", "stability"]
