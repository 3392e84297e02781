"""The papers' analyses: measurement studies of δ_TCB and taboo decoding on a model, not part of choosing or
shipping a prompt.

- diagnose/: the δ_TCB paper's geometry, regimes, approximations and conflict classes, the taboo paper's ΔS
- proxy.py: is δ_TCB a proxy for robustness here? · item_auroc.py, risk_coverage.py: per-item signals of flips
- stress_sweep.py: models × tasks taboo sweeps, resumable · lmeval_check.py, lmeval_run.py: agreement with lm-eval

They read sessions and runs the workflows made (promptopt.workflows) and never the other way round.
"""
