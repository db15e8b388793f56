package apisurface_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/failbus/failbus/internal/apisurface"
)

// TestAnAliasListsItsTargetsMembers: an alias of a type in an internal
// package of the same module lists the target's exported fields and
// methods under the alias's name (they are the alias's API), and nothing
// unexported; an alias of a type outside the module lists only itself.
func TestAnAliasListsItsTargetsMembers(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.26\n")
	write("internal/conf/conf.go", `package conf

type Config struct {
	Max    int
	hidden int
}

func (c Config) Validate() error { return nil }
func (c *Config) fill()          {}

type Other struct{ X int }
`)
	write("pub/pub.go", `package pub

import (
	"time"

	cf "example.com/m/internal/conf"
)

// Config is the section.
type Config = cf.Config

type Wait = time.Duration

func Load() Config { return Config{} }
`)
	got, err := apisurface.Dir(filepath.Join(root, "pub"), "pub")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"pub: field Config.Max int",
		"pub: func (Config) Validate() error",
		"pub: func Load() Config",
		"pub: type Config = cf.Config",
		"pub: type Wait = time.Duration",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}
