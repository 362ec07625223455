//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// Binary is one function's bootstrap binary.
type Binary struct {
	Name string // the folder under functions/
	Path string // <dir>/<name>/bootstrap
	Size int64  // bytes
}

// Binaries is what Build produced.
type Binaries struct {
	// Built maps each function name to its binary.
	Built map[string]Binary
	// Missing lists the folders under functions/ that hold no main package
	// (yet): they were not built, and their scenarios cannot run.
	Missing []string
}

// Build builds every main package under root/functions into
// dir/<name>/bootstrap for the host's architecture, with the flags
// scripts/build.sh uses for production (CGO_ENABLED=0, -trimpath, -tags
// lambda.norpc, -ldflags "-s -w"). All packages are built by one go build,
// so shared dependencies compile once.
func Build(ctx context.Context, root, dir string) (Binaries, error) {
	entries, err := os.ReadDir(filepath.Join(root, "functions"))
	if err != nil {
		return Binaries{}, fmt.Errorf("listing functions: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)

	res := Binaries{Built: map[string]Binary{}}
	var pkgs []string
	for _, name := range names {
		cmd := exec.CommandContext(ctx, "go", "list", "-f", "{{.Name}}", "./functions/"+name)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != "main" {
			// No Go files yet, or not a command: nothing to run.
			res.Missing = append(res.Missing, name)
			continue
		}
		pkgs = append(pkgs, "./functions/"+name)
	}
	if len(pkgs) == 0 {
		return res, errors.New("no main package under functions/")
	}

	staging := filepath.Join(dir, ".build") + string(filepath.Separator)
	args := append([]string{"build", "-trimpath", "-tags", "lambda.norpc", "-ldflags", "-s -w", "-o", staging}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH, "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	for _, pkg := range pkgs {
		name := filepath.Base(pkg)
		path := filepath.Join(dir, name, "bootstrap")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return res, err
		}
		if err := os.Rename(filepath.Join(staging, name), path); err != nil {
			return res, fmt.Errorf("placing %s: %w", name, err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			return res, err
		}
		res.Built[name] = Binary{Name: name, Path: path, Size: fi.Size()}
	}
	_ = os.Remove(staging)
	return res, nil
}

// InstallEmulator installs the pinned aws-lambda-rie through
// scripts/lib/rie.sh (which holds the version) into root/.tmp/bin, unless it
// is there already, and returns its path.
func InstallEmulator(ctx context.Context, root string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-c", `. scripts/lib/rie.sh && rie_install`)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/lib/rie.sh: %w\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	path := strings.TrimSpace(lines[len(lines)-1])
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("scripts/lib/rie.sh printed %q, which is not an executable", path)
	}
	return path, nil
}

// RepoRoot finds the module root (the folder holding go.mod) from dir
// upwards.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's folder")
		}
		dir = parent
	}
}
