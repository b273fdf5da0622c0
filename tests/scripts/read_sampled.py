"""Independent reader of a sampled day's archive (pyarrow + boto3), for the
sampling tests: lists the objects under a prefix and prints their keys,
sizes and SHA-256, and every row's request_id, business line, model,
version, input tokens, UTC hour, total latency, sample_weight and
sample_reason, as one JSON document on stdout.

With `--summary`, the rows are left out and counted instead, per
sample_reason and sample_weight ("reason/weight": rows).

usage: read_sampled.py ENDPOINT BUCKET PREFIX SECRET [--summary]
"""
import hashlib
import io
import json
import sys

import boto3
import pyarrow.parquet as pq

endpoint, bucket, prefix, secret = sys.argv[1:5]
summary = sys.argv[5:] == ["--summary"]
counts = {}
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="inferlog", aws_secret_access_key=secret)
objects, rows = [], []
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for obj in page.get("Contents", []):
        if not obj["Key"].endswith(".parquet"):
            continue
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        objects.append({"key": obj["Key"], "size": len(body), "sha256": hashlib.sha256(body).hexdigest()})
        if summary:
            table = pq.read_table(io.BytesIO(body), columns=["sample_reason", "sample_weight"])
            for r, w in zip(table.column(0).to_pylist(), table.column(1).to_pylist()):
                counts[f"{r}/{w}"] = counts.get(f"{r}/{w}", 0) + 1
            continue
        table = pq.read_table(io.BytesIO(body))
        columns = [table.column(c).to_pylist() for c in
                   ["request_id", "business_line", "model_name", "model_version", "input_tokens",
                    "timestamp", "total_latency_ms", "sample_weight", "sample_reason"]]
        for r in zip(*columns):
            r = list(r)
            r[5] = r[5].hour
            rows.append(r)
json.dump({"objects": objects, "rows": counts if summary else rows}, sys.stdout)
