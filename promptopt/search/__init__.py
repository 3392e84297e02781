"""Search: spaces (YAML -> Optuna parameters), strategies (objectives), run settings (config), the study
runner (study). It receives a scorer and never imports robustness."""

from promptopt.search.config import SearchConfig, StudyConfig
from promptopt.search.objectives import STRATEGIES, Strategy, get_strategy, stability
from promptopt.search.space import SearchSpace, load_space, parse_space
from promptopt.search.study import SearchResult, run_search

__all__ = ["STRATEGIES", "SearchConfig", "SearchResult", "SearchSpace", "Strategy", "StudyConfig", "get_strategy",
           "load_space", "parse_space", "run_search", "stability"]
