#!/usr/bin/env bash
# The test command of README.md: every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo test --workspace --locked
