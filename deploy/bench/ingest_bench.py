#!/usr/bin/env python3
"""Ingest throughput: inferlog-ingest against the glue a user would otherwise write.

Produces N generated events (all valid: the glue cannot survive malformed
JSON) to a fresh topic once, then, on that same data, times alternately:

  inferlog  inferlog-ingest (validate, normalize, hash, exactly-once, DLQ) into its hot table
  glue      a Python confluent-kafka consumer that POSTs batches of the raw JSON to
            ClickHouse's HTTP interface (INSERT ... FORMAT JSONEachRow, unknown
            fields skipped) and commits after each insert: no validation, no
            hashing, no DLQ, no exactly-once

and, in every run, the physical limit of the hot store:

  limit     ClickHouse inserting the very rows inferlog wrote (exported once
            as RowBinary from the first run's table, in the order ingest sent
            them: partition by partition) into an empty table of the same DDL, from a local file through clickhouse-client in
            100,000-row blocks: no Kafka, no parsing, no network beyond
            loopback. `inferlog_of_limit` is limit time / inferlog time.
            The server squashes those blocks into blocks of a million rows
            before it writes parts, so the limit writes the million rows
            as one insert would: a part or so per day, no merges.
  limit_batch the same, with the server's squashing capped at ingest's
            batch size (--batch-rows, batch_max_rows's default 200,000; min_insert_block_size_rows):
            the parts an insert of one of ingest's batches makes, and the
            merges they start. `inferlog_of_limit_batch` compares with that.

Each run uses its own consumer group and table; the time is from process
start until the table holds all N rows (same clock for both). Over the same
window it samples the CPU time of every process on the machine (from
/proc), so the JSON also says where the cores went: the process under
test, ClickHouse (`clickhouse-serv`), the broker (`java`). Prints per-run
figures and medians as JSON. Needs `deploy/local/services.sh up` and
release binaries (cargo build --release --bins), or INFERLOG_BIN_DIR
naming the directory of another build.

  deploy/bench/ingest_bench.py [--events 200000] [--runs 3] [--against glue|no-service-metrics|cluster|env|bin] [--members 1]

--against no-service-metrics times inferlog-ingest against itself with
[service_metrics] enabled = false instead of against the glue: what the
live service metrics cost (the `ratio` is with / without, in events/s).

--against cluster times inferlog-ingest into the single server against
inferlog-ingest into the local ClickHouse cluster (`services.sh up
--cluster`: 2 shards x 2 replicas, quorum 2; the topic's even partitions
on shard 1, odd on shard 2), with --members ingest processes in one group
on the cluster side; the `ratio` is single / cluster, in events/s (the
`inferlog` figures are the single server's).

--against env times inferlog-ingest against itself run with the extra
environment given by --other-env NAME=VALUE (an allocator setting, a
config override); --against bin against the inferlog-ingest in
--other-bin DIR (a baseline checkout's build). Both print the other
side's peak RSS too; the `ratio` is this build / the other, in events/s.
"""
import argparse
import json
import os
import statistics
import collections
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CH = os.environ.get("INFERLOG_TEST_CLICKHOUSE_URL", "http://127.0.0.1:8123")
BROKERS = os.environ.get("INFERLOG_TEST_KAFKA_BROKERS", "127.0.0.1:9092")
KAFKATOOL = os.path.join(REPO, "deploy/local/kafkatool.py")
# INFERLOG_BIN_DIR: another build to time side by side (a baseline checkout's target/release).
BIN = os.environ.get("INFERLOG_BIN_DIR", os.path.join(REPO, "target/release"))


class CpuSampler(threading.Thread):
    """CPU seconds (user + system) each command name used while it ran,
    from /proc/PID/stat sampled every 100 ms (a process that ends between
    two samples loses at most its last 100 ms)."""

    HZ = os.sysconf("SC_CLK_TCK")

    def __init__(self):
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.first = self.snapshot()
        self.last = dict(self.first)

    @classmethod
    def snapshot(cls):
        out = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            out[pid] = (comm, (int(fields[11]) + int(fields[12])) / cls.HZ)
        return out

    def run(self):
        while not self.done.wait(0.1):
            self.last.update(self.snapshot())

    def stop(self):
        """Per command name, the CPU seconds used since the start (the top five, rounded)."""
        self.done.set()
        self.join()
        self.last.update(self.snapshot())
        used = collections.Counter()
        for pid, (comm, cpu) in self.last.items():
            used[comm] += cpu - self.first.get(pid, (comm, 0.0))[1]
        return {comm: round(cpu, 2) for comm, cpu in used.most_common(5) if cpu >= 0.05}


def ch(sql, url=None):
    req = urllib.request.Request(url or CH, data=sql.encode(), method="POST")
    with urllib.request.urlopen(req) as r:
        return r.read().decode().strip()


CLUSTER_CH = "http://127.0.0.1:8131"


def count(table, url=None):
    try:
        return int(ch(f"SELECT count() FROM {table}", url) or 0)
    except Exception:
        return 0


def peak_rss_mb(pid):
    """The process's peak resident set so far (VmHWM), in MB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def wait_rows(proc, table, n, limit=900, url=None, others=()):
    """Waits until `table` holds `n` rows; returns the process's peak RSS (MB) meanwhile."""
    start = time.monotonic()
    peak = 0.0
    while time.monotonic() - start < limit:
        peak = max(peak, peak_rss_mb(proc.pid))
        if count(table, url) >= n:
            return peak
        if any(p.poll() not in (None, 0) for p in (proc, *others)) or (proc.poll() is not None and count(table, url) < n and not others):
            raise SystemExit(f"{table}: process exited early with {proc.returncode}")
        time.sleep(0.1)
    raise SystemExit(f"{table}: timed out")


GLUE = r'''
import json, sys, time, urllib.request
from confluent_kafka import Consumer
brokers, topic, group, table, ch = sys.argv[1:6]
c = Consumer({"bootstrap.servers": brokers, "group.id": group, "auto.offset.reset": "earliest",
              "enable.auto.commit": False})
c.subscribe([topic])
idle_since = time.monotonic()
url = ch + "/?input_format_skip_unknown_fields=1&query=" + urllib.parse.quote(f"INSERT INTO {table} FORMAT JSONEachRow")
while time.monotonic() - idle_since < 10:
    msgs = c.consume(num_messages=10000, timeout=1.0)
    msgs = [m for m in msgs if m.error() is None]
    if not msgs:
        continue
    idle_since = time.monotonic()
    body = b"\n".join(m.value() for m in msgs)
    urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST")).read()
    c.commit(asynchronous=False)
c.close()
'''


def run_glue(topic, n):
    table = f"inferlog_bench.glue_{uuid.uuid4().hex[:8]}"
    ch(f"""CREATE TABLE {table} (request_id String, model_name String, model_version String,
        business_line String, input_tokens UInt32, output_tokens UInt32, total_latency_ms Float64,
        error_code Int32, user_id String, queue_wait_ms Float64, prefill_time_ms Float64,
        decode_time_ms Float64) ENGINE = MergeTree ORDER BY (business_line, model_name, request_id)""")
    cpu = CpuSampler()
    cpu.start()
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", "import urllib.parse\n" + GLUE, BROKERS, topic,
                             f"glue-{uuid.uuid4().hex[:8]}", table, CH])
    wait_rows(proc, table, n)
    elapsed = time.monotonic() - start
    used = cpu.stop()
    proc.terminate()
    proc.wait()
    # Hundreds of leftover tables cost ClickHouse background CPU in later runs.
    ch(f"DROP TABLE IF EXISTS {table}")
    return elapsed, used


def export_rows(table, workdir):
    """The rows of `table` as RowBinary in a file, and its DDL with the table name a placeholder."""
    path = os.path.join(workdir, "rows.bin")
    # In the order ingest reads them from Kafka (each partition's offsets in
    # turn), as the reference was first measured. Ingest now sends each
    # insert sorted by the table's key (ingest/src/sort.rs), which spares
    # ClickHouse most of its sort; the limit keeps the order of the input.
    sql = f"SELECT * FROM {table} ORDER BY kafka_partition, kafka_offset, kafka_index FORMAT RowBinary"
    req = urllib.request.Request(CH, data=sql.encode(), method="POST")
    with urllib.request.urlopen(req) as r, open(path, "wb") as f:
        while chunk := r.read(1 << 20):
            f.write(chunk)
    ddl = ch(f"SHOW CREATE TABLE {table} FORMAT TSVRaw").replace(table, "{table}", 1)
    return path, ddl


def run_limit(rows_path, ddl, n, squash_rows=None):
    """ClickHouse's own RowBinary insert of the rows in `rows_path` into a fresh table of `ddl`.

    The server squashes the client's 100,000-row blocks into blocks of
    min_insert_block_size_rows (1,048,576 by default: the whole million, a
    part or so per day) before it writes parts; `squash_rows` caps that, so
    the parts are as small as an insert of that many rows makes them."""
    table = f"inferlog_bench.limit_{uuid.uuid4().hex[:8]}"
    ch(ddl.replace("{table}", table))
    cpu = CpuSampler()
    cpu.start()
    start = time.monotonic()
    with open(rows_path, "rb") as f:
        squash = [f"--min_insert_block_size_rows={squash_rows}"] if squash_rows else []
        subprocess.run(["clickhouse-client", "--max_insert_block_size=100000", *squash, "--query",
                        f"INSERT INTO {table} FORMAT RowBinary"], stdin=f, check=True)
    elapsed = time.monotonic() - start
    used = cpu.stop()
    rows = count(table)
    ch(f"DROP TABLE IF EXISTS {table}")
    if rows != n:
        raise SystemExit(f"limit: {rows} rows inserted, expected {n}")
    return elapsed, used


def run_inferlog(topic, n, workdir, extra_env=None, cluster=False, members=1, export=None, bin_dir=None):
    name = f"ingest_{uuid.uuid4().hex[:8]}"
    config = os.path.join(workdir, f"{name}.toml")
    url = CLUSTER_CH if cluster else CH
    shards = ""
    if cluster:
        shards = '''cluster = "inferlog"
[[clickhouse.shards]]
replicas = ["http://127.0.0.1:8131", "http://127.0.0.1:8132"]
partitions = [0, 2, 4, 6]
[[clickhouse.shards]]
replicas = ["http://127.0.0.1:8133", "http://127.0.0.1:8134"]
partitions = [1, 3, 5, 7]
'''
    with open(config, "w") as f:
        f.write(f'''[kafka]
brokers = "{BROKERS}"
topics = ["{topic}"]
group_id = "{name}"
dlq_topic = "{topic}-dlq"
[ingest]
metrics_addr = ""
[clickhouse]
url = "{url}"
database = "inferlog_bench"
table = "{name}"
rejects_table = "{name}_rejects"
{shards}''')
    env = dict(os.environ, INFERLOG_HASH_KEY_FILE=os.path.join(workdir, "hash.key"), **(extra_env or {}))
    cpu = CpuSampler()
    cpu.start()
    start = time.monotonic()
    procs = [subprocess.Popen([os.path.join(bin_dir or BIN, "inferlog-ingest"), "--config", config, "--exit-when-idle", "5s"],
                              env=env, stderr=open(os.path.join(workdir, f"{name}-{m}.log"), "w")) for m in range(members)]
    peak = wait_rows(procs[0], f"inferlog_bench.{name}", n, url=url, others=procs[1:])
    elapsed = time.monotonic() - start
    used = cpu.stop()
    # The peak can still grow until the process exits (its last commit).
    while procs[0].poll() is None:
        peak = max(peak, peak_rss_mb(procs[0].pid))
        time.sleep(0.1)
    for p in procs[1:]:
        p.wait()
    if export is not None:
        export.append(export_rows(f"inferlog_bench.{name}", workdir))
    on = " ON CLUSTER inferlog" if cluster else ""
    for table in (name, f"{name}_rejects", f"{name}_offsets"):
        ch(f"DROP TABLE IF EXISTS inferlog_bench.{table}{on}", url)
        if cluster:
            ch(f"DROP TABLE IF EXISTS inferlog_bench.{table}_local{on}", url)
    return elapsed, max(p.returncode for p in procs), used, peak


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--against", choices=["glue", "no-service-metrics", "cluster", "env", "bin"], default="glue")
    p.add_argument("--other-env", action="append", default=[], metavar="NAME=VALUE",
                   help="with --against env: the other side's extra environment (repeatable)")
    p.add_argument("--other-bin", metavar="DIR", help="with --against bin: the other side's build directory")
    p.add_argument("--batch-rows", type=int, default=200_000, help="ingest's batch_max_rows, for limit_batch")
    p.add_argument("--members", type=int, default=1, help="ingest processes on the cluster side of --against cluster")
    args = p.parse_args()

    def inferlog_side(**how):
        """inferlog-ingest run another way (`run_inferlog`'s keywords): its time, CPU and peak RSS."""
        def side(topic, workdir):
            elapsed, _, used, peak = run_inferlog(topic, args.events, workdir, **how)
            return elapsed, used, peak
        return side

    if args.against == "glue":
        other = ("glue", lambda topic, workdir: run_glue(topic, args.events) + (None,))
    elif args.against == "cluster":
        other = (f"cluster_{args.members}_members", inferlog_side(cluster=True, members=args.members))
    elif args.against == "env":
        other = ("other_env", inferlog_side(extra_env=dict(kv.split("=", 1) for kv in args.other_env)))
    elif args.against == "bin":
        other = ("other_bin", inferlog_side(bin_dir=args.other_bin))
    else:
        other = ("no_service_metrics", inferlog_side(extra_env={"INFERLOG_SERVICE_METRICS__ENABLED": "false"}))
    ch("CREATE DATABASE IF NOT EXISTS inferlog_bench")
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "hash.key"), "w") as f:
            f.write("benchmark-hash-key-0123456789abcdef")
        events = os.path.join(workdir, "events.jsonl")
        with open(events, "wb") as f:
            subprocess.run([os.path.join(BIN, "inferlog-schema"), "generate", "--count", str(args.events),
                            "--days", "3", "--seed", "99"], stdout=f, check=True)
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        subprocess.run([sys.executable, KAFKATOOL, "--brokers", BROKERS, "create-topics", "--partitions", "8",
                        topic, f"{topic}-dlq"], check=True)
        subprocess.run([sys.executable, KAFKATOOL, "--brokers", BROKERS, "produce", "--topic", topic, events],
                       check=True, stdout=subprocess.DEVNULL)
        side = other[0]
        results = {"events": args.events, "inferlog_s": [], f"{side}_s": [], "limit_s": [], "limit_batch_s": [],
                   "inferlog_peak_rss_mb": 0}
        cpu = {"inferlog": [], side: [], "limit": [], "limit_batch": []}
        exported = []
        for i in range(args.runs):
            elapsed, rc, used, peak = run_inferlog(topic, args.events, workdir, export=None if exported else exported)
            cpu["inferlog"].append(used)
            # VmHWM of the ingest process itself (not the producer's or the glue's).
            results["inferlog_peak_rss_mb"] = max(results["inferlog_peak_rss_mb"], round(peak, 1))
            results["inferlog_s"].append(round(elapsed, 2))
            other_elapsed, used, other_peak = other[1](topic, workdir)
            cpu[side].append(used)
            if other_peak is not None:
                results[f"{side}_peak_rss_mb"] = max(results.get(f"{side}_peak_rss_mb", 0), round(other_peak, 1))
            results[f"{side}_s"].append(round(other_elapsed, 2))
            limit_elapsed, limit_used = run_limit(*exported[0], args.events)
            cpu["limit"].append(limit_used)
            results["limit_s"].append(round(limit_elapsed, 2))
            # The same insert in parts no larger than ingest's batches.
            small_elapsed, small_used = run_limit(*exported[0], args.events, squash_rows=args.batch_rows)
            cpu["limit_batch"].append(small_used)
            results["limit_batch_s"].append(round(small_elapsed, 2))
            print(f"run {i + 1}: inferlog {elapsed:.2f}s (exit {rc}) cpu {cpu['inferlog'][-1]}, "
                  f"{side} {other_elapsed:.2f}s cpu {used}, limit {limit_elapsed:.2f}s cpu {limit_used}, "
                  f"limit_batch {small_elapsed:.2f}s cpu {small_used}", file=sys.stderr)
        inf = args.events / statistics.median(results["inferlog_s"])
        theirs = args.events / statistics.median(results[f"{side}_s"])
        limit = args.events / statistics.median(results["limit_s"])
        small = args.events / statistics.median(results["limit_batch_s"])
        results.update({"inferlog_events_per_s": round(inf), f"{side}_events_per_s": round(theirs), "ratio": round(inf / theirs, 3),
                        "limit_events_per_s": round(limit), "inferlog_of_limit": round(inf / limit, 3),
                        "limit_batch_events_per_s": round(small), "inferlog_of_limit_batch": round(inf / small, 3)})
        # Median CPU seconds per process over the timed windows, and how many
        # of the machine's cores were busy on average.
        for side, runs in cpu.items():
            names = sorted({name for used in runs for name in used})
            median = {name: round(statistics.median(used.get(name, 0.0) for used in runs), 2) for name in names}
            median = {name: cpu for name, cpu in median.items() if cpu >= 0.05}
            results[f"{side}_cpu_s"] = median
            results[f"{side}_cores_busy"] = round(sum(median.values()) / statistics.median(results[f"{side}_s"]), 2)
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
