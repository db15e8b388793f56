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
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/apisurface"
)

var update = flag.Bool("update", false, "rewrite exported.txt from the code")

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
