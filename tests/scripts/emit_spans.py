#!/usr/bin/env python3
"""Emits inference spans with the OpenTelemetry Python SDK, as vLLM and
GenAI-instrumented gateways do, to a Collector's OTLP/HTTP receiver, and
writes what inferlog should make of them, computed here from the spans'
own attributes and times (never by inferlog's code).

usage: emit_spans.py --endpoint http://127.0.0.1:PORT/v1/traces --seed N
                     --vllm N --genai N --unrelated N [--broken] [--yesterday SHARE] --out FILE

Spans, interleaved so the Collector's batches mix them:
- vLLM's `llm_request` (SERVER) spans with the attributes vLLM's tracing
  sets (vllm/v1/engine/output_processor.py `do_tracing`): request id,
  usage and latencies in seconds; half from a fleet that also names the
  model on the span (`gen_ai.response.model`, as vLLM's V0 engine did), half
  whose model comes from the resource (OTEL_RESOURCE_ATTRIBUTES), as a V1
  fleet configures it;
- GenAI-convention client spans (`chat MODEL`): `gen_ai.operation.name`,
  `gen_ai.request.model`, input/output tokens, no request id (inferlog uses
  the trace and span ids), some failed (status ERROR, `error.type`);
- unrelated spans (HTTP handlers, database calls): skipped, counted;
- with --broken, inference spans that map to invalid events: a token count
  sent as a string, no model anywhere, an e-mail address as session id.

FILE gets {"rows": [...], "skipped": N, "broken": [{trace_id, span_id, reason, field}]}:
each row the contract's fields as the hot table stores them.
"""

import argparse
import json
import random
import sys
import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

# The error dictionary of docs/contract.md, for `error.type`.
ERROR_CODES = {"gpu_oom": 1001, "context_length_exceeded": 1002, "timeout": 1003, "engine_error": 1004, "rate_limited": 1005}


def provider(endpoint, attributes):
    p = TracerProvider(resource=Resource.create(attributes))
    p.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), max_queue_size=1_000_000,
                                            max_export_batch_size=256, schedule_delay_millis=100))
    return p


def ids(span):
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--vllm", type=int, default=0)
    ap.add_argument("--genai", type=int, default=0)
    ap.add_argument("--unrelated", type=int, default=0)
    ap.add_argument("--broken", action="store_true")
    ap.add_argument("--yesterday", type=float, default=0.0,
                    help="the share of vLLM spans that end in the last second of yesterday (UTC)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    # vLLM fleets: the resource is what OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES give vLLM.
    vllm_v0 = provider(args.endpoint, {"service.name": "vllm", "service.version": "v0.6.6",
                                       "inferlog.business_line": "search"})
    vllm_v1 = provider(args.endpoint, {"service.name": "vllm", "service.version": "v0.11.0",
                                       "inferlog.business_line": "ads", "gen_ai.request.model": "qwen2.5-7b"})
    gateway = provider(args.endpoint, {"service.name": "llm-gateway", "inferlog.model_version": "2024-08-06",
                                       "inferlog.business_line": "support"})
    web = provider(args.endpoint, {"service.name": "web"})
    providers = [vllm_v0, vllm_v1, gateway, web]
    rows, broken = [], []
    skipped = 0

    def vllm_span(p, model, version, line, i, bad=None):
        tracer = p.get_tracer("vllm.llm_engine")
        queue = rng.uniform(0.001, 0.2)
        prefill = rng.uniform(0.01, 0.5)
        decode = rng.uniform(0.05, 4.0)
        ttft = queue + prefill + rng.uniform(0.0, 0.002)
        e2e = queue + prefill + decode + rng.uniform(0.001, 0.01)
        prompt = rng.randint(1, 8000)
        completion = rng.randint(1, 1024)
        request_id = f"cmpl-{args.seed}-{i}-{rng.getrandbits(32):08x}"
        end = time.time_ns()
        if rng.random() < args.yesterday:
            end = end // 86_400_000_000_000 * 86_400_000_000_000 - rng.randint(1, 999_999_999)
        start = end - int(e2e * 1e9)
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=start)
        if model is not None:
            span.set_attribute("gen_ai.response.model", model)
        span.set_attribute("gen_ai.latency.time_to_first_token", ttft)
        span.set_attribute("gen_ai.latency.e2e", e2e)
        span.set_attribute("gen_ai.latency.time_in_queue", queue)
        span.set_attribute("gen_ai.usage.prompt_tokens", str(prompt) if bad == "string_tokens" else prompt)
        span.set_attribute("gen_ai.usage.completion_tokens", completion)
        span.set_attribute("gen_ai.latency.time_in_model_prefill", prefill)
        span.set_attribute("gen_ai.latency.time_in_model_decode", decode)
        span.set_attribute("gen_ai.latency.time_in_model_inference", prefill + decode)
        span.set_attribute("gen_ai.request.id", request_id)
        span.set_attribute("gen_ai.request.max_tokens", 1024)
        span.set_attribute("gen_ai.request.temperature", 0.7)
        span.set_attribute("gen_ai.request.n", 1)
        span.end(end_time=end)
        if bad == "string_tokens":
            trace, span_id = ids(span)
            broken.append({"trace_id": trace, "span_id": span_id, "reason": "field.type", "field": "input_tokens"})
            return
        rows.append({
            "request_id": request_id, "model_name": model or "qwen2.5-7b", "model_version": version,
            "business_line": line, "input_tokens": prompt, "output_tokens": completion,
            "total_latency_ms": e2e * 1000.0, "queue_wait_ms": queue * 1000.0, "ttft_ms": ttft * 1000.0,
            "prefill_time_ms": prefill * 1000.0, "decode_time_ms": decode * 1000.0,
            "timestamp_ms": end // 1_000_000, "error_code": 0, "error_stage": None, "request_type": None,
            "session_id": None, "user": False,
        })

    def genai_span(i, bad=None):
        tracer = gateway.get_tracer("openai.client")
        model = rng.choice(["gpt-4o", "claude-sonnet", "gemini-pro"])
        operation = rng.choice(["chat", "text_completion"])
        tokens_in, tokens_out = rng.randint(1, 4000), rng.randint(0, 800)
        duration = rng.randint(50_000_000, 9_000_000_000)
        end = time.time_ns()
        start = end - duration
        span = tracer.start_span(f"{operation} {model}", kind=SpanKind.CLIENT, start_time=start)
        span.set_attribute("gen_ai.operation.name", operation)
        span.set_attribute("gen_ai.system", "openai")
        if bad != "no_model":
            span.set_attribute("gen_ai.request.model", model)
        span.set_attribute("gen_ai.usage.input_tokens", tokens_in)
        span.set_attribute("gen_ai.usage.output_tokens", tokens_out)
        session = f"sess-{i % 17}"
        span.set_attribute("session.id", "alice@example.com" if bad == "pii" else session)
        span.set_attribute("user.id", f"user-{i % 29}")
        fail = rng.random() < 0.2
        kind = None
        if fail:
            kind = rng.choice(["timeout", "rate_limited", "upstream_reset"])
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, "request failed"))
        span.end(end_time=end)
        trace, span_id = ids(span)
        if bad == "no_model":
            broken.append({"trace_id": trace, "span_id": span_id, "reason": "field.missing", "field": "model_name"})
            return
        if bad == "pii":
            broken.append({"trace_id": trace, "span_id": span_id, "reason": "pii.detected", "field": "session_id"})
            return
        rows.append({
            "request_id": f"{trace}-{span_id}", "model_name": model, "model_version": "2024-08-06",
            "business_line": "support", "input_tokens": tokens_in, "output_tokens": tokens_out,
            "total_latency_ms": duration / 1e6, "timestamp_ms": end // 1_000_000,
            # An error.type outside the dictionary gets [otlp] error_code (1004, engine_error).
            "error_code": ERROR_CODES.get(kind, 1004) if fail else 0, "error_stage": "gateway" if fail else None,
            "request_type": operation, "session_id": session, "user": True,
        })

    def unrelated_span(i):
        nonlocal skipped
        tracer = web.get_tracer("web")
        if i % 2:
            span = tracer.start_span("GET /healthz", kind=SpanKind.SERVER)
            span.set_attribute("http.request.method", "GET")
            span.set_attribute("http.response.status_code", 200)
        else:
            span = tracer.start_span("SELECT orders", kind=SpanKind.CLIENT)
            span.set_attribute("db.system.name", "postgresql")
            span.set_attribute("db.operation.name", "SELECT")
        span.end()
        skipped += 1

    plan = [("vllm", i) for i in range(args.vllm)] + [("genai", i) for i in range(args.genai)] + \
        [("unrelated", i) for i in range(args.unrelated)]
    if args.broken:
        plan += [("string_tokens", 0), ("string_tokens", 1), ("no_model", 0), ("pii", 0), ("pii", 1)]
    rng.shuffle(plan)
    for kind, i in plan:
        if kind == "vllm":
            if i % 2:
                vllm_span(vllm_v0, "llama-3.1-8b", "v0.6.6", "search", i)
            else:
                vllm_span(vllm_v1, None, "v0.11.0", "ads", i)
        elif kind == "genai":
            genai_span(i)
        elif kind == "unrelated":
            unrelated_span(i)
        elif kind == "string_tokens":
            vllm_span(vllm_v0, "llama-3.1-8b", "v0.6.6", "search", 1_000_000 + i, bad="string_tokens")
        else:
            genai_span(1_000_000 + i, bad=kind)
    for p in providers:
        if not p.force_flush(timeout_millis=120_000):
            sys.exit("emit_spans: the Collector did not take every span within 120 s")
        p.shutdown()
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "skipped": skipped, "broken": broken}, f)
    print(f"emitted {len(rows)} inference spans, {len(broken)} broken, {skipped} unrelated", file=sys.stderr)


if __name__ == "__main__":
    main()
