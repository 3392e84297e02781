"""Say early whether searching can pay: before the trials, a random sample of the space is scored on a dev slice and
the spread of accuracy it produces is set against what the dev items can detect (FormatSpread's question, answered
with the noise stated).

Statistics (items × prompts, binary correctness, every prompt on the same items):
- Per-prompt accuracies a_m on the slice; their range is FormatSpread's spread.
- The space's own spread, net of item noise: the two-way ANOVA without replication (prompt × item), σ²_space =
  max(0, (MS_prompt − MS_residual) / n_items); its 95% interval from a bootstrap over the slice's items.
- Headroom: what the search's best trial is expected to reach above the incumbent on the same items. Each a_m is
  shrunk towards the sample's mean by σ²_space / (σ²_space + MS_residual / n_items) (the empirical-Bayes estimate of
  its true accuracy: a prompt that led on 16 items by luck is pulled back); every sampled prompt becomes a trial, so
  the search's best is at least the best of these, and no assumption about the rest of the space adds to it (a
  conservative reading: further trials may find better). The optimistic headroom is the same at the top of σ's
  interval.
- What dev can detect: the paired minimum detectable effect on all N dev items (80% power, α 0.05) at the
  discordance with the incumbent of the sampled prompts that could replace it (those at least as accurate on the
  slice; all of them when none is): a prompt far worse than the incumbent disagrees with it more, and is not the one
  the replacement test will face.

Verdict (one of `VERDICTS`): `search` when the headroom reaches the detectable difference; `keep the incumbent` when
even the optimistic headroom is ≤ 0; `add dev items` when the headroom is positive but below what dev detects (with
the dev size that would detect it); else `widen the space` (the sample does not beat the incumbent; the top of the
interval might).

The scan is the search's first phase, not an extra: its prompts are queued, one at a time, as the study's first
trials (random draws, as TPE's start-up trials are; study/trial.py `enqueue_next_scanned`), so their slices are cache
hits when those trials run. What it costs beyond the search is the part of a slice a raced trial would not have
scored (a trial dropped after the first minibatch): the slice is the longest racing slice whose worst case of that
stays within `SCAN_SHARE` of the search's scoring (trials × dev items), at least a minibatch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

VERDICTS = ("search", "add dev items", "widen the space", "keep the incumbent")
SCAN_SHARE = 0.1  # of the search's scoring budget (trials × dev items)
MIN_PROMPTS, MAX_PROMPTS = 4, 8


@dataclass(frozen=True)
class ScanResult:
    verdict: str
    n_prompts: int
    n_items: int
    accuracies: list  # per sampled prompt, on the slice
    incumbent_accuracy: float  # on the slice (NaN: no incumbent)
    spread: float  # max − min of `accuracies` (FormatSpread)
    space_sd: float  # σ_space, net of item noise
    space_sd_ci95: tuple[float, float]
    headroom: float
    headroom_high: float  # the headroom at the top of σ's interval: what the scan cannot rule out
    mde: float  # on all dev items
    dev_items: int
    dev_items_needed: int | None  # for `add dev items`: the dev size at which the headroom is detectable
    pairs: int  # (prompt, item) pairs the scan scored
    seconds: float = 0.0
    why: str = ""
    params: list = field(default_factory=list)  # the sampled prompts' parameters: the study's first trials

    def record(self) -> dict:
        def r(x):
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)

        return {
            "verdict": self.verdict,
            "why": self.why,
            "n_prompts": self.n_prompts,
            "n_items": self.n_items,
            "accuracies": [r(a) for a in self.accuracies],
            "incumbent_accuracy": r(self.incumbent_accuracy),
            "spread": r(self.spread),
            "space_sd": r(self.space_sd),
            "space_sd_ci95": [r(self.space_sd_ci95[0]), r(self.space_sd_ci95[1])],
            "headroom": r(self.headroom),
            "headroom_high": r(self.headroom_high),
            "mde": r(self.mde),
            "dev_items": self.dev_items,
            "dev_items_needed": self.dev_items_needed,
            "pairs": self.pairs,
            "seconds": round(self.seconds, 3),
        }


def scan_size(trials: int, dev_items: int, minibatch: int) -> tuple[int, int]:
    """(prompts, slice items): half the trials' prompts within [MIN_PROMPTS, MAX_PROMPTS] and never more than the
    trials (they become the first trials); the slice is the longest racing slice end (study/racing.py) whose extra
    cost, what the prompts' trials might not score themselves had racing dropped them after the first minibatch,
    stays within SCAN_SHARE of trials × dev items."""
    from promptopt.study.racing import slice_ends

    n_prompts = min(trials, max(MIN_PROMPTS, min(MAX_PROMPTS, trials // 2)))
    first = min(minibatch, dev_items)
    budget = SCAN_SHARE * trials * dev_items
    n_items = first
    for end in slice_ends(dev_items, minibatch):
        if n_prompts * (end - first) <= budget:
            n_items = max(n_items, end)
    return n_prompts, n_items


def _mean_squares(x) -> tuple[float, float]:
    """(MS_prompt, MS_residual) of the two-way ANOVA without replication on a prompts × items matrix."""
    m, n = x.shape
    grand = x.mean()
    rows, cols = x.mean(axis=1), x.mean(axis=0)
    ms_prompt = n * ((rows - grand) ** 2).sum() / (m - 1)
    residual = x - rows[:, None] - cols[None, :] + grand
    return float(ms_prompt), float((residual**2).sum() / ((m - 1) * (n - 1)))


def space_sd(matrix) -> float:
    """σ of the prompts' true accuracies net of item noise: two-way ANOVA without replication on the 0/1 matrix
    (prompts × items), sqrt(max(0, (MS_prompt − MS_residual) / n_items))."""
    import numpy as np

    x = np.asarray(matrix, dtype=float)
    m, n = x.shape
    if m < 2 or n < 2:
        return math.nan
    ms_prompt, ms_residual = _mean_squares(x)
    return float(math.sqrt(max(0.0, (ms_prompt - ms_residual) / n)))


def shrunk_accuracies(matrix, sd: float):
    """Each prompt's accuracy pulled towards the sample's mean by σ² / (σ² + MS_residual / n_items): the
    empirical-Bayes estimate of its true accuracy given the space's spread `sd` (0: every prompt at the mean)."""
    import numpy as np

    x = np.asarray(matrix, dtype=float)
    acc = x.mean(axis=1)
    noise = _mean_squares(x)[1] / x.shape[1]
    weight = sd**2 / (sd**2 + noise) if sd > 0 and sd**2 + noise > 0 else 0.0
    return acc.mean() + weight * (acc - acc.mean())


def analyse(matrix, incumbent, *, dev_items: int, seed: int = 0, n_boot: int = 1000) -> ScanResult:
    """The scan's statistics and verdict from the sampled prompts' correctness (prompts × slice items) and the
    incumbent's on the same items (None: no incumbent; the headroom is then read against the sample's mean)."""
    import numpy as np

    from promptopt.metrics.stats.bootstrap import bootstrap_resamples, percentile_interval
    from promptopt.metrics.stats.selection import dev_items_for, minimum_detectable_effect

    x = np.asarray(matrix, dtype=bool)
    m, n = x.shape
    acc = x.mean(axis=1)
    sd = space_sd(x)
    draws = bootstrap_resamples(n, n_boot=n_boot, seed=seed)
    boot = [space_sd(x[:, idx]) for idx in draws]
    low, high = percentile_interval(boot)
    base = np.asarray(incumbent, dtype=bool) if incumbent is not None else None
    reference = float(base.mean()) if base is not None else float(acc.mean())
    # every scanned prompt becomes a trial (scan_size: never more prompts than trials), so the search's best is at
    # least the best of them: no draw from their distribution can exceed its maximum
    headroom = float(shrunk_accuracies(x, sd).max()) - reference
    optimistic = max(headroom, float(shrunk_accuracies(x, max(high, sd)).max()) - reference)
    if base is not None:
        contenders = [row for row, a in zip(x, acc) if a >= reference] or list(x)
        discordance = float(np.mean([(row != base).mean() for row in contenders]))
    else:
        discordance = float(np.mean([(x[i] != x[j]).mean() for i in range(m) for j in range(i + 1, m)]))
    mde = minimum_detectable_effect(dev_items, discordance)
    needed = None
    spread = f"σ {sd:.3f} [{low:.3f}, {high:.3f}] net of item noise over {m} prompts on {n} items"
    if headroom > 0 and headroom >= mde:  # a sample identical to the incumbent: no gain, and an MDE of 0
        verdict = "search"
        why = (
            f"the space moves dev accuracy ({spread}); its best sampled prompt, shrunk for item noise, is expected "
            f"{headroom:+.3f} over the incumbent, at least the {mde:.3f} that {dev_items} dev items detect"
        )
    elif optimistic <= 0:
        verdict = "keep the incumbent"
        why = (
            f"the incumbent ({reference:.3f} on the slice) is at or above the best sampled prompt, shrunk for item "
            f"noise, even at the top of the space's interval (gain {headroom:+.3f}, at most {optimistic:+.3f}; "
            f"{spread})"
        )
        if discordance == 0:  # e.g. one label for everything: the slice tells nothing apart, it shows no ceiling
            why += (
                f"; but every sampled prompt answered the {n} items as the incumbent did, so the slice cannot tell "
                "them apart: a search may still find better on the rest of dev"
            )
    elif headroom > 0:
        verdict = "add dev items"
        needed = dev_items_for(headroom, discordance)
        why = (
            f"the best sampled prompt, shrunk for item noise, is expected {headroom:+.3f} over the incumbent "
            f"({spread}), below the {mde:.3f} that {dev_items} dev items detect; about {needed} dev items would "
            "detect it"
        )
    else:
        verdict = "widen the space"
        why = (
            f"the sample does not beat the incumbent (its best prompt, shrunk for item noise, {headroom:+.3f}; at "
            f"most {optimistic:+.3f} at the top of the interval; {spread}): widen the space (other instructions, "
            "templates, shots) or keep the incumbent"
        )
    return ScanResult(
        verdict=verdict,
        n_prompts=m,
        n_items=n,
        accuracies=[float(a) for a in acc],
        incumbent_accuracy=float(base.mean()) if base is not None else math.nan,
        spread=float(acc.max() - acc.min()),
        space_sd=sd,
        space_sd_ci95=(low, high),
        headroom=headroom,
        headroom_high=optimistic,
        mde=mde,
        dev_items=dev_items,
        dev_items_needed=needed,
        pairs=m * n,
        why=why,
    )


def run_scan(ctx, cached, incumbent_correct=None) -> ScanResult | None:
    """Sample the space (seeded, independent of the study's sampler), score each prompt on the first dev slice under
    the run's decision rule, and `analyse`; the result carries the prompts' parameters for the study to enqueue.
    `incumbent_correct`: the incumbent's correctness on every dev item. None when the space holds fewer than 2
    prompts other than the incumbent (no spread to measure)."""
    import time
    from dataclasses import replace

    import optuna

    from promptopt.scoring.calibration import RunningDecision
    from promptopt.study.trial import prompt_key

    start = time.perf_counter()
    config = ctx.config.study
    n_prompts, n_items = scan_size(config.trials, len(ctx.dev), config.minibatch)
    items = ctx.dev[:n_items]
    sampler = optuna.samplers.RandomSampler(seed=config.seed + 7919)  # its own stream: not the study's
    draft = optuna.create_study(sampler=sampler)
    rows, params, seen = [], [], {prompt_key(ctx.incumbent)} if ctx.incumbent is not None else set()
    for _ in range(n_prompts * 5):  # a small space may not hold n_prompts other prompts
        if len(rows) == n_prompts:
            break
        trial = draft.ask()
        prompt = ctx.space.suggest(trial, ctx.candidates, ctx.data.spec, config.decision)
        key = prompt_key(prompt)
        if key in seen:
            continue
        seen.add(key)
        running = RunningDecision(cached, prompt, hidden=ctx.strategy.reads_tcb)  # as trials score: cache hits
        running.add(items)
        rows.append(running.decided()["correct"].astype(bool).tolist())
        params.append(dict(trial.params))
    if len(rows) < 2:
        return None
    base = None if incumbent_correct is None else list(incumbent_correct)[:n_items]
    result = analyse(rows, base, dev_items=len(ctx.dev), seed=config.seed)
    return replace(result, seconds=time.perf_counter() - start, params=params)


__all__ = [
    "SCAN_SHARE",
    "VERDICTS",
    "ScanResult",
    "analyse",
    "run_scan",
    "scan_size",
    "shrunk_accuracies",
    "space_sd",
]
