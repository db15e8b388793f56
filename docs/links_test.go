package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdName   = regexp.MustCompile(`[A-Za-z0-9_./-]+\.md\b`)
	heading  = regexp.MustCompile(`(?m)^#+ (.+)$`)
	notSlug  = regexp.MustCompile(`[^a-z0-9 _-]`)
	tableRow = regexp.MustCompile("^\\s*\\| `(failbus\\.[^`]+)`[^|]*\\| (FAILBUS_[A-Z_]+) \\|")
)

// slug is GitHub's anchor of a heading.
func slug(h string) string {
	return strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
}

func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(string(doc), -1) {
		out[slug(m[1])] = true
	}
	return out
}

// documents are the Markdown files a user reads, relative to this folder.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append(docs, "../README.md", "../jetstream/README.md")
}

// Every link in README.md and docs/ leads somewhere that exists (file, and
// heading when it names one), and README names no Markdown file the
// repository does not have (it once sent readers to a design file that
// was not there).
func TestDocumentLinks(t *testing.T) {
	for _, doc := range documents(t) {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Dir(doc)
		for _, m := range mdLink.FindAllStringSubmatch(string(data), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(dir, file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s, which does not exist", doc, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[anchor] {
				t.Errorf("%s links to %s, but %s has no heading #%s", doc, target, path, anchor)
			}
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range mdName.FindAllString(string(readme), -1) {
		if _, err := os.Stat(filepath.Join("..", name)); err != nil {
			t.Errorf("README.md names %s, which is not in the repository", name)
		}
	}
}

// The README's short subject table agrees with the generated one: each
// subject is in the stream the topology puts it in.
func TestReadmeSubjectsTable(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for line := range strings.SplitSeq(string(readme), "\n") {
		m := tableRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		rows++
		if got := streamOf(asToken(m[1])); got != m[2] {
			t.Errorf("README: %s is in %s, the topology says %q", m[1], m[2], got)
		}
	}
	if rows < 5 {
		t.Errorf("found %d subject rows in README.md's table; the test no longer reads it", rows)
	}
}
