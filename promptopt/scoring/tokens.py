"""A scoring call's texts tokenized on several threads.

A call tokenizes every item's whole prompt: on SST-2's default prompt 600 texts of ~150 tokens, 0.2-0.3 s on one
core, ~3% of a 200-item call on 2 CPU threads and much more beside a GPU's forward. Tokenizers' own thread pool
(TOKENIZERS_PARALLELISM) is off in the CLI because a process forked after using it deadlocks when it tokenizes;
plain Python threads over slices of the batch have no such pool: a fast tokenizer's Rust encoder releases the GIL,
and the threads end with the call. The ids are the one call's, in order (tests/test_scoring.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

_MIN_TEXTS_PER_THREAD = 64  # below this a thread's start costs more than its share saves
_MAX_THREADS = 8


def encode_texts(tokenizer, texts: list[str], *, add_special_tokens: bool, threads: int | None = None) -> list[list[int]]:
    """Token ids of each text, as `tokenizer(texts, add_special_tokens=...)["input_ids"]` gives them.

    `threads` (default: torch's CPU threads, at most 8) share the batch when each gets 64 texts or more and the
    tokenizer is a fast (Rust) one; a slow tokenizer holds the GIL, so it runs the batch in one call."""
    threads = min(threads or torch.get_num_threads(), _MAX_THREADS, len(texts) // _MIN_TEXTS_PER_THREAD)
    if threads <= 1 or not getattr(tokenizer, "is_fast", False):
        return list(tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]) if texts else []

    def encode(part: list[str]) -> list[list[int]]:
        return list(tokenizer(part, add_special_tokens=add_special_tokens)["input_ids"])

    # The first text alone, on this thread: a call resets the backend tokenizer's truncation and padding when they
    # differ from its own (none), and two threads must not write that shared state at once.
    first, rest = encode(texts[:1]), texts[1:]
    size = -(-len(rest) // threads)
    parts = [rest[start : start + size] for start in range(0, len(rest), size)]
    with ThreadPoolExecutor(max_workers=len(parts) - 1, thread_name_prefix="promptopt-tokenize") as pool:
        others = [pool.submit(encode, part) for part in parts[1:]]
        mine = encode(parts[0])
        return first + mine + [ids for future in others for ids in future.result()]
