#!/usr/bin/env bash
# Checks of what `deploy/` ships that are not Rust tests, run by
# deploy/local/test.sh (and so by CI) after the release build:
#   1. the Prometheus alert rules: `promtool check rules` and their unit tests
#      (`promtool test rules`), with Debian's promtool (2.42, `prometheus`)
#      and with promtool 3.x built from the Go module proxy (cached under
#      ~/.cache/inferlog; the first build takes a few minutes);
#   2. the Grafana boards: deploy/grafana/dashboards.py --check (the JSON
#      and README are what the script generates, through the SDK's schema);
#   3. the systemd units: `systemd-analyze verify`, against the binaries just
#      built;
#   4. the event-parser fuzz target (schema/fuzz, cargo-fuzz on nightly) for
#      FUZZ_SECONDS (default 60) on the committed corpus. New inputs it finds
#      go to a scratch directory, not the committed corpus; a crash fails
#      the check and leaves the input under schema/fuzz/artifacts/;
#   5. the code: `cargo fmt --check` (rustfmt.toml) and clippy with every
#      warning an error, on every target.
# Usage: deploy/check.sh [rules|boards|systemd|fuzz|code]...   (default: all five)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

need_apt() {
    if ! command -v "$1" >/dev/null; then
        echo "installing $2 (for $1)"
        if [ ! -f /var/lib/apt/lists/.inferlog-updated ]; then apt-get update -qq && touch /var/lib/apt/lists/.inferlog-updated; fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null
    fi
}

# Prometheus 3.x's promtool: the Go module of Prometheus v3.N is v0.3NN.
PROMTOOL3_MODULE=v0.316.0

# Builds promtool 3.x once into the cache; prints its path.
promtool3() {
    local dir="${XDG_CACHE_HOME:-$HOME/.cache}/inferlog/promtool-$PROMTOOL3_MODULE"
    if [ ! -x "$dir/promtool" ]; then
        command -v go >/dev/null || need_apt go golang-go
        echo "building promtool $PROMTOOL3_MODULE (Prometheus 3) from the Go module proxy" >&2
        GOBIN="$dir" GOFLAGS=-mod=mod go install "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL3_MODULE" >&2
    fi
    echo "$dir/promtool"
}

check_rules() {
    need_apt promtool prometheus
    local p3
    p3=$(promtool3)
    for tool in promtool "$p3"; do
        echo "-- $tool: $("$tool" --version 2>&1 | head -n 1)"
        (cd deploy/prometheus && "$tool" check rules inferlog.rules.yml service.rules.yml slo.rules.yml \
            && "$tool" test rules inferlog.rules.test.yml service.rules.test.yml service.spikes.test.yml slo.rules.test.yml)
    done
}

check_boards() {
    python3 -c 'import grafana_foundation_sdk' 2>/dev/null \
        || python3 -m pip install -q -r deploy/grafana/requirements.txt >/dev/null
    python3 deploy/grafana/dashboards.py --check
    echo "boards: $(ls deploy/grafana/dashboards/*.json | wc -l) generated and current"
}

check_systemd() {
    need_apt systemd-analyze systemd
    local dir
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' RETURN
    for unit in deploy/systemd/*.service; do
        sed "s#/usr/local/bin/#${INFERLOG_BIN_DIR:-$root/target/release}/#" "$unit" > "$dir/$(basename "$unit")"
    done
    # verify prints problems and exits non-zero on errors; warnings count too.
    local out
    out=$(systemd-analyze verify "$dir"/*.service 2>&1) || { echo "$out"; return 1; }
    if [ -n "$out" ]; then echo "$out"; return 1; fi
    echo "systemd units: $(ls deploy/systemd/*.service | wc -l) verified"
}

check_fuzz() {
    if ! rustup toolchain list | grep -q '^nightly'; then
        echo "fuzz: needs the nightly toolchain (rustup toolchain install nightly)"; return 1
    fi
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
    local scratch
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' RETURN
    # libFuzzer reads every corpus directory and writes new inputs to the first.
    # libFuzzer logs every new input; keep the build, the last lines and,
    # on a crash, the report (which comes last).
    (cd schema && cargo +nightly fuzz run normalize_event "$scratch" fuzz/corpus/normalize_event -- \
        -max_total_time="${FUZZ_SECONDS:-60}" -max_len=70000 -timeout=10 -print_final_stats=1 2>&1) \
        | grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse)|NEW_FUNC' | tail -n 60
}

check_code() {
    cargo fmt --all -- --check
    # The profile and features of the test build (deploy/local/test.sh), so
    # clippy reuses its build scripts (librdkafka's C build among them).
    cargo clippy --profile ci --workspace --all-targets --locked --features inferlog-store/test-hooks -- -D warnings
    echo "code: formatted, clippy clean"
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(code rules boards systemd fuzz)
for step in "${steps[@]}"; do
    echo "== deploy/check.sh $step"
    "check_$step"
done
