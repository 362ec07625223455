#!/usr/bin/env bash
# Synthesizes the CloudFormation template offline: no AWS credentials, no
# network beyond the npm registry (for the pinned CDK CLI on first run).
#
#   scripts/synth.sh                      stage dev
#   scripts/synth.sh -c stage=prod        any CDK context (see infra/stack/settings.go)
#
# Output: infra/cdk.out/StripeInbox-<stage>.template.json. The cdk-nag
# AwsSolutions checks run in the app; an unsuppressed finding fails the synth.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

# The function bundles are the stack's assets: build them when any is missing.
for fn in webhook worker purge migrate reconcile reconcilestore; do
  if [ ! -f "build/$fn/bootstrap" ]; then
    echo "build/$fn/bootstrap missing: running scripts/build.sh"
    bash scripts/build.sh
    break
  fi
done

# The CDK CLI version is pinned in infra/package.json and package-lock.json.
pinned="$(node -p 'require("./infra/package.json").devDependencies["aws-cdk"]')"
installed="$(node -p 'try { require("./infra/node_modules/aws-cdk/package.json").version } catch { "" }')"
if [ "$pinned" != "$installed" ]; then
  (cd infra && npm ci --no-audit --no-fund --loglevel=error)
fi

# Offline and quiet: no version check, no notices, no telemetry, no
# credential probing (the stack is environment-agnostic and does no lookups).
export CDK_DISABLE_VERSION_CHECK=1
export CDK_DISABLE_CLI_TELEMETRY=true
export AWS_EC2_METADATA_DISABLED=true
# This machine runs Node 20, which jsii reports as past its end of support
# (2026-10-30); move CI to Node 22 and drop this line.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="${JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION:-20}"

cd infra
rm -rf cdk.out
start=$(date +%s)
npx --no-install cdk synth --quiet --no-notices --no-version-reporting --no-lookups "$@"
echo "synthesized in $(( $(date +%s) - start ))s: $(ls cdk.out/*.template.json | sed 's|^|infra/|')"
