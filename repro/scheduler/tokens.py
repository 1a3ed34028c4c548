"""The token ids of a scheduled sequence: a pure function of the seed, the request and the position,
so a step's ids are the same however the sequence was cut or scheduled."""
from __future__ import annotations


def token(seed: int, rid: int, pos: int, vocab: int) -> int:
    """The token id at position `pos` of request `rid`: prompt tokens and sampled tokens alike."""
    return (seed * 1_000_003 + rid * 7919 + pos * 104_729 + 12_345) * 2_654_435_761 % (1 << 32) % vocab


def draft(seed: int, rid: int, pos: int, vocab: int) -> int:
    """The draft token proposed at position `pos`. Never the token sampled there (`token`) when
    vocab > 1: a rejected draft then leaves state computed from a token the request does not
    keep, which the next step must not continue from."""
    if vocab == 1:
        return 0
    h = (seed * 6_700_417 + rid * 65_537 + pos * 1_000_033 + 977) * 2_246_822_519 % (1 << 32)
    return (token(seed, rid, pos, vocab) + 1 + h % (vocab - 1)) % vocab
