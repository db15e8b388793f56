package sim

import (
	"bufio"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// TestParseInputReadsOutcomesInOnePass: ParseInput's one-pass read of an
// outcome gives what reading the type and then the record gives, input and
// error alike — for the usual lines, the odd spellings of "type" JSON
// allows, and what does not decode.
func TestParseInputReadsOutcomesInOnePass(t *testing.T) {
	// The one pass relies on this: a field named "type" (any case) would
	// take the line's type in the two-pass read and not in the one pass.
	for f := range reflect.TypeFor[events.Outcome]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if strings.EqualFold(name, "type") {
			t.Fatalf("events.Outcome has a field %s named %q: outcomeLine no longer decodes as two passes do", f.Name, name)
		}
	}
	lines := []string{
		`{"type":"outcome","id":"o-1","at":"2026-03-01T00:00:00Z","agent":"a","session":"s","provider":"p","turn":1,"step":1,"ok":true,"status":200}`,
		`{"id":"o-2","at":"2026-03-01T00:00:01Z","agent":"a","provider":"p","status":429,"headers":{"retry-after-ms":"1200"}}`,
		`{"type":"outcome","id":"o-3","at":1772323200000,"agent":"a","provider":"p","status":0,"transport_error":"read tcp: ECONNRESET"}`,
		`{"type":"boundary","at":"2026-03-01T00:00:00Z","agent":"a","session":"s","segment":1}`,
		`{"TYPE":"boundary","at":"2026-03-01T00:00:00Z","agent":"a","session":"s","segment":1}`,
		`{"Type":"outcome","id":"o-4","at":"2026-03-01T00:00:00Z","agent":"a","provider":"p"}`,
		`{"type":"outcome","type":"boundary","at":"2026-03-01T00:00:00Z","agent":"a","session":"s","segment":1}`,
		`{"type":"boundary","type":"outcome","id":"o-5","at":"2026-03-01T00:00:00Z","agent":"a","provider":"p"}`,
		`{"type" : "tick", "at":"2026-03-01T00:00:00Z"}`,
		`{"type":null,"id":"o-6","at":"2026-03-01T00:00:00Z","agent":"a","provider":"p"}`,
		`{"type":"\u006futcome","id":"o-7","at":"2026-03-01T00:00:00Z","agent":"a","provider":"p"}`,
		`{"type":5,"id":"o-8"}`,
		`{"type":"outcome","id":"o-9","at":"not a time"}`,
		`{"type":"outcome","id":"o-10","status":"200"}`,
		`{"type":"outcome","id":"o-11","headers":["x"]}`,
		`{"type":"route","at":"2026-03-01T00:00:00Z"}`,
		`{"type":"sync","id":7}`,
		`{"type":"nope"}`,
		`{"type":"outcome"`,
		`null`,
		`[]`,
		`"outcome"`,
		``,
		`{}`,
	}
	f, err := os.Open("testdata/recovery-8h.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	for i, l := range lines {
		got, gerr := ParseInput([]byte(l), i+1)
		want, werr := parseInput([]byte(l), i+1)
		if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
			t.Errorf("%s:\n error %v\n want %v", l, gerr, werr)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n read %+v\n want %+v", l, got, want)
		}
	}
}
