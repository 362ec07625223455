#!/usr/bin/env bash
# Builds the functions and deploys the stack of one stage.
#
#   scripts/deploy.sh dev
#   scripts/deploy.sh prod -c alarmEmail=ops@example.com
#
# Prerequisites:
#   - AWS credentials for the target account (AWS_PROFILE or the usual
#     variables) and a region (AWS_REGION or the profile's region). The stack
#     is environment-agnostic: it deploys to whichever account and region the
#     credentials point at, so check `aws sts get-caller-identity` first.
#   - The account/region bootstrapped once for the CDK:
#       (cd infra && npx cdk bootstrap)
#   - Go (for scripts/build.sh and the CDK app) and Node.js 20+ with npm.
#
# A deploy runs the migrate function (CDK trigger) after the database and
# proxy are ready and before the webhook, worker and purge are updated; if a
# migration fails the deploy fails and CloudFormation rolls back the stack.
# Outputs (webhook URLs, signing-secret ARNs, ...) are written to
# build/cdk-outputs-<stage>.json.
set -euo pipefail

if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
  echo "usage: scripts/deploy.sh STAGE [cdk deploy options...]" >&2
  exit 2
fi
stage="$1"
shift

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

bash scripts/build.sh

pinned="$(node -p 'require("./infra/package.json").devDependencies["aws-cdk"]')"
installed="$(node -p 'try { require("./infra/node_modules/aws-cdk/package.json").version } catch { "" }')"
if [ "$pinned" != "$installed" ]; then
  (cd infra && npm ci --no-audit --no-fund --loglevel=error)
fi

export CDK_DISABLE_CLI_TELEMETRY=true
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="${JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION:-20}"

# Production asks before any change that widens permissions or network
# access; other stages deploy unattended.
approval=never
if [ "$stage" = "prod" ]; then
  approval=broadening
fi

cd infra
npx --no-install cdk deploy "StripeInbox-$stage" \
  -c "stage=$stage" \
  --require-approval "$approval" \
  --no-notices \
  --outputs-file "$root/build/cdk-outputs-$stage.json" \
  "$@"
echo "outputs: build/cdk-outputs-$stage.json"
