#!/usr/bin/env python3
"""The independent Kafka client for tests, demos and benchmarks (confluent-kafka,
a current librdkafka): create topics, produce JSONL files, and read topics back.

Reading never trusts the broker's high watermark alone to say it is done: it reads until no message has arrived
for --idle seconds, then seeks back to any offset below the watermark that
was not delivered, and fails if the broker still does not deliver it.

  kafkatool.py create-topics [--partitions N] [--config K=V]... TOPIC...
  kafkatool.py produce --topic T FILE            one message per line, keyed by request_id
  kafkatool.py read --topic T [--idle S]         prints one JSON object per message (headers, key, size)
  kafkatool.py count --topic T [--idle S]        prints {"messages": N, "by_reason": {...}}
  kafkatool.py commit --topic T --group G --offset O
                                                 commits O for partition 0 of T in group G
  kafkatool.py alter-config --topic T K=V...     sets topic configs
  kafkatool.py describe-config --topic T         prints the configs set on the topic itself (JSON)
  kafkatool.py committed --topic T --group G    prints {partition: committed offset} (-1001: none)
  kafkatool.py watermarks --topic T              prints {partition: [log start, end]}
  kafkatool.py scram-user --user U --password-file F
                                                 creates or updates a SCRAM-SHA-512 user
  kafkatool.py deny-write --user U --prefix P [--operation OP]
                                                 lets U do anything on topics named P* but write
                                                 (or OP, e.g. DESCRIBE_CONFIGS)
  kafkatool.py delete-topics TOPIC...            deletes topics
  kafkatool.py delete-records --topic T          deletes every message T holds (as its retention would)
  kafkatool.py produce --topic T --key-bytes N FILE
                                                 keys every message with N bytes instead of its request_id
  kafkatool.py produce-records --topic T FILE   one JSON record a line: value or value_hex, key, headers
  kafkatool.py produce --topic T --timestamp-ms MS FILE
                                                 gives every message the create time MS (epoch ms)
"""
import argparse
import hashlib
import json
import re
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BROKERS = "127.0.0.1:9092"
REQUEST_ID = re.compile(rb'"request_id"\s*:\s*"([^"]{1,128})"')


def brokers(args):
    return args.brokers or BROKERS


def create_topics(args):
    admin = AdminClient({"bootstrap.servers": brokers(args)})
    # A broker that just opened its port may not answer metadata yet.
    for attempt in range(10):
        try:
            existing = set(admin.list_topics(timeout=10).topics)
            break
        except KafkaException:
            if attempt == 9:
                raise
            time.sleep(1)
    config = dict(kv.split("=", 1) for kv in args.config)
    wanted = [NewTopic(t, num_partitions=args.partitions, replication_factor=1, config=config)
              for t in args.topics if t not in existing]
    if not wanted:
        return
    for topic, future in admin.create_topics(wanted).items():
        try:
            future.result()
            print(f"created topic {topic} ({args.partitions} partitions)", file=sys.stderr)
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    # Metadata propagates asynchronously; wait until every topic is listed.
    for _ in range(50):
        if all(t in admin.list_topics(timeout=10).topics for t in args.topics):
            return
        time.sleep(0.2)


def produce(args):
    producer = Producer({
        "bootstrap.servers": brokers(args),
        "linger.ms": 20,
        "batch.size": 1 << 20,
        "compression.type": "none",
        "acks": "all",
        "queue.buffering.max.messages": 500000,
        # Tests produce messages larger than a DLQ takes (the topic decides).
        "message.max.bytes": 8 << 20,
    })
    failures = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(err)

    sent = 0
    with (sys.stdin.buffer if args.file == "-" else open(args.file, "rb")) as f:
        for line in f:
            line = line.rstrip(b"\n")
            if not line:
                continue
            if args.hex:
                # Binary messages (OTLP protobuf) arrive one hex line each.
                line = bytes.fromhex(line.decode())
            if args.key_bytes:
                key = b"k" * args.key_bytes
            elif args.hex:
                key = None
            else:
                m = REQUEST_ID.search(line)
                key = m.group(1) if m else None
            extra = {}
            if args.timestamp_ms:
                extra["timestamp"] = args.timestamp_ms
            if args.round_robin:
                extra["partition"] = sent % args.round_robin
            while True:
                try:
                    producer.produce(args.topic, line, key=key, on_delivery=on_delivery, **extra)
                    break
                except BufferError:
                    producer.poll(0.05)
            sent += 1
            if sent % 10000 == 0:
                producer.poll(0)
    remaining = producer.flush(120)
    if remaining or failures:
        print(f"produce failed: {remaining} undelivered, {len(failures)} errors: {failures[:3]}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"produced": sent}))


def produce_records(args):
    """Each line a JSON record: {"value": text | "value_hex": hex, "key": text,
    "headers": {name: text}}; produced in order, acknowledged by all replicas."""
    producer = Producer({"bootstrap.servers": brokers(args), "acks": "all", "linger.ms": 5})
    failures = []
    sent = 0
    with open(args.file, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            value = bytes.fromhex(record["value_hex"]) if "value_hex" in record else record.get("value", "").encode()
            key = record.get("key")
            headers = [(k, v.encode()) for k, v in (record.get("headers") or {}).items()]
            producer.produce(args.topic, value, key=key.encode() if key is not None else None, headers=headers,
                             on_delivery=lambda err, _m: err is not None and failures.append(err))
            sent += 1
    if producer.flush(60) or failures:
        print(f"produce failed: {failures[:3]}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"produced": sent}))


def read_all(args):
    """Every message of the topic, each offset once.

    Stops when nothing has arrived for --idle seconds. Then, because offsets
    of a topic written without transactions are contiguous, any offset below
    a partition's reported high watermark that was not delivered is a gap;
    the reader seeks back to each gap and reads again, and exits non-zero
    naming the offsets it still could not read.
    The watermark only finds gaps, it never decides that reading is done.
    """
    consumer = Consumer({
        "bootstrap.servers": brokers(args),
        "group.id": f"kafkatool-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([args.topic])
    seen = {}  # partition -> set of offsets delivered
    try:
        for attempt in range(4):
            last = time.monotonic()
            started = last
            while True:
                msg = consumer.poll(0.5)
                now = time.monotonic()
                if msg is None:
                    # Before the first message, allow for the group join as well.
                    if now - last > args.idle and (now - started > args.idle + 10 or last != started or attempt > 0):
                        break
                    continue
                if msg.error():
                    raise KafkaException(msg.error())
                last = now
                offsets = seen.setdefault(msg.partition(), set())
                if msg.offset() in offsets:
                    continue
                offsets.add(msg.offset())
                yield msg
            gaps = find_gaps(consumer, args.topic, seen)
            if not gaps:
                return
            print(f"kafkatool: {args.topic}: undelivered offsets {describe(gaps)}; seeking back (attempt {attempt + 1})", file=sys.stderr)
            for partition, (low, missing) in gaps.items():
                # Further back each attempt, down to the log start.
                consumer.seek(TopicPartition(args.topic, partition, max(low, missing[0] - 1024 * 4 ** attempt)))
        print(f"kafkatool: {args.topic}: offsets {describe(gaps)} are below the high watermark but the broker does not deliver them", file=sys.stderr)
        sys.exit(3)
    finally:
        consumer.close()


def find_gaps(consumer, topic, seen):
    gaps = {}
    for partition in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        offsets = seen.get(partition, set())
        missing = [o for o in range(max(low, 0), high) if o not in offsets]
        if missing:
            gaps[partition] = (max(low, 0), missing)
    return gaps


def describe(gaps):
    return ", ".join(f"p{p}: {len(m)} from {m[0]}" for p, (_, m) in sorted(gaps.items()))


def read(args):
    for msg in read_all(args):
        headers = {k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in (msg.headers() or [])}
        print(json.dumps({
            "partition": msg.partition(), "offset": msg.offset(),
            "key": msg.key().decode("utf-8", "replace") if msg.key() else None,
            "bytes": len(msg.value() or b""), "headers": headers,
            "sha256": hashlib.sha256(msg.value() or b"").hexdigest(),
            "value": (msg.value() or b"")[:args.value_bytes].decode("utf-8", "replace"),
        }))


def count(args):
    total, by_reason = 0, {}
    for msg in read_all(args):
        total += 1
        for k, v in msg.headers() or []:
            if k == "inferlog.reason":
                reason = v.decode()
                by_reason[reason] = by_reason.get(reason, 0) + 1
    print(json.dumps({"messages": total, "by_reason": by_reason}))


def commit(args):
    consumer = Consumer({"bootstrap.servers": brokers(args), "group.id": args.group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(args.topic, 0, args.offset)], asynchronous=False)
    finally:
        consumer.close()


def alter_config(args):
    """Sets topic configs (K=V), e.g. retention.ms, on an existing topic."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in (kv.split("=", 1) for kv in args.config)]
    admin = AdminClient({"bootstrap.servers": brokers(args)})
    for future in admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, args.topic, incremental_configs=entries)]).values():
        future.result()


def describe_config(args):
    """The configs set on the topic itself (not broker defaults), as JSON."""
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType
    admin = AdminClient({"bootstrap.servers": brokers(args)})
    for future in admin.describe_configs([ConfigResource(ResourceType.TOPIC, args.topic)]).values():
        entries = future.result()
        print(json.dumps({k: e.value for k, e in sorted(entries.items()) if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}))


def delete_records(args):
    """Deletes every message of the topic (DeleteRecords up to each partition's
    high watermark), as retention.ms does once they expire."""
    from confluent_kafka import OFFSET_END
    admin = AdminClient({"bootstrap.servers": brokers(args)})
    partitions = admin.list_topics(args.topic, timeout=10).topics[args.topic].partitions
    for future in admin.delete_records([TopicPartition(args.topic, p, OFFSET_END) for p in partitions]).values():
        future.result()


def committed(args):
    """The group's committed offset of every partition of the topic (-1001: none)."""
    consumer = Consumer({"bootstrap.servers": brokers(args), "group.id": args.group, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(args.topic, timeout=10).topics[args.topic].partitions
        tps = consumer.committed([TopicPartition(args.topic, p) for p in sorted(partitions)], timeout=10)
        print(json.dumps({tp.partition: tp.offset for tp in tps}))
    finally:
        consumer.close()


def watermarks(args):
    """The log start and end offset of every partition of the topic."""
    consumer = Consumer({"bootstrap.servers": brokers(args), "group.id": f"kafkatool-{uuid.uuid4()}"})
    try:
        partitions = consumer.list_topics(args.topic, timeout=10).topics[args.topic].partitions
        print(json.dumps({p: consumer.get_watermark_offsets(TopicPartition(args.topic, p), timeout=10) for p in sorted(partitions)}))
    finally:
        consumer.close()


def scram_user(args):
    """Creates or updates a SCRAM-SHA-512 user (over the PLAINTEXT listener);
    the password is read from a file, never from the command line."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    password = open(args.password_file, "rb").read().strip()
    admin = AdminClient({"bootstrap.servers": brokers(args)})
    upsert = UserScramCredentialUpsertion(args.user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password)
    for attempt in range(30):
        try:
            for future in admin.alter_user_scram_credentials([upsert]).values():
                future.result()
            print(f"SCRAM-SHA-512 user {args.user} set", file=sys.stderr)
            return
        except KafkaException:
            if attempt == 29:
                raise
            time.sleep(1)


def deny_write(args):
    """ACLs on topics named PREFIX*: ALLOW ALL and DENY OPERATION (WRITE
    unless told) for User:U (a deny wins). Idempotent."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
    admin = AdminClient({"bootstrap.servers": brokers(args)})
    principal = f"User:{args.user}"
    bindings = [AclBinding(ResourceType.TOPIC, args.prefix, ResourcePatternType.PREFIXED, principal, "*", operation, permission)
                for operation, permission in ((AclOperation.ALL, AclPermissionType.ALLOW), (AclOperation[args.operation], AclPermissionType.DENY))]
    for future in admin.create_acls(bindings).values():
        future.result()
    print(f"ACLs set: {principal} may not {args.operation} topics {args.prefix}*", file=sys.stderr)


def delete_topics(args):
    admin = AdminClient({"bootstrap.servers": brokers(args)})
    for future in admin.delete_topics(args.topics).values():
        future.result()
    # Deletion propagates asynchronously; wait until none is listed.
    for _ in range(100):
        if not any(t in admin.list_topics(timeout=10).topics for t in args.topics):
            return
        time.sleep(0.2)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create-topics")
    c.add_argument("--partitions", type=int, default=8)
    c.add_argument("--config", action="append", default=[], help="topic config K=V, e.g. retention.ms=604800000")
    c.add_argument("topics", nargs="+")
    c.set_defaults(func=create_topics)
    c = sub.add_parser("produce")
    c.add_argument("--topic", required=True)
    c.add_argument("--key-bytes", type=int, default=0)
    c.add_argument("--timestamp-ms", type=int, default=0)
    c.add_argument("--hex", action="store_true", help="each line is one message's bytes in hex (binary payloads)")
    c.add_argument("--round-robin", type=int, default=0, metavar="N",
                   help="message i to partition i mod N (keyless messages otherwise stick to one partition a burst)")
    c.add_argument("file")
    c.set_defaults(func=produce)
    for name, func in (("read", read), ("count", count)):
        c = sub.add_parser(name)
        c.add_argument("--topic", required=True)
        c.add_argument("--idle", type=float, default=5.0)
        c.add_argument("--value-bytes", type=int, default=0)
        c.set_defaults(func=func)
    c = sub.add_parser("commit")
    c.add_argument("--topic", required=True)
    c.add_argument("--group", required=True)
    c.add_argument("--offset", type=int, required=True)
    c.set_defaults(func=commit)
    for name, func in (("committed", committed), ("watermarks", watermarks)):
        c = sub.add_parser(name)
        c.add_argument("--topic", required=True)
        if name == "committed":
            c.add_argument("--group", required=True)
        c.set_defaults(func=func)
    c = sub.add_parser("alter-config")
    c.add_argument("--topic", required=True)
    c.add_argument("config", nargs="+", help="K=V")
    c.set_defaults(func=alter_config)
    c = sub.add_parser("describe-config")
    c.add_argument("--topic", required=True)
    c.set_defaults(func=describe_config)
    c = sub.add_parser("scram-user")
    c.add_argument("--user", required=True)
    c.add_argument("--password-file", required=True)
    c.set_defaults(func=scram_user)
    c = sub.add_parser("produce-records")
    c.add_argument("--topic", required=True)
    c.add_argument("file")
    c.set_defaults(func=produce_records)
    c = sub.add_parser("deny-write")
    c.add_argument("--user", required=True)
    c.add_argument("--prefix", required=True)
    c.add_argument("--operation", default="WRITE", help="the AclOperation denied (WRITE, DESCRIBE_CONFIGS, ...)")
    c.set_defaults(func=deny_write)
    c = sub.add_parser("delete-records")
    c.add_argument("--topic", required=True)
    c.set_defaults(func=delete_records)
    c = sub.add_parser("delete-topics")
    c.add_argument("topics", nargs="+")
    c.set_defaults(func=delete_topics)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
