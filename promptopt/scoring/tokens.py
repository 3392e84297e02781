"""A scoring call's texts tokenized on several threads.

A call tokenizes every item's whole prompt: on SST-2's default prompt 600 texts of ~150 tokens, 0.1-0.3 s on one
core, ~2-3% of a 200-item call on 2 CPU threads and much more beside a GPU's forward. Tokenizers' own thread pool
(TOKENIZERS_PARALLELISM) is off in the CLI: set on, a process forked after using it deadlocks when it tokenizes
(unset, tokenizers turns it off in the fork, with a warning). Plain Python threads over slices of the batch keep no
pool: a fast tokenizer's Rust encoder releases the GIL, and the threads end with the call. Where tokenizers' pool
is on, it already spreads each call over the cores, and the batch goes in one call. The ids are the one call's,
in order (tests/scoring/test_scoring.py).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch

_MIN_TEXTS_PER_THREAD = 64  # below this a thread's start costs more than its share saves
_MAX_THREADS = 8


def tokenizers_pool_on() -> bool:
    """Whether the tokenizers library parallelizes a batch itself: TOKENIZERS_PARALLELISM unset, or set to anything
    but the values it reads as off."""
    value = os.environ.get("TOKENIZERS_PARALLELISM")
    return value is None or value.strip().lower() not in ("", "0", "false", "f", "no", "n", "off")


def encode_texts(
    tokenizer, texts: list[str], *, add_special_tokens: bool, threads: int | None = None
) -> list[list[int]]:
    """Token ids of each text, as `tokenizer(texts, add_special_tokens=...)["input_ids"]` gives them.

    `threads` (default: torch's CPU threads, at most 8) share the batch when each gets 64 texts or more, the
    tokenizer is a fast (Rust) one and tokenizers' own pool is off. Otherwise the batch goes in one call: a slow
    tokenizer holds the GIL, and an encoder-decoder one (`_switch_to_input_mode`) sets its post-processor in
    every call, which threads must not do at once."""
    threads = min(threads or torch.get_num_threads(), _MAX_THREADS, len(texts) // _MIN_TEXTS_PER_THREAD)
    one_call = (
        threads <= 1
        or not getattr(tokenizer, "is_fast", False)
        or hasattr(tokenizer, "_switch_to_input_mode")
        or tokenizers_pool_on()
    )

    def encode(part: list[str]) -> list[list[int]]:
        return list(tokenizer(part, add_special_tokens=add_special_tokens)["input_ids"])

    if one_call:
        return encode(texts) if texts else []

    # The first text alone, on this thread: a call sets the backend's truncation, padding and special-token
    # splitting when they differ from its own, and two threads must not write that shared state at once.
    first, rest = encode(texts[:1]), texts[1:]
    size = -(-len(rest) // threads)
    parts = [rest[start : start + size] for start in range(0, len(rest), size)]
    with ThreadPoolExecutor(max_workers=len(parts) - 1, thread_name_prefix="promptopt-tokenize") as pool:
        others = [pool.submit(encode, part) for part in parts[1:]]
        mine = encode(parts[0])
        return first + mine + [ids for future in others for ids in future.result()]
