"""The longest common prefix of tokenized inputs, in token space: what the prefix cache and packing share.

Found on the fully tokenized inputs, never on text: a tokenizer may merge across a text seam ("\\n\\n" alone vs
"\\n","\\n" in context), so a prefix split on text would shift answer log-probs."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    if not sequences:
        return 0
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for seq in sequences[1:]:
        i = 0
        while i < n and seq[i] == first[i]:
            i += 1
        n = i
    return n
