package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

// CPU pinning. On a machine with two cores the benchmark and PostgreSQL
// share both, so a ratio against pgbench measures in part how the scheduler
// shares them. Pinned, PostgreSQL's processes (the postmaster and every
// backend, which inherit its affinity when they are forked) run on CPU 0 and
// this process, the pgbench it starts and toxiproxy on CPU 1, so the
// client side never takes the server's core. scripts/bench.sh pins only a
// cluster it started itself (a shared server is never moved).

const (
	serverCPU = "0"
	clientCPU = "1"
	allCPUs   = "0-1"
)

// cpuModes are the ways a pinned section runs: pinned and unpinned when
// pinning is on and the machine has two cores or more, else unpinned only.
func cpuModes() []bool {
	if *pin && runtime.NumCPU() >= 2 {
		return []bool{true, false}
	}
	return []bool{false}
}

func cpuLabel(pinned bool) string {
	if pinned {
		return "pinned"
	}
	return "shared"
}

// withCPUs runs fn with the processes pinned (see above) when pinned is
// true, and gives every process both CPUs back afterwards.
func withCPUs(ctx context.Context, pinned bool, fn func()) {
	if !pinned {
		fn()
		return
	}
	setAffinity(ctx, serverCPU, clientCPU)
	defer setAffinity(ctx, allCPUs, allCPUs)
	fn()
}

// setAffinity moves PostgreSQL's processes to server and this process (all
// its threads) and toxiproxy to client.
func setAffinity(ctx context.Context, server, client string) {
	for _, pid := range serverPids(ctx) {
		taskset(server, pid, false)
	}
	taskset(client, os.Getpid(), true)
	if *toxiproxyPid > 0 {
		taskset(client, *toxiproxyPid, true)
	}
}

func taskset(cpus string, pid int, threads bool) {
	args := []string{"-p", "-c", cpus, strconv.Itoa(pid)}
	if threads {
		args = append([]string{"-a"}, args...)
	}
	if out, err := exec.Command("taskset", args...).CombinedOutput(); err != nil {
		// A backend that ended meanwhile is not an error.
		if _, serr := os.Stat("/proc/" + strconv.Itoa(pid)); serr != nil {
			return
		}
		fail(fmt.Errorf("taskset %v: %w\n%s", args, err, out))
	}
}

// serverPids are the postmaster (the parent of a backend) and its children.
func serverPids(ctx context.Context) []int {
	var backend int
	check(pool0(ctx).QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend))
	postmaster := ppid(backend)
	if postmaster <= 1 {
		fail(fmt.Errorf("pinning: no postmaster above backend %d", backend))
	}
	pids := []int{postmaster}
	entries, err := os.ReadDir("/proc")
	check(err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && ppid(pid) == postmaster {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ppid is pid's parent, from /proc/<pid>/stat (0 when it cannot be read).
func ppid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}
