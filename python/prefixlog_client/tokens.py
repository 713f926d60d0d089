"""Consistency tokens (read-your-writes), in the unit every prefixlog API uses: next offsets.

A token is a list of `(partition, offset)` pairs meaning "every record of `partition` below
`offset`" -- the unit of Kafka's committed offsets (exclusive). A match answer's `applied` is in
this unit, so it can be passed unchanged as the next request's `min_offsets`, also to another
replica. A publish acknowledged at record offset x (what a Kafka producer reports for the record
it wrote) is the token x + 1: `token_from_ack(partition, x)`.
"""
from typing import Dict, List, Tuple

# (partition, next offset): every record of the partition below the offset.
Token = Tuple[int, int]


def token_from_ack(partition: int, record_offset: int) -> Token:
    """The token that waits for a record a producer acknowledged at `record_offset` of
    `partition` (and everything before it): `(partition, record_offset + 1)`."""
    if partition < 0 or record_offset < 0:
        raise ValueError(f"not a Kafka acknowledgement: partition {partition}, offset {record_offset}")
    return (partition, record_offset + 1)


def merge_tokens(*tokens: List[Token]) -> List[Token]:
    """One token covering all of `tokens` (the highest offset per partition), e.g. a response's
    `applied` combined with the acknowledgements of placements published since."""
    merged: Dict[int, int] = {}
    for token in tokens:
        for partition, offset in token:
            merged[partition] = max(offset, merged.get(partition, offset))
    return sorted(merged.items())
