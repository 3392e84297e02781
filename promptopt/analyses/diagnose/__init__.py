"""`promptopt diagnose`: the analyses of both papers on your model, one module per analysis.

positions (the diverse set of real next-token states), geometry (§4.2 / Table 2), regimes (Table 1),
approx (App. F approximations vs exact δ_TCB), taboo (ΔS vs rank, mid-word ablation, temperature seeds),
conflicts (§4.3 conflict classes, App. C.4.2 VCQ / AQ, Table 3); output holds the table and figure writers
they share.
"""
