"""What the example gateway and the fake workers share: the keyspace, a toy tokenizer, the
prompt of an OpenAI-style request, and publishing prefixlog records to Kafka.

The tokenizer is a toy: one token per whitespace-separated word, its id the 31-bit xxh32 of
the word's UTF-8 bytes. It is deterministic across processes, which is all the index needs: a
real gateway must tokenize exactly as its workers' model does (same tokenizer, same chat
template), or the block hashes will not match.
"""
import threading
from typing import Dict, List, Optional, Sequence

import xxhash
from confluent_kafka import Producer

from prefixlog_client import SCHEME_XXH3_CHAINED, Token, partition_of
from prefixlog_client._proto import records_pb2

MODEL = "toy-model"
BLOCK_SIZE = 16
KEYSPACE = (MODEL, BLOCK_SIZE, SCHEME_XXH3_CHAINED)  # what workers publish under and gateways query
TOPIC = "prefixlog.records"


def tokenize(text: str) -> List[int]:
    """Toy tokenizer: one id per whitespace-separated word (31-bit xxh32 of its UTF-8 bytes)."""
    return [xxhash.xxh32_intdigest(word.encode("utf-8")) & 0x7FFFFFFF for word in text.split()]


def prompt_text(path: str, body: dict) -> str:
    """The text an OpenAI-compatible request asks about: `prompt` for /v1/completions (a string
    or a list of strings), the messages under a toy chat template for /v1/chat/completions."""
    if path.endswith("/chat/completions"):
        return " ".join(f"<{m.get('role', 'user')}> {m.get('content', '')}" for m in body.get("messages", []))
    prompt = body.get("prompt", "")
    return " ".join(prompt) if isinstance(prompt, list) else str(prompt)


def trace_prompt(hash_ids: Sequence[int], tokens_per_id: int = BLOCK_SIZE) -> str:
    """A Mooncake trace request as prompt text: each hash id becomes `tokens_per_id` words, so
    with the toy tokenizer and block size 16 each hash id is exactly one block, and requests
    sharing leading hash ids share leading blocks."""
    return " ".join(f"t{i}.{j}" for i in hash_ids for j in range(tokens_per_id))


def keyspace_pb() -> records_pb2.Keyspace:
    return records_pb2.Keyspace(model=MODEL, block_size=BLOCK_SIZE, hash_scheme=SCHEME_XXH3_CHAINED)


def worker_added(worker: int, metadata: Dict[str, str]) -> records_pb2.Record:
    """Announces a worker (what ListWorkers reports), e.g. {"serving_url": url, "model": name}."""
    return records_pb2.Record(
        version=1,
        lifecycle=records_pb2.WorkerLifecycle(worker=worker, added=records_pb2.WorkerAdded(metadata=metadata)),
    )


def placement(worker: int, local: Sequence[int], answered_at: Sequence[Token], gateway: str) -> records_pb2.Record:
    """A gateway routed the chain `local` (from position 0) to `worker`; `answered_at` is the
    `applied` of the index answer it routed on (empty if it had none)."""
    return records_pb2.Record(
        version=1,
        placement=records_pb2.Placement(
            worker=worker,
            keyspace=keyspace_pb(),
            local=local,
            answered_at=[records_pb2.PartitionOffset(partition=p, offset=o) for p, o in answered_at],
            gateway=gateway,
        ),
    )


class LogPublisher:
    """Publishes prefixlog records as every publisher must (records.proto): key = the worker id
    as 8 bytes big-endian, partition = partition_of(worker, the topic's partition count).

    confluent-kafka (librdkafka) with the idempotent producer; a background thread serves its
    delivery reports. `acked` counts acknowledged records, `failed` the ones that were not.
    """

    def __init__(self, brokers: str, topic: str = TOPIC):
        self.topic = topic
        self._producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True, "linger.ms": 5})
        meta = self._producer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise RuntimeError(f"topic {topic} not found on {brokers} (start `prefixlog serve` first): {meta and meta.error}")
        self.partitions = len(meta.partitions)
        self.acked = 0
        self.failed = 0
        self.last_ack: Optional[Token] = None  # (partition, record offset) of the latest ack
        self._running = True
        self._poller = threading.Thread(target=self._poll, name="kafka-delivery", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while self._running:
            self._producer.poll(0.1)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failed += 1
        else:
            self.acked += 1
            self.last_ack = (msg.partition(), msg.offset())

    def publish(self, worker: int, record: records_pb2.Record) -> None:
        """Queues the record (sent within a few milliseconds; never blocks the request path)."""
        self._producer.produce(
            self.topic,
            key=worker.to_bytes(8, "big"),
            value=record.SerializeToString(),
            partition=partition_of(worker, self.partitions),
            on_delivery=self._delivered,
        )

    def close(self, timeout: float = 10.0) -> None:
        self._producer.flush(timeout)
        self._running = False
        self._poller.join()
