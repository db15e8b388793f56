package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// readmeMax is the most README.md may weigh: a product page a newcomer
// reads to the end, with the long reference in docs/.
const readmeMax = 12 * 1024

// TestReadmeFitsOnAPage: README.md stays a product page.
func TestReadmeFitsOnAPage(t *testing.T) {
	fi, err := os.Stat("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > readmeMax {
		t.Errorf("README.md is %d bytes, at most %d: move the reference into docs/", fi.Size(), readmeMax)
	}
}

var (
	// labNote is how a working note cites where a rule came from instead
	// of saying what it does: a task number, a source post.
	labNote = regexp.MustCompile(`(?i)\bissues? [0-9]|\bseeds? 0[0-9][0-9]`)
	// hexWord is a word of 7 to 40 hex digits: a commit hash when it has
	// both a letter and a digit (a decimal number is not one).
	hexWord = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	// outside names files of the project's working space that are not in
	// this repository.
	outside = regexp.MustCompile(`\bDESIGN\.md|\bSTYLE\.md|\bseeds/|\.\./shared\b|\bshared/(CONTRACT|DESIGN|STYLE)`)
)

// labNotes returns what in text reads as a lab note: a task number, a
// source post by number, a commit hash, a file outside the repository.
func labNotes(text string) []string {
	var out []string
	out = append(out, labNote.FindAllString(text, -1)...)
	for _, w := range hexWord.FindAllString(text, -1) {
		if strings.ContainsAny(w, "abcdef") && strings.ContainsAny(w, "0123456789") {
			out = append(out, w)
		}
	}
	return append(out, outside.FindAllString(text, -1)...)
}

// TestDocumentsSpeakOfTheProduct: README.md and docs/ name rules by what
// they do — no task numbers, no source posts by number, no commit hashes,
// no files that are not in this repository.
func TestDocumentsSpeakOfTheProduct(t *testing.T) {
	for _, doc := range append(documents(t), "../clients/typescript/README.md", "policy.example.yaml") {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			if n := labNotes(line); len(n) > 0 {
				t.Errorf("%s:%d: %q reads as a lab note: %s", doc, i+1, n, line)
			}
		}
	}
}

// TestCommandOutputSpeaksOfTheProduct: no string a command or service
// can print (the string literals of the code outside tests) cites a task
// number, a source post or a file that is not in this repository.
func TestCommandOutputSpeaksOfTheProduct(t *testing.T) {
	fset := token.NewFileSet()
	for _, dir := range []string{"../cmd", "../internal", "../pkg", "../jetstream"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				for line := range strings.Lines(s) {
					if m := append(labNote.FindAllString(line, -1), outside.FindAllString(line, -1)...); len(m) > 0 {
						t.Errorf("%s: a string cites %q: say what the rule does: %s", fset.Position(lit.Pos()), m, strings.TrimSpace(line))
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

var (
	fence  = regexp.MustCompile("(?ms)^```(go|ts)\n(.*?)^```")
	fileMD = regexp.MustCompile(`\]\(([^)#\s]+\.(?:go|ts))\)`)
)

// codeLines is the code's lines without indentation, blank lines and
// imports (README's imports name the published package, the compiled
// file a relative path).
func codeLines(code string) []string {
	var out []string
	for line := range strings.Lines(code) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "import ") {
			continue
		}
		out = append(out, line)
	}
	return out
}

// contains reports whether want appears in lines as one run.
func contains(lines, want []string) bool {
	for i := 0; i+len(want) <= len(lines); i++ {
		ok := true
		for j := range want {
			if lines[i+j] != want[j] {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestReadmeCodeIsCompiledCode: each Go and TypeScript block of README.md
// is, line for line, part of the file the last Go or TypeScript link
// before it names — an example `go vet` and `npm test` compile — so the
// code a newcomer copies builds against today's API.
func TestReadmeCodeIsCompiledCode(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	blocks := fence.FindAllStringSubmatchIndex(text, -1)
	langs := map[string]bool{}
	for _, b := range blocks {
		lang, code := text[b[2]:b[3]], text[b[4]:b[5]]
		langs[lang] = true
		links := fileMD.FindAllStringSubmatch(text[:b[0]], -1)
		if len(links) == 0 {
			t.Errorf("README's %s block has no link to the file that holds it", lang)
			continue
		}
		file := links[len(links)-1][1]
		src, err := os.ReadFile(filepath.Join("..", file))
		if err != nil {
			t.Errorf("README's %s block: %v", lang, err)
			continue
		}
		if !contains(codeLines(string(src)), codeLines(code)) {
			t.Errorf("README's %s block is not the code of %s: make them the same", lang, file)
		}
	}
	if !langs["go"] || !langs["ts"] {
		t.Errorf("README shows code in %v, want Go and TypeScript", langs)
	}
}

// testNames finds the test, fuzz and benchmark names a document cites.
var testNames = regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+)(…)?`")

// TestDocumentsCiteTestsThatExist: each test GUARANTEES.md and
// PERFORMANCE.md name as the evidence of a promise or a figure is a
// function of the repository ("Name…" a prefix of one), so a promise
// cannot outlive the test that held it.
func TestDocumentsCiteTestsThatExist(t *testing.T) {
	funcs := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				funcs[fn.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range []string{"GUARANTEES.md", "PERFORMANCE.md"} {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		cited := 0
		for _, m := range testNames.FindAllStringSubmatch(string(data), -1) {
			cited++
			name, prefix := m[1], m[2] != ""
			found := funcs[name]
			for f := range funcs {
				if found || !prefix {
					break
				}
				found = strings.HasPrefix(f, name)
			}
			if !found {
				t.Errorf("%s cites %s, which no test file declares", doc, m[0])
			}
		}
		if doc == "GUARANTEES.md" && cited < 50 {
			t.Errorf("GUARANTEES.md cites %d tests; the test no longer reads its table", cited)
		}
	}
}
