"""Independent reader of inferlog's Parquet archive (pyarrow + boto3), for
the integration tests: lists the objects under a prefix and prints, per
object, its row count, column types, key-value metadata, a sample of rows,
every request_id, the sum of input_tokens, and how many text cells look like
a plaintext user id (`u-` and six digits) or PII (an e-mail address, a phone
number), as one JSON document on stdout.

usage: read_archive.py ENDPOINT BUCKET PREFIX SAMPLE_SIZE
"""
import io
import json
import sys

import re

import boto3
import pyarrow as pa
import pyarrow.parquet as pq

PLAINTEXT = re.compile(r"u-[0-9]{6}|[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[a-z]{2,}|\+[0-9][0-9 ]{7,}")

endpoint, bucket, prefix, sample = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="inferlog", aws_secret_access_key="inferlog-local")
out = []
pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
for page in pages:
    for obj in page.get("Contents", []):
        if obj["Key"].endswith("/") and obj["Size"] == 0:
            continue  # a folder marker, not an object
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        f = pq.ParquetFile(io.BytesIO(body))
        table = f.read()
        meta = {k.decode(): v.decode() for k, v in (f.metadata.metadata or {}).items() if not k.startswith(b"ARROW")}
        rows = table.slice(0, sample).to_pylist()
        for r in rows:
            for k, v in list(r.items()):
                if hasattr(v, "timestamp"):
                    r[k] = int(v.timestamp() * 1000 + 0.5)
        out.append({
            "key": obj["Key"],
            "size": obj["Size"],
            "num_rows": f.metadata.num_rows,
            "row_groups": f.metadata.num_row_groups,
            "columns": {field.name: str(field.type) for field in table.schema},
            "physical": {f.schema.column(i).name: f"{f.schema.column(i).physical_type}/{f.schema.column(i).logical_type}" for i in range(len(f.schema))},
            "compression": f.metadata.row_group(0).column(0).compression if f.metadata.num_row_groups else None,
            "metadata": meta,
            "sample": rows,
            "request_ids": table.column("request_id").to_pylist(),
            "input_tokens_sum": sum(v for v in table.column("input_tokens").to_pylist() if v is not None),
            "plaintext_hits": sum(1 for field in table.schema if pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
                                  for v in table.column(field.name).to_pylist() if v is not None and PLAINTEXT.search(v)),
        })
json.dump(out, sys.stdout, default=str)
