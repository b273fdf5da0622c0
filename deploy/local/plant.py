#!/usr/bin/env python3
"""Plants the patterns the demo's report views should find, in generated
events (JSON lines on stdin, the same lines on stdout, changed in place):

- a canary: version 2024-09-25 of llama-3.1-70b-instruct prefills inputs of
  8k tokens and more three times slower than 2024-07-23 (all 14 days), for
  `inferlog-report compare`;
- queueing: this week (the 7 UTC days through today, the demo's range),
  requests of 8k-32k input tokens wait 3 s
  more in the queue, for `inferlog-report diagnose`.

Lines that are not a JSON object with these fields (the invalid events the
demo sends on purpose) pass through unchanged. Prints what it planted on stderr.

usage: plant.py < events.jsonl > planted.jsonl
"""
import datetime
import json
import sys

CANARY_MODEL, CANARY_VERSION = "llama-3.1-70b-instruct", "2024-09-25"
LONG_INPUT = 8192
QUEUE_MS = 3000.0


def shift(event, ms):
    """Adds `ms` to the total latency and to a reported TTFT."""
    event["total_latency_ms"] = round(event["total_latency_ms"] + ms, 3)
    if isinstance(event.get("ttft_ms"), (int, float)):
        event["ttft_ms"] = round(event["ttft_ms"] + ms, 3)


def timestamp(value):
    """An event's `timestamp`: RFC 3339 text or epoch milliseconds (naive text is UTC)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.datetime.fromtimestamp(value / 1000, datetime.timezone.utc)
    when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def main():
    today = datetime.datetime.now(datetime.timezone.utc).date()
    week_ago = datetime.datetime.combine(today - datetime.timedelta(days=6), datetime.time(), tzinfo=datetime.timezone.utc)
    canary = queued = 0
    for line in sys.stdin:
        try:
            e = json.loads(line)
            tokens = int(e["input_tokens"])
            when = timestamp(e["timestamp"])
            float(e["total_latency_ms"])
        except (ValueError, KeyError, TypeError, AttributeError):
            sys.stdout.write(line)
            continue
        if e.get("model_name") == CANARY_MODEL and e.get("model_version") == CANARY_VERSION and tokens >= LONG_INPUT \
                and isinstance(e.get("prefill_time_ms"), (int, float)):
            extra = 2.0 * e["prefill_time_ms"]
            e["prefill_time_ms"] = round(e["prefill_time_ms"] + extra, 3)
            shift(e, extra)
            canary += 1
        if LONG_INPUT <= tokens < 32768 and when >= week_ago and isinstance(e.get("queue_wait_ms"), (int, float)):
            e["queue_wait_ms"] = round(e["queue_wait_ms"] + QUEUE_MS, 3)
            shift(e, QUEUE_MS)
            queued += 1
        sys.stdout.write(json.dumps(e, separators=(",", ":")) + "\n")
    print(f"  planted: {canary} long-input requests of {CANARY_MODEL} {CANARY_VERSION} prefill 3x slower; "
          f"{queued} requests of 8k-32k input tokens this week queue {QUEUE_MS / 1000:.0f} s longer", file=sys.stderr)


if __name__ == "__main__":
    main()
