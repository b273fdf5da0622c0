#!/usr/bin/env bash
# The local service stack, on loopback only: ClickHouse (Debian's
# clickhouse-server), the Kafka-compatible broker tansu, Postgres (the
# machine's own; started if it is not running) and an S3-compatible server
# (moto). Installs what is missing; idempotent; data and logs live under
# one directory ($INFERLOG_LOCAL_DIR, default .inferlog/local).
#
#   deploy/local/services.sh up       install what is missing, start what is not running
#   deploy/local/services.sh down     stop what this script started (not Postgres)
#   deploy/local/services.sh status   what runs where
#   deploy/local/services.sh restart-clickhouse | stop-clickhouse | start-clickhouse | restart-postgres | stop-s3 | start-s3
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=${INFERLOG_LOCAL_DIR:-$repo/.inferlog/local}
mkdir -p "$dir"

KAFKA_PORT=9092
CH_HTTP_PORT=8123
CH_TCP_PORT=9000
S3_PORT=${INFERLOG_S3_PORT:-9303}
PG_PORT=5432
TOPIC_PARTITIONS=${INFERLOG_TOPIC_PARTITIONS:-8}
TANSU_VERSION=0.6.0

log() { printf '[services] %s\n' "$*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { # port name seconds
  for _ in $(seq 1 $(( $3 * 5 ))); do port_open "$1" && return 0; sleep 0.2; done
  log "$2 did not open port $1 within $3 s; see $dir/*.log"; return 1
}

apt_updated=""
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  [ -n "$apt_updated" ] || { apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

install() {
  apt_install clickhouse-server clickhouse-client cmake libcurl4-openssl-dev libssl-dev libsasl2-dev libzstd-dev pkg-config curl
  python3 - <<'PY' 2>/dev/null || { log "installing Python packages (confluent-kafka, moto, pyarrow)"; python3 -m pip install -q confluent-kafka 'moto[server]' pyarrow boto3 >/dev/null; }
import confluent_kafka, moto, pyarrow, boto3, flask  # noqa: F401
PY
  if ! command -v tansu >/dev/null 2>&1; then
    log "building tansu $TANSU_VERSION from crates.io (about 15 minutes the first time)"
    cargo install tansu --version "$TANSU_VERSION" --locked --features dynostore >"$dir/tansu-install.log" 2>&1 \
      || { log "cargo install tansu failed; see $dir/tansu-install.log"; exit 2; }
  fi
}

start_postgres() {
  if pg_isready -q -h 127.0.0.1 -p $PG_PORT 2>/dev/null; then :; else
    log "starting Postgres"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
    for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p $PG_PORT && break; sleep 0.2; done
  fi
  psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'inferlog'" | grep -q 1 \
    || psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE inferlog"
}

# A fast restart (pg_ctl -m fast): open connections are cut, as in a crash of
# the server process from the clients' point of view.
restart_postgres() {
  log "restarting Postgres"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main restart -m fast
  for _ in $(seq 1 100); do pg_isready -q -h 127.0.0.1 -p $PG_PORT && return 0; sleep 0.2; done
  log "Postgres did not come back"; return 1
}

clickhouse_config() {
  local d=$dir/clickhouse
  mkdir -p "$d/data" "$d/tmp" "$d/user_files" "$d/format_schemas"
  # Debian's config with every path moved under $d, listening on loopback only.
  sed -e "s#/var/lib/clickhouse/tmp/#$d/tmp/#; s#/var/lib/clickhouse/user_files/#$d/user_files/#" \
      -e "s#/var/lib/clickhouse/format_schemas/#$d/format_schemas/#; s#<path>/var/lib/clickhouse/</path>#<path>$d/data/</path>#" \
      -e "s#/var/log/clickhouse-server/clickhouse-server.log#$dir/clickhouse.log#" \
      -e "s#/var/log/clickhouse-server/clickhouse-server.err.log#$dir/clickhouse.err.log#" \
      -e "s#<listen_host>::1</listen_host>##" \
      -e "s#<interserver_http_port>9009</interserver_http_port>##" \
      /etc/clickhouse-server/config.xml > "$d/config.xml"
  cp /etc/clickhouse-server/users.xml "$d/users.xml"
}

start_clickhouse() {
  if curl -fsS "http://127.0.0.1:$CH_HTTP_PORT/ping" >/dev/null 2>&1; then return 0; fi
  log "starting ClickHouse on 127.0.0.1:$CH_HTTP_PORT (HTTP) and :$CH_TCP_PORT (native)"
  clickhouse_config
  (cd "$dir/clickhouse" && clickhouse-server --config-file="$dir/clickhouse/config.xml" \
      --pid-file="$dir/clickhouse.pid" --daemon) >>"$dir/clickhouse.out" 2>&1
  for _ in $(seq 1 150); do curl -fsS "http://127.0.0.1:$CH_HTTP_PORT/ping" >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "ClickHouse did not start; see $dir/clickhouse.err.log"; return 1
}

stop_pidfile() { # pidfile name
  [ -f "$1" ] || return 0
  local pid; pid=$(cat "$1")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $2 (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

# Stops a server on PORT that another checkout (another pid file) may have
# started: by its pid file first, else by its command line.
stop_by_pattern() { # port pattern name
  port_open "$1" || return 0
  local pids; pids=$(pgrep -f "$2" || true)
  [ -n "$pids" ] || return 0
  log "stopping $3 (pids $(echo $pids))"
  kill $pids 2>/dev/null || true
  for _ in $(seq 1 100); do port_open "$1" || return 0; sleep 0.1; done
  kill -9 $pids 2>/dev/null || true
}

stop_clickhouse() {
  stop_pidfile "$dir/clickhouse.pid" clickhouse
  stop_by_pattern $CH_HTTP_PORT "clickhouse-server --config-file" clickhouse
  for _ in $(seq 1 50); do port_open $CH_HTTP_PORT || return 0; sleep 0.2; done
}

stop_s3() {
  stop_pidfile "$dir/s3.pid" moto
  stop_by_pattern "$S3_PORT" "moto.server -H 127.0.0.1 -p $S3_PORT" moto
}

start_tansu() {
  port_open $KAFKA_PORT && return 0
  log "starting tansu on 127.0.0.1:$KAFKA_PORT (memory storage)"
  nohup tansu broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
    --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
    --storage-engine memory://tansu/ >>"$dir/tansu.log" 2>&1 &
  echo $! > "$dir/tansu.pid"
  wait_port $KAFKA_PORT tansu 30
}

start_s3() {
  port_open "$S3_PORT" && return 0
  log "starting moto S3 server on 127.0.0.1:$S3_PORT"
  # moto spools every object over 5 MiB to a temporary file, and on
  # CompleteMultipartUpload copies all parts into a new one: 0.3 s of a
  # 1M-row archive (72 MiB) measured, none of it ours. Objects stay in memory
  # instead, as tansu's do (memory://); the stand-in holds only test data.
  MOTO_S3_DEFAULT_KEY_BUFFER_SIZE=$((1024 * 1024 * 1024)) \
    nohup python3 -m moto.server -H 127.0.0.1 -p "$S3_PORT" >>"$dir/s3.log" 2>&1 &
  echo $! > "$dir/s3.pid"
  wait_port "$S3_PORT" moto 30
  python3 - "$S3_PORT" <<'PY'
import sys, boto3
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1",
                  aws_access_key_id="inferlog", aws_secret_access_key="inferlog-local")
if "inferlog-cold" not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
    s3.create_bucket(Bucket="inferlog-cold")
PY
}

hash_key() {
  # A local user-id hash key; real deployments provide their own secret file.
  [ -s "$dir/hash.key" ] || { umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/hash.key"; }
  # The local S3 server's secret key (moto accepts any; the file shows where a real one goes).
  [ -s "$dir/s3.secret" ] || { umask 077; printf 'inferlog-local' > "$dir/s3.secret"; }
}

create_topics() {
  python3 "$repo/deploy/local/kafkatool.py" create-topics --partitions "$TOPIC_PARTITIONS" inference-events
  # The DLQ holds rejected raw events: no longer than the hot tier's 7 days (retention audits it).
  python3 "$repo/deploy/local/kafkatool.py" create-topics --partitions "$TOPIC_PARTITIONS" --config retention.ms=604800000 inference-events-dlq
}

status() {
  local ok=0
  show() { printf '%-11s %-34s %s\n' "$1" "$2" "$3"; }
  if curl -fsS "http://127.0.0.1:$CH_HTTP_PORT/ping" >/dev/null 2>&1; then
    show clickhouse "http://127.0.0.1:$CH_HTTP_PORT tcp:$CH_TCP_PORT" "up ($(curl -fsS "http://127.0.0.1:$CH_HTTP_PORT/?query=SELECT%20version()"))"
  else show clickhouse "http://127.0.0.1:$CH_HTTP_PORT" down; ok=1; fi
  if port_open $KAFKA_PORT; then show kafka "127.0.0.1:$KAFKA_PORT" "up (tansu, pid $(cat "$dir/tansu.pid" 2>/dev/null || echo '?'))"
  else show kafka "127.0.0.1:$KAFKA_PORT" down; ok=1; fi
  if pg_isready -q -h 127.0.0.1 -p $PG_PORT 2>/dev/null; then show postgres "127.0.0.1:$PG_PORT" up
  else show postgres "127.0.0.1:$PG_PORT" down; ok=1; fi
  if port_open "$S3_PORT"; then show s3 "http://127.0.0.1:$S3_PORT" "up (moto, bucket inferlog-cold)"
  else show s3 "http://127.0.0.1:$S3_PORT" down; ok=1; fi
  echo "data and logs: $dir"
  return $ok
}

case "${1:-}" in
  up)
    install
    start_postgres
    start_clickhouse
    start_tansu
    start_s3
    create_topics
    hash_key
    status
    ;;
  down)
    stop_pidfile "$dir/tansu.pid" tansu
    stop_pidfile "$dir/s3.pid" moto
    stop_clickhouse
    ;;
  status) status ;;
  stop-clickhouse) stop_clickhouse ;;
  start-clickhouse) start_clickhouse ;;
  restart-clickhouse) stop_clickhouse; start_clickhouse ;;
  restart-postgres) restart_postgres ;;
  # moto keeps objects in memory: a stopped S3 server comes back empty (with its bucket).
  stop-s3) stop_s3 ;;
  start-s3) start_s3 ;;
  *) echo "usage: $0 up|down|status|stop-clickhouse|start-clickhouse|restart-clickhouse|restart-postgres|stop-s3|start-s3" >&2; exit 2 ;;
esac
