"""A producer that is not prefixlog's: kafka-python (pure Python, its own record-batch and
compression code) writes records prefixlog encoded, compressed with a codec of the caller's
choice, so a replica has to decode batches another client built.

    produce.py BROKERS TOPIC CODEC RECORDS.json

RECORDS.json: [{"partition": P, "key": HEX, "value": HEX, "timestamp_ms": T}, ...], sent in
order (records of one partition keep their order: one in-flight request per connection).
Prints one JSON object: {"offsets": [[partition, offset], ...], "compression_rate": R}, R being
kafka-python's compressed/uncompressed batch size ratio (below 1: the batches were compressed).
"""
import json
import sys

from kafka import KafkaProducer


def main():
    brokers, topic, codec, path = sys.argv[1:5]
    with open(path) as f:
        records = json.load(f)
    producer = KafkaProducer(
        bootstrap_servers=brokers,
        compression_type=codec,
        acks="all",
        linger_ms=50,  # several records per batch: compression works on batches
        max_in_flight_requests_per_connection=1,
        retries=0,
    )
    futures = [
        producer.send(
            topic,
            key=bytes.fromhex(r["key"]),
            value=bytes.fromhex(r["value"]),
            partition=r["partition"],
            timestamp_ms=r["timestamp_ms"],
        )
        for r in records
    ]
    producer.flush(timeout=60)
    offsets = []
    for fut in futures:
        md = fut.get(timeout=60)
        offsets.append([md.partition, md.offset])
    rate = producer.metrics()["producer-metrics"]["compression-rate-avg"]
    producer.close(timeout=10)
    print(json.dumps({"offsets": offsets, "compression_rate": rate}))


if __name__ == "__main__":
    main()
