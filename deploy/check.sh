#!/usr/bin/env bash
# Checks of what `deploy/` ships that are not Rust tests, run by
# deploy/local/test.sh (and so by CI) after the release build:
#   1. the Prometheus alert rules: `promtool check rules` and their unit tests
#      (`promtool test rules`); installs Debian's `prometheus` for promtool;
#   2. the systemd units: `systemd-analyze verify`, against the binaries just
#      built;
#   3. the event-parser fuzz target (schema/fuzz, cargo-fuzz on nightly) for
#      FUZZ_SECONDS (default 60) on the committed corpus. New inputs it finds
#      go to a scratch directory, not the committed corpus; a crash fails
#      the check and leaves the input under schema/fuzz/artifacts/;
#   4. the code: `cargo fmt --check` (rustfmt.toml) and clippy with every
#      warning an error, on every target.
# Usage: deploy/check.sh [rules|systemd|fuzz|code]...   (default: all four)
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

check_rules() {
    need_apt promtool prometheus
    (cd deploy/prometheus && promtool check rules inferlog.rules.yml service.rules.yml slo.rules.yml \
        && promtool test rules inferlog.rules.test.yml service.rules.test.yml service.spikes.test.yml slo.rules.test.yml)
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
[ ${#steps[@]} -eq 0 ] && steps=(code rules systemd fuzz)
for step in "${steps[@]}"; do
    echo "== deploy/check.sh $step"
    "check_$step"
done
