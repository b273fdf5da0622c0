#!/usr/bin/env python3
"""Runs queries on current ClickHouse (chdb, in process) over a copy of a
table: the check that a statement inferlog ships runs on today's servers
as on the local 18.16.

    chdb_queries.py TABLE STRUCTURE ORDER_BY DATA.tsv QUERIES.json

TABLE is `database.table`; STRUCTURE its columns as `name Type, ...`;
ORDER_BY its sorting key (FINAL collapses rows on it);
DATA.tsv its rows (TabSeparated); QUERIES.json a list of SQL strings. The
table is created as a ReplacingMergeTree, filled, and each query's rows are
printed as one JSON list of lists of strings (TabSeparated cells).
Runs in UTC, as the local server does.
"""

import json
import os
import sys

os.environ["TZ"] = "UTC"

import chdb.session  # noqa: E402


def main() -> int:
    table, structure, order_by, data, queries = sys.argv[1:6]
    database = table.split(".")[0]
    session = chdb.session.Session()
    session.query(f"CREATE DATABASE IF NOT EXISTS {database}")
    session.query(f"CREATE TABLE {table} ({structure}) ENGINE = ReplacingMergeTree() PARTITION BY day ORDER BY ({order_by})")
    session.query(f"INSERT INTO {table} SELECT * FROM file('{data}', 'TabSeparated', '{structure}')")
    answers = []
    for sql in json.load(open(queries)):
        text = str(session.query(sql, "TabSeparated"))
        answers.append([line.split("\t") for line in text.splitlines() if line])
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
