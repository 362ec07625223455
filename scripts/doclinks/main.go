// Command doclinks checks that every relative link in README.md and docs/
// resolves: the file or folder exists, and a #fragment names a heading of
// the target file (GitHub's anchors: lower case, punctuation dropped, spaces
// as hyphens). scripts/test.sh runs it; it prints each broken link and exits
// 1 when there is one.
//
//	go run ./scripts/doclinks [FILE.md|DIR ...]   (default: README.md docs)
package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// link matches [text](target) and ![alt](target); the target ends at the
// first space or closing parenthesis.
var link = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

func main() {
	roots := os.Args[1:]
	if len(roots) == 0 {
		roots = []string{"README.md", "docs"}
	}
	files, err := markdownFiles(roots)
	if err != nil {
		fmt.Fprintln(os.Stderr, "doclinks:", err)
		os.Exit(1)
	}
	var broken []string
	checked := 0
	for _, f := range files {
		b, err := check(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "doclinks:", err)
			os.Exit(1)
		}
		broken = append(broken, b.broken...)
		checked += b.checked
	}
	for _, b := range broken {
		fmt.Println(b)
	}
	if len(broken) > 0 {
		fmt.Printf("doclinks: %d of %d relative links in %d files do not resolve\n", len(broken), checked, len(files))
		os.Exit(1)
	}
	fmt.Printf("doclinks: %d relative links in %d files resolve\n", checked, len(files))
}

func markdownFiles(roots []string) ([]string, error) {
	var out []string
	for _, r := range roots {
		err := filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				out = append(out, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.Strings(out)
	return out, nil
}

type result struct {
	broken  []string
	checked int
}

func check(file string) (result, error) {
	var res result
	lines, err := readLines(file)
	if err != nil {
		return res, err
	}
	fence := false
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(stripCode(line), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			res.checked++
			if msg := resolve(file, target); msg != "" {
				res.broken = append(res.broken, fmt.Sprintf("%s:%d: %s: %s", file, i+1, target, msg))
			}
		}
	}
	return res, nil
}

// stripCode removes `code spans`, where brackets are not links.
func stripCode(line string) string {
	var b strings.Builder
	in := false
	for _, r := range line {
		if r == '`' {
			in = !in
			continue
		}
		if !in {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func resolve(from, target string) string {
	path, frag, _ := strings.Cut(target, "#")
	dest := from
	if path != "" {
		dest = filepath.Join(filepath.Dir(from), path)
		st, err := os.Stat(dest)
		if err != nil {
			return "no such file or folder"
		}
		if st.IsDir() {
			if frag != "" {
				return "a fragment on a folder"
			}
			return ""
		}
	}
	if frag == "" {
		return ""
	}
	if !strings.HasSuffix(dest, ".md") {
		return ""
	}
	anchors, err := headings(dest)
	if err != nil {
		return err.Error()
	}
	if !anchors[frag] {
		return fmt.Sprintf("no heading with anchor #%s in %s", frag, dest)
	}
	return ""
}

func headings(file string) (map[string]bool, error) {
	lines, err := readLines(file)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := anchor(text)
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out, nil
}

// anchor is GitHub's heading anchor: lower case; letters, digits, spaces,
// hyphens and underscores kept, other characters dropped; spaces become
// hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func readLines(file string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out, sc.Err()
}
