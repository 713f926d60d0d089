"""Consistency tokens are next offsets; a publish acknowledgement's record offset x is x + 1."""
import pytest

from prefixlog_client import merge_tokens, token_from_ack


def test_ack_becomes_the_next_offset():
    assert token_from_ack(3, 0) == (3, 1)
    assert token_from_ack(0, 41) == (0, 42)


@pytest.mark.parametrize("ack", [(-1, 0), (0, -1)])
def test_negative_acks_are_refused(ack):
    with pytest.raises(ValueError):
        token_from_ack(*ack)


def test_merge_keeps_the_highest_offset_per_partition():
    applied = [(0, 41), (1, 5), (2, 7)]
    acks = [token_from_ack(0, 50), token_from_ack(1, 2), token_from_ack(3, 0)]
    assert merge_tokens(applied, acks) == [(0, 51), (1, 5), (2, 7), (3, 1)]
    assert merge_tokens() == []
