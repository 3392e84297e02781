"""The product's workflows: what a user runs, each on one session (one model, the task data, one caching scorer,
one run directory).

- session.py: the session every workflow starts from · search.py: a search with its variants, rounds, proposals
- compare/: strategies searched with one budget, their winners measured and paired on the same items
- export/: a run's winner (or ensemble) written as a card · verify.py: a card re-checked against a model
- evaluate.py: one prompt scored, stressed under perturbations or taboo decoding, traced token by token
- ensemble.py: greedy ensemble selection on dev · pair_runs.py: two compares paired item by item
- propose/: instructions proposed by a model, screened, added to a space · formats.py: a card as chat messages,
  a text template or an lm-eval task · fingerprint.py: what a card's score depends on (weights, tokenizer, data)

Above search and robustness (it hands both the same scorer); below the analyses, the report and the CLI.
"""
