package failbustest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// internalPrefix is where the module keeps what is not its public API.
const internalPrefix = "github.com/failbus/failbus/internal/"

// The examples of the public packages (pkg/, jetstream/) are what a new
// user copies: each must run on public packages alone, so none may import
// the module's internal/ packages (failbustest stands in for them). A file
// is an example file when it is named example*_test.go or declares an
// Example function.
func TestExamplesImportNoInternalPackage(t *testing.T) {
	fset := token.NewFileSet()
	var examples []string
	for _, root := range []string{"../pkg", "../jetstream"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(d.Name(), "example") && !declaresExample(f) {
				return nil
			}
			examples = append(examples, path)
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(p, internalPrefix) {
					t.Errorf("%s: imports %s; an example must use public packages only (failbustest for a bus)", fset.Position(imp.Pos()), p)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The walk itself must have found the examples it is meant to check.
	want := filepath.Join("..", "pkg", "agent", "example_test.go")
	found := false
	for _, e := range examples {
		found = found || e == want
	}
	if !found {
		t.Fatalf("%s not among the %d example files found: is the walk looking in the right place?", want, len(examples))
	}
	t.Logf("%d example files checked", len(examples))
}

// declaresExample says whether f declares a testable example.
func declaresExample(f *ast.File) bool {
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") {
			return true
		}
	}
	return false
}
