#!/usr/bin/env python3
"""Plants the patterns the demo's report views should find, in generated
events (JSON lines on stdin, the same lines on stdout, changed in place):

- a canary: version 2024-09-25 of llama-3.1-70b-instruct prefills inputs of
  8k tokens and more three times slower than 2024-07-23 (all 14 days), for
  `inferlog-report compare`;
- queueing: this week (the 7 UTC days through today, the demo's range),
  requests of 8k-32k input tokens wait 3 s more in the queue, for
  `inferlog-report diagnose`;
- a knee: in the hours whose busiest minute (the whole fleet's) is in the
  top fifth, one request in 80 waits 8 s more in the queue (all 14 days),
  for `inferlog-report capacity --forecast --knee-ttft-ms 7000`;
- waste: one request in 3 of `search`'s summaries sends one of five
  prompt templates as text (ingest stores only its keyed hash), every
  other request a prompt of its own; one request in 4 sets `max_tokens`
  512 and a longer answer is cut there, for `inferlog-report waste`;
- a runaway caller: in the hour SPIKE_HOUR (`YYYY-MM-DDTHH`, UTC; default
  the last complete hour), one `search` request in 4 comes from
  `cron-nightly-digest` with a prompt 8 times as long; the same hour the
  day before, the same share comes from it with its usual prompts, for
  `inferlog-report spikes --hour SPIKE_HOUR`.

Lines that are not a JSON object with these fields (the invalid events the
demo sends on purpose) pass through unchanged. Prints what it planted on
stderr. Reads everything first: the knee needs each hour's busiest minute.

usage: SPIKE_HOUR=2026-12-05T13 plant.py < events.jsonl > planted.jsonl
"""
import datetime
import json
import os
import sys
import zlib
from collections import Counter

CANARY_MODEL, CANARY_VERSION = "llama-3.1-70b-instruct", "2024-09-25"
LONG_INPUT = 8192
QUEUE_MS = 3000.0
KNEE_QUEUE_MS = 8000.0
KNEE_EVERY = 80
TEMPLATES = [f"Summarize the release notes of product {k} for the weekly digest." for k in range(5)]
MAX_TOKENS = 512
CRON_CALLER = "cron-nightly-digest"


def spike_hour():
    """The planted hour's start (UTC): SPIKE_HOUR, else the last complete hour."""
    text = os.environ.get("SPIKE_HOUR")
    if text:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H").replace(tzinfo=datetime.timezone.utc)
    now = datetime.datetime.now(datetime.timezone.utc).replace(minute=0, second=0, microsecond=0)
    return now - datetime.timedelta(hours=1)


def timestamp(value):
    """An event's `timestamp`: RFC 3339 text or epoch milliseconds (naive text is UTC)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.datetime.fromtimestamp(value / 1000, datetime.timezone.utc)
    when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def parse(line):
    """(event, its time) of a valid line; None for the rest."""
    try:
        e = json.loads(line)
        int(e["input_tokens"])
        float(e["total_latency_ms"])
        return e, timestamp(e["timestamp"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def wait(event, ms):
    """`ms` more in the queue: queue wait, total latency and a reported TTFT."""
    if not isinstance(event.get("queue_wait_ms"), (int, float)):
        return False
    event["queue_wait_ms"] = round(event["queue_wait_ms"] + ms, 3)
    event["total_latency_ms"] = round(event["total_latency_ms"] + ms, 3)
    if isinstance(event.get("ttft_ms"), (int, float)):
        event["ttft_ms"] = round(event["ttft_ms"] + ms, 3)
    return True


def main():
    lines = sys.stdin.readlines()
    parsed = [parse(line) for line in lines]
    per_minute = Counter(int(p[1].timestamp()) // 60 for p in parsed if p)
    busiest = Counter()
    for minute, n in per_minute.items():
        busiest[minute // 60] = max(busiest[minute // 60], n)
    loads = sorted(busiest.values())
    knee_from = loads[len(loads) * 4 // 5] if loads else 0

    today = datetime.datetime.now(datetime.timezone.utc).date()
    week_start = datetime.datetime.combine(today - datetime.timedelta(days=6), datetime.time(), tzinfo=datetime.timezone.utc)
    canary = queued = knee = seen = templated = cut = cron = 0
    spike = spike_hour()
    for line, p in zip(lines, parsed):
        if p is None:
            sys.stdout.write(line)
            continue
        e, when = p
        tokens = int(e["input_tokens"])
        if e.get("model_name") == CANARY_MODEL and e.get("model_version") == CANARY_VERSION and tokens >= LONG_INPUT \
                and isinstance(e.get("prefill_time_ms"), (int, float)):
            extra = 2.0 * e["prefill_time_ms"]
            e["prefill_time_ms"] = round(e["prefill_time_ms"] + extra, 3)
            e["total_latency_ms"] = round(e["total_latency_ms"] + extra, 3)
            if isinstance(e.get("ttft_ms"), (int, float)):
                e["ttft_ms"] = round(e["ttft_ms"] + extra, 3)
            canary += 1
        if LONG_INPUT <= tokens < 32768 and when >= week_start and wait(e, QUEUE_MS):
            queued += 1
        if busiest[int(when.timestamp()) // 3600] >= knee_from:
            seen += 1
            if seen % KNEE_EVERY == 0 and wait(e, KNEE_QUEUE_MS):
                knee += 1
        coin = zlib.crc32(str(e.get("request_id")).encode())
        if e.get("business_line") == "search" and e.get("request_type") == "summarize" and coin % 3 == 0:
            e["prompt"] = TEMPLATES[coin // 3 % len(TEMPLATES)]
            templated += 1
        else:
            e["prompt"] = f"question {e.get('request_id')}"
        if coin // 7 % 4 == 0:
            e["max_tokens"] = MAX_TOKENS
            if isinstance(e.get("output_tokens"), int) and e["output_tokens"] > MAX_TOKENS:
                e["output_tokens"] = MAX_TOKENS
                cut += 1
        hour = when.replace(minute=0, second=0, microsecond=0)
        if e.get("business_line") == "search" and coin // 11 % 4 == 0 and hour in (spike, spike - datetime.timedelta(days=1)):
            e["user_id"] = CRON_CALLER
            if hour == spike:
                e["input_tokens"] = tokens * 8
                cron += 1
        sys.stdout.write(json.dumps(e, separators=(",", ":")) + "\n")
    print(f"  planted: {canary} long-input requests of {CANARY_MODEL} {CANARY_VERSION} prefill 3x slower; "
          f"{queued} requests of 8k-32k input tokens this week queue {QUEUE_MS / 1000:.0f} s longer; "
          f"{knee} requests in the hours whose busiest minute has {knee_from} requests or more queue {KNEE_QUEUE_MS / 1000:.0f} s longer; "
          f"{templated} search summaries send one of {len(TEMPLATES)} prompt templates; {cut} answers cut at max_tokens {MAX_TOKENS}; "
          f"{cron} requests of {CRON_CALLER} at {spike:%Y-%m-%d %H}:00 send 8x longer prompts",
          file=sys.stderr)


if __name__ == "__main__":
    main()
