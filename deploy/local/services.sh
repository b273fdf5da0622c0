#!/usr/bin/env bash
# The local service stack, on loopback only: ClickHouse (Debian's
# clickhouse-server), Apache Kafka 4 (KRaft, one combined broker+controller,
# from Maven Central), Postgres (Debian's; started if it is not running) and
# SeaweedFS's S3 gateway (built from the Go module proxy), Prometheus
# (Debian's, scraping ingest's /metrics, with deploy/prometheus's rules
# loaded); with `--tests`, Chromium for the report page's browser test.
# Installs what is missing; idempotent; data and logs live under one directory
# ($INFERLOG_LOCAL_DIR, default .inferlog/local), the Kafka jars and the
# SeaweedFS binary in a machine-wide cache ($INFERLOG_TOOLS_DIR, default
# /var/cache/inferlog-tools) shared by every checkout.
#
#   deploy/local/services.sh up       install what is missing, start what is not running
#   deploy/local/services.sh up --otel  also build (once) and start the OpenTelemetry Collector
#   deploy/local/services.sh up --cluster  also ZooKeeper and a local ClickHouse cluster (2 shards × 2
#                                       replicas: s1r1 s1r2 s2r1 s2r2, HTTP 8131-8134, native 9131-9134)
#   deploy/local/services.sh stop-node|kill-node|start-node NAME, stop-shard|start-shard 1|2,
#                                       stop-zookeeper|start-zookeeper
#   deploy/local/services.sh up --tests also install what only the tests use (Chromium and its
#                                       font, Python's websocket-client and pillow); flags combine
#   deploy/local/services.sh otelcol-bin  build the Collector if missing; print its path
#   deploy/local/services.sh down     stop what this script started (not Postgres)
#   deploy/local/services.sh status   what runs where
#   deploy/local/services.sh restart-clickhouse | stop-clickhouse | start-clickhouse | restart-postgres
#   deploy/local/services.sh stop-s3 | start-s3 | stop-kafka | kill-kafka | start-kafka
#
# Prometheus listens on 127.0.0.1:9490 and scrapes every second the targets
# listed in $dir/prometheus/targets/*.json (file service discovery: the
# local ingest's 127.0.0.1:9464 is there; a test adds its own file).
#
# The OpenTelemetry Collector (`up --otel`) is built once with the
# Collector's own builder (ocb) from deploy/local/otelcol/builder-config.yaml
# and cached beside SeaweedFS; it receives OTLP on 127.0.0.1:4318 (HTTP) and
# :4317 (gRPC) and writes traces to the topic otlp-spans (otlp_proto), which
# the demo's --otel run reads.
#
# Kafka listens on 127.0.0.1:9092 (PLAINTEXT) and 127.0.0.1:9094 (SASL_SSL,
# SCRAM-SHA-512, certificate signed by a CA generated here once:
# $dir/kafka-tls/ca.crt; user "inferlog", password in $dir/kafka.password).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=${INFERLOG_LOCAL_DIR:-$repo/.inferlog/local}
tools=${INFERLOG_TOOLS_DIR:-/var/cache/inferlog-tools}
mkdir -p "$dir" "$tools"

KAFKA_PORT=9092
KAFKA_CONTROLLER_PORT=9093
KAFKA_SASL_PORT=9094
KAFKA_VERSION=4.1.1
CH_HTTP_PORT=8123
CH_TCP_PORT=9000
S3_PORT=${INFERLOG_S3_PORT:-9303}
# SeaweedFS's own ports (master, volume, filer; gRPC at +10000 each).
SW_MASTER_PORT=9333
SW_VOLUME_PORT=9340
SW_FILER_PORT=9888
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
PG_PORT=5432
PROM_PORT=${INFERLOG_PROMETHEUS_PORT:-9490}
OTEL_HTTP_PORT=4318
OTEL_GRPC_PORT=4317
# The Collector's release: the builder and every go.opentelemetry.io/collector
# module of builder-config.yaml are at it, the contrib Kafka exporter at its
# contrib tag.
OTELCOL_VERSION=0.165.0
TOPIC_PARTITIONS=${INFERLOG_TOPIC_PARTITIONS:-8}

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

kafka_lib=$tools/kafka-$KAFKA_VERSION/lib
weed=$tools/seaweedfs-$SEAWEEDFS_VERSION/weed

# Builds the SeaweedFS binary once (about 4 minutes of a fresh machine's 2
# cores, most of it compiling). `up` runs it in the background while Debian's
# packages, the Python packages and Kafka's jars are fetched and the other
# servers start, and waits for it only before starting S3.
build_seaweedfs() {
  [ -x "$weed" ] && return 0
  # `go install …@version` refuses a module whose go.mod has replace
  # directives (SeaweedFS's has one), so it is built inside the downloaded module.
  log "building SeaweedFS ($SEAWEEDFS_VERSION) from the Go module proxy in the background (about 4 minutes the first time)"
  local src
  src=$(go mod download -json "github.com/seaweedfs/seaweedfs@$SEAWEEDFS_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') \
    || { log "downloading SeaweedFS failed"; return 2; }
  mkdir -p "$(dirname "$weed")"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$weed.tmp" ./weed) >"$dir/seaweedfs-install.log" 2>&1 \
    || { log "building SeaweedFS failed; see $dir/seaweedfs-install.log"; return 2; }
  mv "$weed.tmp" "$weed"
  log "SeaweedFS built"
}

otelcol=$tools/otelcol-$OTELCOL_VERSION/otelcol-inferlog

# Builds the Collector once, as its users build a distribution: the
# builder from the Go module proxy, then the builder on
# deploy/local/otelcol/builder-config.yaml (about 5 minutes of 2 cores).
build_otelcol() {
  [ -x "$otelcol" ] && return 0
  command -v go >/dev/null 2>&1 || apt_install golang-go
  local out; out=$(dirname "$otelcol")
  mkdir -p "$out/src"
  log "building the OpenTelemetry Collector $OTELCOL_VERSION with its builder (about 5 minutes the first time)"
  GOBIN="$out" go install "go.opentelemetry.io/collector/cmd/builder@v$OTELCOL_VERSION" >"$dir/otelcol-install.log" 2>&1 \
    || { log "installing the Collector's builder failed; see $dir/otelcol-install.log"; return 2; }
  sed "s#OUTPUT_PATH#$out/src#" "$repo/deploy/local/otelcol/builder-config.yaml" > "$out/builder-config.yaml"
  "$out/builder" --config "$out/builder-config.yaml" >>"$dir/otelcol-install.log" 2>&1 \
    || { log "building the Collector failed; see $dir/otelcol-install.log"; return 2; }
  mv "$out/src/otelcol-inferlog" "$otelcol"
  log "OpenTelemetry Collector built: $otelcol"
}

# The shared Collector of `up --otel`: OTLP in on loopback, the batch
# processor (at most 512 spans to a Kafka message, well under the broker's
# 1 MB), the Kafka exporter to otlp-spans in otlp_proto, or to the topic a
# resource's inferlog.topic attribute names (the demo's --otel run).
start_otelcol() {
  port_open $OTEL_HTTP_PORT && return 0
  mkdir -p "$dir/otelcol"
  cat > "$dir/otelcol/config.yaml" <<YAML
receivers:
  otlp:
    protocols:
      http: {endpoint: "127.0.0.1:$OTEL_HTTP_PORT"}
      grpc: {endpoint: "127.0.0.1:$OTEL_GRPC_PORT"}
processors:
  batch: {timeout: 200ms, send_batch_size: 512, send_batch_max_size: 512}
exporters:
  kafka:
    brokers: ["127.0.0.1:$KAFKA_PORT"]
    traces: {topic: otlp-spans, encoding: otlp_proto}
    topic_from_attribute: inferlog.topic
service:
  telemetry:
    metrics: {level: none}
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [kafka]
YAML
  log "starting the OpenTelemetry Collector (OTLP on 127.0.0.1:$OTEL_HTTP_PORT http, :$OTEL_GRPC_PORT grpc; to Kafka topic otlp-spans)"
  nohup "$otelcol" --config "$dir/otelcol/config.yaml" >>"$dir/otelcol.log" 2>&1 &
  echo $! > "$dir/otelcol.pid"
  wait_port $OTEL_HTTP_PORT otelcol 60
}

stop_otelcol() {
  stop_pidfile "$dir/otelcol.pid" otelcol
  stop_by_pattern $OTEL_HTTP_PORT "otelcol-inferlog --config $dir/otelcol" otelcol
}

weed_build=""
otel_build=""
# Waits for the background build started by `install`, if any.
wait_seaweedfs() {
  [ -n "$weed_build" ] || return 0
  wait "$weed_build" || exit 2
  weed_build=""
}

# What building inferlog needs besides Rust (librdkafka's C build, OpenSSL
# for its SSL and for S3): `build-deps`, before a build that runs while
# `up` installs the rest.
build_deps() {
  apt_install cmake libcurl4-openssl-dev libssl-dev libsasl2-dev libzstd-dev pkg-config curl
}

install() {
  command -v go >/dev/null 2>&1 || apt_install golang-go
  if [ ! -x "$weed" ]; then build_seaweedfs & weed_build=$!; fi
  if [ -n "$with_otel" ] && [ ! -x "$otelcol" ]; then build_otelcol & otel_build=$!; fi
  build_deps
  apt_install clickhouse-server clickhouse-client postgresql openssl default-jre-headless maven prometheus
  python3 - <<'PY' 2>/dev/null || { log "installing Python packages (confluent-kafka, pyarrow, boto3)"; python3 -m pip install -q confluent-kafka pyarrow boto3 >/dev/null; }
import confluent_kafka, pyarrow, boto3  # noqa: F401
PY
  # Only the tests use these (the demo does not): the report page's browser
  # test drives headless Chromium over the DevTools protocol and compares
  # screenshots. Chromium is the largest download of a first `up`.
  if [ -n "$with_tests" ]; then
    apt_install chromium fonts-dejavu-core
    python3 - <<'PY' 2>/dev/null || { log "installing Python packages (websocket-client, pillow)"; python3 -m pip install -q websocket-client pillow >/dev/null; }
import websocket, PIL  # noqa: F401
PY
    # Current ClickHouse in process: the boards' SQL runs on it beside 18.16.
    python3 - <<'PY' 2>/dev/null || { log "installing Python packages (chdb)"; python3 -m pip install -q 'chdb==4.4.0' >/dev/null; }
import chdb  # noqa: F401
PY
  fi
  # The OpenTelemetry Python SDK: the OTLP test emits spans with it, as vLLM does.
  if [ -n "$with_otel" ]; then
    python3 - <<'PY' 2>/dev/null || { log "installing Python packages (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"; python3 -m pip install -q opentelemetry-sdk opentelemetry-exporter-otlp-proto-http >/dev/null; }
import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
PY
  fi
  if [ ! -s "$kafka_lib/.complete" ]; then
    log "fetching Apache Kafka $KAFKA_VERSION and its runtime dependencies from Maven Central"
    rm -rf "$kafka_lib"; mkdir -p "$kafka_lib"
    mvn -q -B -f "$repo/deploy/local/kafka/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$kafka_lib" >"$dir/kafka-install.log" 2>&1 \
      || { log "fetching Kafka failed; see $dir/kafka-install.log"; exit 2; }
    ls "$kafka_lib" > "$kafka_lib/.complete"
  fi
}

# Debian's cluster asks loopback clients for a password; the local stack
# trusts them (connections from this machine only), as a CI database would.
postgres_trust_loopback() {
  local hba
  hba=/etc/postgresql/$(ls /etc/postgresql | head -n 1)/main/pg_hba.conf
  grep -q '^host all all 127.0.0.1/32 trust' "$hba" && return 1
  log "Postgres: trusting loopback connections ($hba)"
  sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
}

# After a crash (a machine stopped with the cluster up), Postgres syncs its
# data directory before recovery: by default one fsync per file, minutes on
# a data directory of many small relations, longer than pg_ctl's 60 s.
# `syncfs` syncs the file system once (Linux, Postgres 14 and later).
postgres_fast_recovery() {
  local conf
  conf=/etc/postgresql/$(ls /etc/postgresql | head -n 1)/main/conf.d/inferlog-local.conf
  [ -e "$conf" ] && return 0
  log "Postgres: crash recovery syncs by syncfs ($conf)"
  echo "recovery_init_sync_method = syncfs" > "$conf"
}

start_postgres() {
  postgres_fast_recovery
  if postgres_trust_loopback && pg_isready -q -h 127.0.0.1 -p $PG_PORT 2>/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main reload
  fi
  if pg_isready -q -h 127.0.0.1 -p $PG_PORT 2>/dev/null; then :; else
    log "starting Postgres"
    # pg_ctl waits until the server accepts connections, here up to 10
    # minutes: a crash recovery replays WAL before it does.
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start -- -t 600
  fi
  local db
  # inferlog_test: the tests' own database (deploy/local/test.sh recreates
  # it empty before each run, so their schemas never pile up).
  for db in inferlog ${with_tests:+inferlog_test}; do
    psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
      || psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $db"
  done
}

# A fast restart (pg_ctl -m fast): open connections are cut, as in a crash of
# the server process from the clients' point of view.
restart_postgres() {
  log "restarting Postgres"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main restart -m fast
  for _ in $(seq 1 100); do pg_isready -q -h 127.0.0.1 -p $PG_PORT && return 0; sleep 0.2; done
  log "Postgres did not come back"; return 1
}

# Debian's config with every path moved under DIR, the logs to LOGS.log
# and LOGS.err.log, listening on loopback only; then the sed expressions
# given (`-e …`), into DIR/config.xml, beside Debian's users.xml.
clickhouse_base_config() { # dir logs [-e expression]...
  local d=$1 logs=$2
  shift 2
  mkdir -p "$d/data" "$d/tmp" "$d/user_files" "$d/format_schemas"
  sed -e "s#/var/lib/clickhouse/tmp/#$d/tmp/#; s#/var/lib/clickhouse/user_files/#$d/user_files/#" \
      -e "s#/var/lib/clickhouse/format_schemas/#$d/format_schemas/#; s#<path>/var/lib/clickhouse/</path>#<path>$d/data/</path>#" \
      -e "s#/var/log/clickhouse-server/clickhouse-server.log#$logs.log#" \
      -e "s#/var/log/clickhouse-server/clickhouse-server.err.log#$logs.err.log#" \
      -e "s#<listen_host>::1</listen_host>##" \
      "$@" /etc/clickhouse-server/config.xml > "$d/config.xml"
  cp /etc/clickhouse-server/users.xml "$d/users.xml"
}

clickhouse_config() {
  local d=$dir/clickhouse
  clickhouse_base_config "$d" "$dir/clickhouse" -e "s#<interserver_http_port>9009</interserver_http_port>##"
  # A user with Debian's "readonly" profile, for the test that ingest
  # without the right to create its tables exits 2 (merged into users.xml).
  mkdir -p "$d/users.d"
  cat > "$d/users.d/inferlog-readonly.xml" <<'XML'
<yandex>
  <users>
    <inferlog_readonly>
      <password></password>
      <networks><ip>::1</ip><ip>127.0.0.1</ip></networks>
      <profile>readonly</profile>
      <quota>default</quota>
    </inferlog_readonly>
  </users>
</yandex>
XML
}

start_clickhouse() {
  if curl -fsS "http://127.0.0.1:$CH_HTTP_PORT/ping" >/dev/null 2>&1; then return 0; fi
  log "starting ClickHouse on 127.0.0.1:$CH_HTTP_PORT (HTTP) and :$CH_TCP_PORT (native)"
  clickhouse_config
  (cd "$dir/clickhouse" && clickhouse-server --config-file="$dir/clickhouse/config.xml" \
      --pid-file="$dir/clickhouse.pid" --daemon) >>"$dir/clickhouse.out" 2>&1
  wait_clickhouse "$CH_HTTP_PORT" ClickHouse "$dir/clickhouse.err.log"
}

# Until a ClickHouse server answers /ping on PORT (30 s).
wait_clickhouse() { # port name err_log
  # Up to 2 minutes: 18.16 loads every table before it answers, and a
  # test run leaves hundreds.
  for _ in $(seq 1 600); do curl -fsS "http://127.0.0.1:$1/ping" >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "$2 did not start; see $3"; return 1
}

# --- The local ClickHouse cluster (`up --cluster`) -------------------------
# ZooKeeper (Debian's `zookeeper`, standalone, on 127.0.0.1:$ZK_PORT) and
# four ClickHouse servers, cluster `inferlog`: 2 shards × 2 replicas, each
# server with its own data directory, ports, `macros` (shard, replica) and
# the cluster's `remote_servers`, beside the single server of `up`.
ZK_PORT=${INFERLOG_ZOOKEEPER_PORT:-2181}
# name shard http tcp interserver
CLUSTER_NODES=("s1r1 1 8131 9131 9231" "s1r2 1 8132 9132 9232" "s2r1 2 8133 9133 9233" "s2r2 2 8134 9134 9234")

start_zookeeper() {
  port_open "$ZK_PORT" && { wait_zookeeper; return; }
  local z=$dir/zookeeper
  mkdir -p "$z/data" "$z/conf"
  # A short tick: sessions of ClickHouse's replicas expire in seconds, so a
  # test that stops ZooKeeper sees the tables turn read-only and come back.
  cat > "$z/conf/zoo.cfg" <<CFG
tickTime=500
initLimit=10
syncLimit=5
dataDir=$z/data
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
CFG
  log "starting ZooKeeper on 127.0.0.1:$ZK_PORT"
  nohup java -Xmx256m -cp "$z/conf:/usr/share/java/zookeeper.jar" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$z/conf/zoo.cfg" >>"$dir/zookeeper.log" 2>&1 &
  echo $! > "$dir/zookeeper.pid"
  wait_zookeeper
}

# Until ZooKeeper serves requests (its `srvr` answer has a Mode), not just
# until its port opens: a ClickHouse server whose replicated tables find
# no ZooKeeper at start refuses to start.
wait_zookeeper() {
  local answer
  for _ in $(seq 1 300); do
    answer=$( (exec 3<>"/dev/tcp/127.0.0.1/$ZK_PORT" && echo srvr >&3 && timeout 2 cat <&3) 2>/dev/null || true)
    case "$answer" in *Mode:*) return 0 ;; esac
    sleep 0.2
  done
  log "ZooKeeper did not serve on 127.0.0.1:$ZK_PORT within 60 s; see $dir/zookeeper.log"; return 1
}

stop_zookeeper() {
  stop_pidfile "$dir/zookeeper.pid" zookeeper
  stop_by_pattern "$ZK_PORT" "QuorumPeerMain $dir/zookeeper" zookeeper
}

# The cluster as ClickHouse's `remote_servers` wants it: each shard's
# replicas, `internal_replication` on (a write goes to one replica of a
# shard and the replicated table copies it to the others).
cluster_remote_servers() {
  local shard
  echo "<inferlog>"
  for shard in 1 2; do
    echo "  <shard><internal_replication>true</internal_replication>"
    for node in "${CLUSTER_NODES[@]}"; do
      set -- $node
      [ "$2" = "$shard" ] && echo "    <replica><host>127.0.0.1</host><port>$4</port></replica>"
    done
    echo "  </shard>"
  done
  echo "</inferlog>"
}

cluster_node_config() { # name shard http tcp interserver
  local d=$dir/cluster/$1
  clickhouse_base_config "$d" "$d/clickhouse" \
      -e "s#<http_port>8123</http_port>#<http_port>$3</http_port>#; s#<tcp_port>9000</tcp_port>#<tcp_port>$4</tcp_port>#" \
      -e "s#<interserver_http_port>9009</interserver_http_port>#<interserver_http_port>$5</interserver_http_port><interserver_http_host>127.0.0.1</interserver_http_host>#" \
      -e "s#<yandex>#<yandex><include_from>$d/metrika.xml</include_from>#"
  cat > "$d/metrika.xml" <<XML
<yandex>
  <clickhouse_remote_servers>
$(cluster_remote_servers)
  </clickhouse_remote_servers>
  <zookeeper-servers>
    <node><host>127.0.0.1</host><port>$ZK_PORT</port></node>
    <session_timeout_ms>6000</session_timeout_ms>
  </zookeeper-servers>
  <macros><cluster>inferlog</cluster><shard>0$2</shard><replica>$1</replica></macros>
</yandex>
XML
}

start_cluster_node() { # name shard http tcp interserver
  curl -fsS "http://127.0.0.1:$3/ping" >/dev/null 2>&1 && return 0
  local d=$dir/cluster/$1
  log "starting ClickHouse $1 (shard $2) on 127.0.0.1:$3 (HTTP) and :$4 (native)"
  cluster_node_config "$@"
  (cd "$d" && clickhouse-server --config-file="$d/config.xml" --pid-file="$d/clickhouse.pid" --daemon) >>"$d/clickhouse.out" 2>&1
}

wait_cluster_node() { # name shard http ...
  wait_clickhouse "$3" "ClickHouse $1" "$dir/cluster/$1/clickhouse.err.log"
}

stop_cluster_node() { # name shard http tcp
  stop_pidfile "$dir/cluster/$1/clickhouse.pid" "clickhouse $1"
  stop_by_pattern "$3" "clickhouse-server --config-file=$dir/cluster/$1/config.xml" "clickhouse $1"
}

# `kill -9` of one node (a test's fault), by name.
kill_cluster_node() {
  local pidfile=$dir/cluster/$1/clickhouse.pid
  [ -f "$pidfile" ] || { log "no pid file for $1"; return 1; }
  kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  rm -f "$pidfile"
}

cluster_node() { # name -> its line of CLUSTER_NODES
  local node
  for node in "${CLUSTER_NODES[@]}"; do
    case "$node" in "$1 "*) echo "$node"; return 0 ;; esac
  done
  log "no cluster node $1 (known: s1r1 s1r2 s2r1 s2r2)"; return 2
}

start_cluster() {
  apt_install zookeeper
  start_zookeeper
  local node
  for node in "${CLUSTER_NODES[@]}"; do start_cluster_node $node; done
  for node in "${CLUSTER_NODES[@]}"; do wait_cluster_node $node; done
}

stop_cluster() {
  local node
  for node in "${CLUSTER_NODES[@]}"; do stop_cluster_node $node; done
  stop_zookeeper
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
  # Until the processes are gone, not just the port: a server holds other
  # ports (SeaweedFS' master) until it exits, and a restart needs them.
  local alive
  for _ in $(seq 1 100); do
    alive=0
    for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  kill -9 $pids 2>/dev/null || true
}

stop_clickhouse() {
  stop_pidfile "$dir/clickhouse.pid" clickhouse
  stop_by_pattern $CH_HTTP_PORT "clickhouse-server --config-file" clickhouse
  for _ in $(seq 1 50); do port_open $CH_HTTP_PORT || return 0; sleep 0.2; done
}

# Prometheus with its own config and data under $dir (not the Debian
# service's), scraping the targets named in $dir/prometheus/targets.
start_prometheus() {
  port_open "$PROM_PORT" && return 0
  local p=$dir/prometheus
  mkdir -p "$p/data" "$p/targets"
  cat > "$p/targets/local.json" <<JSON
[{"targets": ["127.0.0.1:9464"], "labels": {"component": "ingest", "stack": "local"}}]
JSON
  cat > "$p/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $repo/deploy/prometheus/inferlog.rules.yml
  - $repo/deploy/prometheus/service.rules.yml
  - $repo/deploy/prometheus/slo.rules.yml
scrape_configs:
  - job_name: inferlog
    file_sd_configs:
      - files: ["$p/targets/*.json"]
        refresh_interval: 1s
YAML
  log "starting Prometheus (http://127.0.0.1:$PROM_PORT, scraping $p/targets/*.json)"
  nohup prometheus --config.file="$p/prometheus.yml" --storage.tsdb.path="$p/data" --storage.tsdb.retention.time=35d \
    --web.listen-address="127.0.0.1:$PROM_PORT" >>"$dir/prometheus.log" 2>&1 &
  echo $! > "$dir/prometheus.pid"
  wait_port "$PROM_PORT" prometheus 60
}

stop_prometheus() {
  stop_pidfile "$dir/prometheus.pid" prometheus
  stop_by_pattern "$PROM_PORT" "prometheus --config.file=$dir/prometheus" prometheus
}

stop_s3() {
  stop_pidfile "$dir/s3.pid" seaweedfs
  stop_by_pattern "$S3_PORT" "weed server -dir=" seaweedfs
}

# The broker's TLS material, made once: a CA, and a broker certificate for
# 127.0.0.1 / localhost signed by it, in a PKCS#12 keystore.
kafka_tls() {
  local t=$dir/kafka-tls
  [ -s "$t/broker.p12" ] && return 0
  log "generating the local Kafka CA and broker certificate ($t)"
  mkdir -p "$t"; chmod 700 "$t"
  (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$t/keystore.password")
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=inferlog local CA" \
    -keyout "$t/ca.key" -out "$t/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$t/broker.key" -out "$t/broker.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$t/san.ext"
  openssl x509 -req -in "$t/broker.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" -CAcreateserial -days 3650 \
    -extfile "$t/san.ext" -out "$t/broker.crt" 2>/dev/null
  openssl pkcs12 -export -in "$t/broker.crt" -inkey "$t/broker.key" -certfile "$t/ca.crt" -name broker \
    -out "$t/broker.p12" -passout "file:$t/keystore.password"
}

kafka_properties() {
  mkdir -p "$dir/kafka"
  (umask 077; cat > "$dir/kafka/server.properties" <<EOF
# Written by deploy/local/services.sh: one combined broker + controller (KRaft).
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$dir/kafka-tls/broker.p12
ssl.keystore.password=$(cat "$dir/kafka-tls/keystore.password")
ssl.client.auth=none
log.dirs=$dir/kafka/data
num.partitions=$TOPIC_PARTITIONS
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Tests give topics a short retention.ms: expired segments go within seconds.
log.retention.check.interval.ms=1000
log.segment.delete.delay.ms=1000
auto.create.topics.enable=false
# ACLs (KRaft's authorizer): every principal may do everything on a
# resource without ACLs, so only the DLQ-refusal test's topics have any.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=true
super.users=User:ANONYMOUS
EOF
  )
}

kafka_java() { # main-class args...
  java -Xms512m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$repo/deploy/local/kafka/log4j2.properties" -cp "$kafka_lib/*" "$@"
}

start_kafka() {
  port_open $KAFKA_PORT && return 0
  kafka_tls
  kafka_properties
  if [ ! -f "$dir/kafka/data/meta.properties" ]; then
    log "formatting the Kafka log directory (once): $dir/kafka/data"
    kafka_java kafka.tools.StorageTool format -t "$(kafka_java kafka.tools.StorageTool random-uuid)" \
      -c "$dir/kafka/server.properties" >>"$dir/kafka.log" 2>&1
  fi
  log "starting Apache Kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT (PLAINTEXT) and :$KAFKA_SASL_PORT (SASL_SSL)"
  # java itself in the background (not a shell running it): kill-kafka's SIGKILL must reach the broker.
  nohup java -Xms512m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$repo/deploy/local/kafka/log4j2.properties" -cp "$kafka_lib/*" \
    kafka.Kafka "$dir/kafka/server.properties" >>"$dir/kafka.log" 2>&1 &
  echo $! > "$dir/kafka.pid"
  wait_port $KAFKA_PORT kafka 60
  wait_port $KAFKA_SASL_PORT kafka 30
}

# The SCRAM user of the SASL_SSL listener: its password is made once and
# kept in a file (mode 600); the credential is (re)set on every `up`.
kafka_user() {
  [ -s "$dir/kafka.password" ] || (umask 077; head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/kafka.password")
  python3 "$repo/deploy/local/kafkatool.py" scram-user --user inferlog --password-file "$dir/kafka.password"
  # A second user the broker lets read everything but not write topics
  # named nodlq-*: the test of a DLQ that refuses inferlog's writes.
  python3 "$repo/deploy/local/kafkatool.py" scram-user --user inferlog-nodlq --password-file "$dir/kafka.password"
  python3 "$repo/deploy/local/kafkatool.py" deny-write --user inferlog-nodlq --prefix nodlq-
  # A third user that may write topics named nodesc-* but not read their
  # configs (DescribeConfigs): the test of a DLQ whose max.message.bytes
  # inferlog cannot ask for, where the broker's refusal is the answer.
  python3 "$repo/deploy/local/kafkatool.py" scram-user --user inferlog-nodescribe --password-file "$dir/kafka.password"
  python3 "$repo/deploy/local/kafkatool.py" deny-write --user inferlog-nodescribe --prefix nodesc- --operation DESCRIBE_CONFIGS
}

stop_kafka() { # TERM (a controlled shutdown) or KILL (a crash)
  local pid
  pid=$(cat "$dir/kafka.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    log "stopping kafka (pid $pid, SIG$1)"
    kill "-$1" "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/kafka.pid"
  stop_by_pattern $KAFKA_PORT "kafka.Kafka .*server.properties" kafka
}

s3_identities() {
  [ -s "$dir/s3.secret" ] || (umask 077; printf 'inferlog-local' > "$dir/s3.secret")
  (umask 077; python3 - "$dir/s3.secret" > "$dir/seaweedfs/s3.json" <<'PY'
import json, sys
secret = open(sys.argv[1]).read().strip()
print(json.dumps({"identities": [{"name": "inferlog", "credentials": [{"accessKey": "inferlog", "secretKey": secret}],
                                  "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
PY
  )
}

start_s3() {
  port_open "$S3_PORT" && return 0
  mkdir -p "$dir/seaweedfs/data"
  s3_identities
  log "starting SeaweedFS (S3 on 127.0.0.1:$S3_PORT, objects under $dir/seaweedfs/data)"
  nohup "$weed" server -dir="$dir/seaweedfs/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.port=$SW_MASTER_PORT -volume.port=$SW_VOLUME_PORT -filer -filer.port=$SW_FILER_PORT \
    -master.volumeSizeLimitMB=1024 -volume.max=0 \
    -s3 -s3.port="$S3_PORT" -s3.config="$dir/seaweedfs/s3.json" >>"$dir/s3.log" 2>&1 &
  echo $! > "$dir/s3.pid"
  wait_port "$S3_PORT" seaweedfs 60
  python3 - "$S3_PORT" "$dir/s3.secret" <<'PY'
import sys, time, boto3
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1",
                  aws_access_key_id="inferlog", aws_secret_access_key=open(sys.argv[2]).read().strip())
# The gateway opens its port before the filer and volume servers answer.
for attempt in range(300):
    try:
        if "inferlog-cold" not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
            s3.create_bucket(Bucket="inferlog-cold")
        s3.put_object(Bucket="inferlog-cold", Key="_probe", Body=b"ok")
        s3.delete_object(Bucket="inferlog-cold", Key="_probe")
        break
    except Exception as e:  # noqa: BLE001
        if attempt == 299:
            raise SystemExit(f"SeaweedFS S3 did not answer: {e}")
        time.sleep(0.2)
PY
}

hash_key() {
  # A local user-id hash key; real deployments provide their own secret file.
  [ -s "$dir/hash.key" ] || { umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/hash.key"; }
}

create_topics() {
  python3 "$repo/deploy/local/kafkatool.py" create-topics --partitions "$TOPIC_PARTITIONS" inference-events
  [ -z "$with_otel" ] || python3 "$repo/deploy/local/kafkatool.py" create-topics --partitions "$TOPIC_PARTITIONS" otlp-spans
  # The DLQ holds rejected events no longer than the hot tier's 7 days: Kafka
  # deletes a closed segment once its newest message is past retention.ms,
  # so a message lives up to retention.ms + segment.ms (retention audits both).
  python3 "$repo/deploy/local/kafkatool.py" create-topics --partitions "$TOPIC_PARTITIONS" --config retention.ms=518400000 --config segment.ms=86400000 inference-events-dlq
}

status() {
  local ok=0
  show() { printf '%-11s %-34s %s\n' "$1" "$2" "$3"; }
  if curl -fsS "http://127.0.0.1:$CH_HTTP_PORT/ping" >/dev/null 2>&1; then
    show clickhouse "http://127.0.0.1:$CH_HTTP_PORT tcp:$CH_TCP_PORT" "up ($(curl -fsS "http://127.0.0.1:$CH_HTTP_PORT/?query=SELECT%20version()"))"
  else show clickhouse "http://127.0.0.1:$CH_HTTP_PORT" down; ok=1; fi
  if [ -d "$dir/cluster" ] || port_open "$ZK_PORT"; then
    if port_open "$ZK_PORT"; then show zookeeper "127.0.0.1:$ZK_PORT" up; else show zookeeper "127.0.0.1:$ZK_PORT" "down (up --cluster starts it)"; fi
    for node in "${CLUSTER_NODES[@]}"; do
      set -- $node
      if curl -fsS "http://127.0.0.1:$3/ping" >/dev/null 2>&1; then show "ch-$1" "http://127.0.0.1:$3 tcp:$4" "up (cluster inferlog, shard $2)"
      else show "ch-$1" "http://127.0.0.1:$3" down; fi
    done
  fi
  if port_open $KAFKA_PORT; then show kafka "127.0.0.1:$KAFKA_PORT sasl_ssl:$KAFKA_SASL_PORT" "up (Apache Kafka $KAFKA_VERSION, pid $(cat "$dir/kafka.pid" 2>/dev/null || echo '?'))"
  else show kafka "127.0.0.1:$KAFKA_PORT" down; ok=1; fi
  if pg_isready -q -h 127.0.0.1 -p $PG_PORT 2>/dev/null; then show postgres "127.0.0.1:$PG_PORT" up
  else show postgres "127.0.0.1:$PG_PORT" down; ok=1; fi
  if port_open "$S3_PORT"; then show s3 "http://127.0.0.1:$S3_PORT" "up (SeaweedFS, bucket inferlog-cold)"
  else show s3 "http://127.0.0.1:$S3_PORT" down; ok=1; fi
  if port_open "$PROM_PORT"; then show prometheus "http://127.0.0.1:$PROM_PORT" "up ($(prometheus --version 2>&1 | head -1 | awk '{print $3}'))"
  else show prometheus "http://127.0.0.1:$PROM_PORT" down; ok=1; fi
  if port_open $OTEL_HTTP_PORT; then show otelcol "http://127.0.0.1:$OTEL_HTTP_PORT grpc:$OTEL_GRPC_PORT" "up (OpenTelemetry Collector $OTELCOL_VERSION, to topic otlp-spans)"
  else show otelcol "http://127.0.0.1:$OTEL_HTTP_PORT" "down (up --otel starts it)"; fi
  echo "data and logs: $dir"
  return $ok
}

with_otel=""
with_tests=""
with_cluster=""
if [ "${1:-}" = up ]; then for flag in "${@:2}"; do
  case "$flag" in
    --otel) with_otel=1 ;;
    --tests) with_tests=1 ;;
    --cluster) with_cluster=1 ;;
    *) log "unknown flag $flag (known: --otel, --tests, --cluster)"; exit 2 ;;
  esac
done; fi

case "${1:-}" in
  up)
    started=$(date +%s)
    install
    start_postgres
    start_clickhouse
    [ -z "$with_cluster" ] || start_cluster
    start_kafka
    kafka_user
    wait_seaweedfs
    start_s3
    start_prometheus
    create_topics
    if [ -n "$with_otel" ]; then
      if [ -n "$otel_build" ]; then wait "$otel_build" || exit 2; fi
      start_otelcol
    fi
    hash_key
    status
    log "up in $(( $(date +%s) - started )) s"
    ;;
  down)
    stop_otelcol
    stop_prometheus
    stop_kafka TERM
    stop_s3
    stop_clickhouse
    stop_cluster
    ;;
  status) status ;;
  otelcol-bin) build_otelcol >&2 && echo "$otelcol" ;;
  build-deps) build_deps ;;
  stop-clickhouse) stop_clickhouse ;;
  # The cluster's faults, by node name (s1r1 s1r2 s2r1 s2r2).
  stop-node) node=$(cluster_node "${2:-}") || exit 2; stop_cluster_node $node ;;
  kill-node) cluster_node "${2:-}" >/dev/null || exit 2; kill_cluster_node "$2" ;;
  start-node) node=$(cluster_node "${2:-}") || exit 2; start_cluster_node $node; wait_cluster_node $node ;;
  # Both servers of shard 1 or 2.
  stop-shard) for r in 1 2; do node=$(cluster_node "s${2:-}r$r") || exit 2; stop_cluster_node $node; done ;;
  start-shard)
    for r in 1 2; do node=$(cluster_node "s${2:-}r$r") || exit 2; start_cluster_node $node; done
    for r in 1 2; do node=$(cluster_node "s${2}r$r"); wait_cluster_node $node; done ;;
  stop-zookeeper) stop_zookeeper ;;
  start-zookeeper) start_zookeeper ;;
  start-clickhouse) start_clickhouse ;;
  restart-clickhouse) stop_clickhouse; start_clickhouse ;;
  restart-postgres) restart_postgres ;;
  # SeaweedFS keeps its objects on disk: a stopped S3 server comes back with them.
  stop-s3) stop_s3 ;;
  start-s3) start_s3 ;;
  # A controlled shutdown (SIGTERM) or a crash (SIGKILL); the log stays on disk.
  stop-kafka) stop_kafka TERM ;;
  kill-kafka) stop_kafka KILL ;;
  start-kafka) start_kafka ;;
  *) echo "usage: $0 up [--otel] [--tests] [--cluster]|down|otelcol-bin|status|build-deps|stop-clickhouse|start-clickhouse|restart-clickhouse|restart-postgres|stop-s3|start-s3|stop-kafka|kill-kafka|start-kafka|stop-node|kill-node|start-node NAME|stop-shard|start-shard 1|2|stop-zookeeper|start-zookeeper" >&2; exit 2 ;;
esac
