#!/usr/bin/env python3
"""What a sampled archive kept, read from the Parquet objects themselves
(pyarrow + boto3): per business line, the rows kept for each reason, and
the rows they stand for (the sum of sample_weight), which for any line is
its exact request count. Used by deploy/local/demo.sh.

usage: archive_summary.py ENDPOINT BUCKET PREFIX      (the S3 secret on stdin)
Prints one tab-separated line per business line: line, rows kept, rows
represented, then reason=rows for each reason it kept rows for.
"""
import collections
import io
import sys

import boto3
import pyarrow.parquet as pq

endpoint, bucket, prefix = sys.argv[1:4]
secret = sys.stdin.read().strip()
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="inferlog", aws_secret_access_key=secret)
kept = collections.Counter()
represented = collections.Counter()
reasons = collections.defaultdict(collections.Counter)
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for obj in page.get("Contents", []):
        if not obj["Key"].endswith(".parquet"):
            continue
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        table = pq.read_table(io.BytesIO(body), columns=["business_line", "sample_weight", "sample_reason"])
        for line, weight, reason in zip(*(table.column(c).to_pylist() for c in table.column_names)):
            kept[line] += 1
            represented[line] += weight
            reasons[line][reason] += 1
for line in sorted(kept):
    detail = " ".join(f"{r}={n}" for r, n in sorted(reasons[line].items()))
    print(f"{line}\t{kept[line]}\t{represented[line]}\t{detail}")
