#!/usr/bin/env python3
"""The demo's --otel traffic: each generated event (JSON lines on stdin)
sent as the span vLLM's tracing would emit for that request, with the
OpenTelemetry Python SDK, to a Collector's OTLP/HTTP receiver.

usage: events_to_spans.py ENDPOINT TOPIC < events.jsonl

The span is vLLM's `llm_request` (request id, model, usage, latencies in
seconds, ending at the event's time); what vLLM does not trace (business
line, model version, tenant, user, GPU, batch, cache) rides on attributes
that the demo's `[otlp.attributes]` table maps, or on inferlog's own
`inferlog.*` names. The resource attribute `inferlog.topic` routes the spans
to TOPIC (the local Collector's Kafka exporter has topic_from_attribute).
Prints how many spans it sent.
"""

import datetime
import json
import sys

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

SECONDS = {"queue_wait_ms": "gen_ai.latency.time_in_queue", "prefill_time_ms": "gen_ai.latency.time_in_model_prefill",
           "decode_time_ms": "gen_ai.latency.time_in_model_decode", "ttft_ms": "gen_ai.latency.time_to_first_token"}
AS_IS = {"request_id": "gen_ai.request.id", "model_name": "gen_ai.response.model", "input_tokens": "gen_ai.usage.prompt_tokens",
         "output_tokens": "gen_ai.usage.completion_tokens", "cache_prefix_tokens": "gen_ai.usage.cache_read.input_tokens",
         "request_type": "gen_ai.operation.name", "session_id": "session.id", "user_id": "user.id",
         "business_line": "inferlog.business_line", "model_version": "inferlog.model_version", "tenant": "inferlog.tenant",
         "error_code": "inferlog.error_code", "error_stage": "inferlog.error_stage",
         # Mapped by the demo's [otlp.attributes]:
         "gpu_id": "inferlog.gpu_id", "batch_size": "inferlog.batch_size", "cache_hit": "inferlog.cache_hit",
         "gpu_mem_peak_mb": "inferlog.gpu_mem_peak_mb", "truncated": "inferlog.truncated", "tpot_ms": "inferlog.tpot_ms"}


def epoch_ns(timestamp):
    if isinstance(timestamp, int):
        return timestamp * 1_000_000
    t = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return int(t.timestamp() * 1000) * 1_000_000


def main():
    endpoint, topic = sys.argv[1], sys.argv[2]
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm", "inferlog.topic": topic}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), max_queue_size=1_000_000,
                                                   max_export_batch_size=512, schedule_delay_millis=200))
    tracer = provider.get_tracer("vllm.llm_engine")
    sent = 0
    for line in sys.stdin:
        event = json.loads(line)
        end = epoch_ns(event["timestamp"])
        total = event["total_latency_ms"]
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=end - int(total * 1e6))
        span.set_attribute("gen_ai.latency.e2e", total / 1000.0)
        for field, name in SECONDS.items():
            if event.get(field) is not None:
                span.set_attribute(name, event[field] / 1000.0)
        for field, name in AS_IS.items():
            if event.get(field) is not None:
                span.set_attribute(name, event[field])
        # Events that already use OpenTelemetry names keep them; a decode
        # time in µs becomes vLLM's seconds.
        for key, value in event.items():
            if key.startswith("gen_ai.") and value is not None:
                span.set_attribute(key, value)
        if event.get("decode_time_us") is not None:
            span.set_attribute("gen_ai.latency.time_in_model_decode", event["decode_time_us"] / 1e6)
        span.end(end_time=end)
        sent += 1
    if not provider.force_flush(timeout_millis=300_000):
        sys.exit("events_to_spans: the Collector did not take every span within 300 s")
    provider.shutdown()
    print(sent)


if __name__ == "__main__":
    main()
