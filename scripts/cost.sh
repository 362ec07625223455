#!/usr/bin/env bash
# Prices the stack: synthesizes the default dev and prod stages offline
# (scripts/synth.sh; no credentials) and runs scripts/cost over both
# templates with scripts/cost/prices.json.
#
#   scripts/cost.sh            # print the monthly cost per item, dev and prod
#   scripts/cost.sh -check     # fail unless docs/deployment.md's table is this one (scripts/test.sh)
#   scripts/cost.sh -write     # write it into docs/deployment.md
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

mode=()
case "${1:-}" in
  -check) mode=(-check docs/deployment.md) ;;
  -write) mode=(-write docs/deployment.md) ;;
  "") ;;
  *) echo "usage: scripts/cost.sh [-check|-write]" >&2; exit 2 ;;
esac

# prod first, into its own folder: synth.sh empties infra/cdk.out each run.
bash scripts/synth.sh -c stage=prod --output cdk.out.prod
bash scripts/synth.sh -c stage=dev
go run ./scripts/cost \
  -template dev=infra/cdk.out/StripeInbox-dev.template.json \
  -template prod=infra/cdk.out.prod/StripeInbox-prod.template.json \
  "${mode[@]}"
