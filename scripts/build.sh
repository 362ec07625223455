#!/usr/bin/env bash
# Builds every Lambda under functions/<name> into build/<name>/bootstrap, the
# layout the CDK stack (infra/) packages as assets.
#
#   scripts/build.sh          linux/arm64 (provided.al2023 on Graviton; default)
#   scripts/build.sh --host   the host's GOARCH (for local emulator runs)
#
# Directories under functions/ that hold no main package yet are skipped with
# a note. Output: one line per function with the binary's size.
set -euo pipefail

cd "$(dirname "$0")/.."

goarch=arm64
case "${1:-}" in
  "") ;;
  --host) goarch="$(go env GOHOSTARCH)" ;;
  -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
  *) echo "usage: scripts/build.sh [--host]" >&2; exit 2 ;;
esac

built=0
for dir in functions/*/; do
  name="$(basename "$dir")"
  if [ "$(go list -f '{{.Name}}' "./$dir" 2>/dev/null)" != "main" ]; then
    echo "skip  $name (no main package in $dir)"
    continue
  fi
  out="build/$name/bootstrap"
  rm -rf "build/$name"   # the folder is the asset: nothing stale may ride along
  mkdir -p "build/$name"
  CGO_ENABLED=0 GOOS=linux GOARCH="$goarch" \
    go build -trimpath -tags lambda.norpc -ldflags "-s -w" -o "$out" "./$dir"
  printf 'built %-8s linux/%s %6s KiB  %s\n' "$name" "$goarch" "$(( $(wc -c <"$out") / 1024 ))" "$out"
  built=$((built + 1))
done

if [ "$built" -eq 0 ]; then
  echo "no functions built" >&2
  exit 1
fi
