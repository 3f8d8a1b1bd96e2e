"""Which prompts share a prefill forward: similar lengths only (padding is computed too)."""

from __future__ import annotations

from workers.inference.prefill import PADDING_SHARE, groups


def test_prompts_of_similar_lengths_share_a_forward_and_a_long_one_goes_alone() -> None:
    assert groups([12, 9, 5, 3]) == [[0, 1], [2, 3]]  # 12+9 of 24; 5+3 of 10
    assert groups([10, 10, 10, 10]) == [[0, 1, 2, 3]]
    assert groups([2000, 10, 12, 11]) == [[0], [2, 3, 1]]  # never 8,000 tokens for 2,033
    for lengths in ([12, 9, 5, 3], [2000, 10, 12, 11], [7, 1, 7, 2, 6, 30, 29]):
        found = groups(lengths)
        assert sorted(i for g in found for i in g) == list(range(len(lengths)))
        for group in found:
            width = max(lengths[i] for i in group)
            padding = len(group) * width - sum(lengths[i] for i in group)
            assert padding <= PADDING_SHARE * len(group) * width, (lengths, group)
