package shadow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/cli/clitest"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// TestShadowOfARangeOfBusHistory: shadow reads exactly the range it is
// given, by stream sequence (--start-seq, --end-seq) and by store time
// (--start-time, --until, --since), and leaves nothing behind: the stream
// holds what it held and has no consumer afterwards.
//
// Two retry budgets fail on the bus, A four times (seqs a1..a4), then B
// three times; a stored message that is not an outcome sits between them.
// Under max_retries 1 instead of 10, every failure of a budget after its
// first changes from retry to give_up, so how many differ says where the
// replay started: from a3, a3 is the first failure shadow sees (retry 1
// under both) and only a4 differs.
func TestShadowOfARangeOfBusHistory(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, 2*time.Minute)
	base := clitest.WriteFile(t, "base.yaml", "retry:\n  max_retries: 10\n")
	next := clitest.WriteFile(t, "new.yaml", "retry:\n  max_retries: 1\n")
	t0 := time.Now().Add(-time.Hour).UTC()
	publish := func(id string, turn int) uint64 {
		t.Helper()
		return clitest.PublishOutcome(t, b.Ctx, b.JS, &events.Outcome{ID: id, At: events.At(t0), Agent: "bot", Provider: "openai", Status: 500, Body: "upstream error", Turn: turn, Step: 1})
	}
	var a, bb []uint64
	for i := range 4 {
		a = append(a, publish(fmt.Sprintf("a%d", i+1), 1))
	}
	junk, err := b.JS.Publish(b.Ctx, events.OutcomeSubject("openai", "bot"), []byte("not msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	// Store times: everything up to here is stored before mid, the rest
	// at or after it (one server, one clock; stored times are the
	// server's wall clock, mid is read after the acks came back).
	mid := time.Now()
	for i := range 3 {
		bb = append(bb, publish(fmt.Sprintf("b%d", i+1), 2))
	}
	stream, err := b.JS.Stream(b.Ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	before, err := stream.Info(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}

	type want struct {
		outcomes, differ, skipped int
		first, last               uint64
		ids                       []string
	}
	seq := func(n uint64) string { return strconv.FormatUint(n, 10) }
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	for _, tc := range []struct {
		name string
		args []string
		want want
	}{
		{"all", nil, want{7, 5, 1, a[0], bb[2], []string{"a2", "a3", "a4", "b2", "b3"}}},
		{"from a3", []string{"--start-seq", seq(a[2])}, want{5, 3, 1, a[2], bb[2], []string{"a4", "b2", "b3"}}},
		{"a2 to a3", []string{"--start-seq", seq(a[1]), "--end-seq", seq(a[2])}, want{2, 1, 0, a[1], a[2], []string{"a3"}}},
		{"to the junk", []string{"--end-seq", seq(junk.Sequence)}, want{4, 3, 1, a[0], junk.Sequence, []string{"a2", "a3", "a4"}}},
		{"from b1", []string{"--start-seq", seq(bb[0])}, want{3, 2, 0, bb[0], bb[2], []string{"b2", "b3"}}},
		{"stored from mid", []string{"--start-time", ts(mid)}, want{3, 2, 0, bb[0], bb[2], []string{"b2", "b3"}}},
		{"stored until mid", []string{"--until", ts(mid)}, want{4, 3, 1, a[0], junk.Sequence, []string{"a2", "a3", "a4"}}},
		{"stored in the last hour", []string{"--since", "1h"}, want{7, 5, 1, a[0], bb[2], []string{"a2", "a3", "a4", "b2", "b3"}}},
		{"stored after the last", []string{"--start-time", ts(time.Now().Add(time.Minute))}, want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"--server", b.Srv.ClientURL(), "--base", base, "--policy", next}, tc.args...)
			if code := run(args, nil, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			var ids []string
			for _, l := range lines[:len(lines)-1] {
				var d Diff
				if err := json.Unmarshal([]byte(l), &d); err != nil || d.Type != "diff" {
					t.Fatalf("line %s: want a diff", l)
				}
				if d.Base == nil || d.Base.Action != events.ActionRetry || d.New == nil || d.New.Action != events.ActionGiveUp {
					t.Errorf("diff %s: want retry → give_up", l)
				}
				ids = append(ids, d.OutcomeID)
			}
			var sum Summary
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil || sum.Type != "summary" {
				t.Fatalf("last line %s: want the summary", lines[len(lines)-1])
			}
			got := want{sum.Outcomes, sum.Differ, sum.Skipped, sum.FirstSeq, sum.LastSeq, ids}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("read %+v, want %+v (a=%v junk=%d b=%v)", got, tc.want, a, junk.Sequence, bb)
			}
			if sum.Changes["retry→give_up"] != tc.want.differ {
				t.Errorf("changes %v, want retry→give_up %d", sum.Changes, tc.want.differ)
			}
		})
	}

	after, err := stream.Info(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.Msgs != before.State.Msgs || after.State.LastSeq != before.State.LastSeq || after.State.Consumers != before.State.Consumers {
		t.Errorf("after shadow: %d messages (last %d), %d consumers; before: %d (last %d), %d",
			after.State.Msgs, after.State.LastSeq, after.State.Consumers, before.State.Msgs, before.State.LastSeq, before.State.Consumers)
	}

	for _, bad := range [][]string{
		{"--start-seq", seq(a[2]), "--end-seq", seq(a[1])},
		{"--start-time", ts(mid), "--until", ts(mid.Add(-time.Second))},
		{"--input", "-", "--end-seq", "3"},
		{"--until", "yesterday"},
	} {
		var o, e bytes.Buffer
		if code := run(append([]string{"--server", b.Srv.ClientURL(), "--policy", next}, bad...), strings.NewReader(""), &o, &e); code != 2 || e.Len() == 0 {
			t.Errorf("shadow %v: exit %d, stderr %q; want 2 and the reason", bad, code, e.String())
		}
	}
}
