// Package e2e runs the real Lambda binaries (functions/*) under the AWS
// Lambda Runtime Interface Emulator, through the same Runtime API that AWS
// serves them, with the environment the CDK stack gives them. Unit tests call
// the handlers directly; these tests catch what they cannot: a broken main(),
// an event shape the handler does not decode, a signing secret fetched on
// every request, a binary that never starts or starts without saying why.
//
// The package's non-test files are the harness (building the binaries with
// the production flags, installing the pinned emulator through
// scripts/lib/rie.sh, running and stopping it, reading its INIT reports); the
// tests are in *_test.go. Set E2E_REPORT=path to have the tests write one
// JSON line per function (binary size and cold-start INIT durations) for
// benchmark scripts.
package e2e
