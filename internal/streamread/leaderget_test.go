package streamread_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/streamread"
)

// TestLeaderGet reads single messages through the stream's JSON API: by
// sequence, the next on a subject from a sequence or a time, the last on
// a subject, each with its headers; a message that is not there is the
// not-found sentinel itself, and a stream that is not there the server's
// error.
func TestLeaderGet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "LG", Subjects: []string{"lg.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	var before time.Time
	for i, subj := range []string{"lg.a", "lg.b", "lg.a", "lg.b"} {
		if i == 2 {
			before = time.Now()
			time.Sleep(10 * time.Millisecond) // a store time strictly after before
		}
		h := nats.Header{}
		h.Set("X-N", fmt.Sprint(i+1))
		if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: subj, Header: h, Data: fmt.Appendf(nil, "m%d", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	text := func(m *jetstream.RawStreamMsg, err error) string {
		switch {
		case err == jetstream.ErrMsgNotFound: //nolint:errorlint // the sentinel itself is the promise
			return "not found"
		case err != nil:
			return "error: " + err.Error()
		}
		return fmt.Sprintf("%s #%d %s X-N=%s", m.Subject, m.Sequence, m.Data, m.Header.Get("X-N"))
	}
	for _, tc := range []struct {
		name string
		q    streamread.MsgQuery
		want string
	}{
		{"by sequence", streamread.MsgQuery{Seq: 2}, "lg.b #2 m2 X-N=2"},
		{"next on a subject", streamread.MsgQuery{Seq: 2, NextFor: "lg.a"}, "lg.a #3 m3 X-N=3"},
		{"next on a wildcard", streamread.MsgQuery{Seq: 4, NextFor: "lg.*"}, "lg.b #4 m4 X-N=4"},
		{"next from a time", streamread.MsgQuery{StartTime: &before, NextFor: "lg.b"}, "lg.b #4 m4 X-N=4"},
		{"last on a subject", streamread.MsgQuery{LastFor: "lg.a"}, "lg.a #3 m3 X-N=3"},
		{"nothing past the end", streamread.MsgQuery{Seq: 5, NextFor: "lg.a"}, "not found"},
		{"nothing on a subject", streamread.MsgQuery{LastFor: "lg.none"}, "not found"},
	} {
		if got := text(streamread.LeaderGet(b.ctx, b.js, "LG", tc.q)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	_, err := streamread.LeaderGet(b.ctx, b.js, "NOPE", streamread.MsgQuery{Seq: 1})
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamNotFound {
		t.Errorf("a stream that is not there: %v, want the server's stream-not-found", err)
	}
}
