package config

import (
	"strconv"
	"strings"
)

// WorkerGCPercent is the worker's garbage collection target (GOGC) when the
// environment does not set GOGC. The worker's live heap is small (3 MB
// draining at 4 drainers: the pool, the statement caches, the batches in
// hand) and it allocates about 10 kB a receipt, decoding and booking. At Go's
// default of 100 it collected every few hundred receipts (71 collections
// for 20,000), each collection's fixed costs included. At 400 it collects a
// fifth as often (14), for a heap goal of 21 MB instead of 8 MB; with the
// change that reads each event before its batch job, the worker's CPU a
// receipt went from 62–90 µs to 50–70 in scripts/bench.sh's against
// section (docs/performance.md, issue 24 at stop 40).
// A deployed worker of 256 MB has about a seventh of a vCPU (Lambda gives
// CPU in proportion to memory), so its CPU is what it is short of.
const WorkerGCPercent = 400

// GC is what the Go runtime's collector is set to in a process that drains
// the inbox (bootstrap applies it with runtime/debug).
type GC struct {
	// Percent is debug.SetGCPercent's value; 0 leaves the runtime's own
	// (GOGC, when the environment sets it).
	Percent int
	// MemoryLimit is debug.SetMemoryLimit's value in bytes; 0 leaves the
	// runtime's own (GOMEMLIMIT, or none).
	MemoryLimit int64
}

// gc reads the collector's settings: WorkerGCPercent unless GOGC is set,
// and, on Lambda (AWS_LAMBDA_FUNCTION_MEMORY_SIZE, in MB, which Lambda
// sets) unless GOMEMLIMIT is set, a soft memory limit of three quarters of
// the function's memory. The limit is what keeps the higher target safe:
// should the live heap grow (large payloads in every batch), the collector
// runs as often as it must to stay under it rather than let the heap reach
// five times the live one and the function its memory.
func (p *problems) gc(env Env) GC {
	var g GC
	if strings.TrimSpace(env("GOGC")) == "" {
		g.Percent = WorkerGCPercent
	}
	raw := strings.TrimSpace(env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"))
	if raw == "" || strings.TrimSpace(env("GOMEMLIMIT")) != "" {
		return g
	}
	mb, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || mb < 128 || mb > 10240 {
		p.addf("AWS_LAMBDA_FUNCTION_MEMORY_SIZE=%q: must be the function's memory in MB (128 to 10240), as Lambda sets it; unset it outside Lambda", raw)
		return g
	}
	g.MemoryLimit = mb << 20 * 3 / 4
	return g
}
