// Package api holds the list of failbus's public API (exported.txt) and the
// test that keeps it equal to the code: a change to what pkg/ and
// jetstream/ export shows as a diff of that file. After a deliberate
// change, run go test ./api -update.
package api

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/apisurface"
)

var update = flag.Bool("update", false, "rewrite exported.txt from the code")

// maxExported bounds the public API: the number of exported names in
// pkg/ and jetstream/ (types, funcs, methods, consts, vars; not the fields
// of exported structs nor the methods of exported interfaces). Raising it
// is a decision to review, not a side effect of a change: 499 → 505 when
// the init() type registry (Register) became a table value a reader builds
// (Types, WireType, NewTypes, ContractTypes and the table's methods); 505 →
// 526 when the list began to show the methods pkg/policy's section aliases
// carry from their internal packages (they were public, and not listed);
// 526 → 527 for consumer's Outputs.After (a handler's shared write, such
// as the scheduler's fault-scope write of a provider's successes, settles
// its input without holding its worker); 527 → 528 for consumer's
// SettleTimeout (how long such a wait may last before the input is
// handed back: the scheduler's longest scope linger is derived from it).
const maxExported = 528

// publicDirs are the public package trees.
var publicDirs = []string{"pkg", "jetstream"}

func surface(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, root := range publicDirs {
		err := filepath.WalkDir(filepath.Join("..", root), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel("..", path)
			rel = filepath.ToSlash(rel)
			if strings.Contains("/"+rel+"/", "/internal/") || strings.Contains(rel, "testdata") {
				return nil
			}
			lines, err := apisurface.Dir(path, rel)
			out = append(out, lines...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestExportedAPI(t *testing.T) {
	got := strings.Join(surface(t), "\n") + "\n"
	if *update {
		if err := os.WriteFile("exported.txt", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("exported.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("the public API is not what api/exported.txt says (%d lines now, %d there): review the change and run go test ./api -update",
			strings.Count(got, "\n"), strings.Count(string(want), "\n"))
	}
	t.Logf("%d exported identifiers in %v", strings.Count(got, "\n"), publicDirs)
}

// TestExportedCount keeps the public API from growing unnoticed: it counts
// the exported names of every public package (fields and interface
// methods aside), logs them per package, and fails above maxExported.
func TestExportedCount(t *testing.T) {
	perPkg := map[string]int{}
	total := 0
	for _, line := range surface(t) {
		pkg, decl, ok := strings.Cut(line, ": ")
		if !ok || strings.HasPrefix(decl, "field ") || strings.HasPrefix(decl, "method ") {
			continue
		}
		perPkg[pkg]++
		total++
	}
	pkgs := make([]string, 0, len(perPkg))
	for p := range perPkg {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		t.Logf("%4d %s", perPkg[p], p)
	}
	t.Logf("%4d in all (at most %d)", total, maxExported)
	if total > maxExported {
		t.Fatalf("%d exported names in %v, more than maxExported (%d): unexport what outsiders do not need, or raise the bound as a reviewed decision",
			total, publicDirs, maxExported)
	}
}
