package streamread_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/streamread"
)

// lastReaderStream creates stream name on name.> (with direct gets or
// without) and stores a few messages: two on .a, one on .b, and one on .c
// whose publisher set the headers the server sets on a direct get's
// answer, and a Status.
// It returns the stream and, per subject, its last message as the
// reader must answer it (lastText).
func lastReaderStream(t *testing.T, b *bundle, name string, direct bool) (jetstream.Stream, map[string]string) {
	t.Helper()
	st, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowDirect: direct})
	if err != nil {
		t.Fatal(err)
	}
	forged := nats.Header{}
	forged.Set(jetstream.SubjectHeader, name+".a")
	forged.Set(jetstream.SequenceHeader, "1")
	forged.Set(jetstream.TimeStampHeaer, "2001-01-01T00:00:00Z")
	forged.Set("Status", "404")
	want := map[string]string{}
	for _, m := range []*nats.Msg{
		{Subject: name + ".a", Data: []byte("a1")},
		{Subject: name + ".b", Data: []byte("b1")},
		{Subject: name + ".a", Data: []byte("a2")},
		{Subject: name + ".c", Data: []byte("c1"), Header: forged},
	} {
		ack, err := b.js.PublishMsg(b.ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		want[m.Subject] = fmt.Sprintf("%s #%d %q", m.Subject, ack.Sequence, m.Data)
	}
	return st, want
}

// wantLast is the answer for subject: its last message, or not found.
func wantLast(want map[string]string, subject string) string {
	if w, ok := want[subject]; ok {
		return w
	}
	return "not found"
}

// lastReaderOn starts a server with stream name (lastReaderStream) and a
// LastReader of it that reports to counts: the server, the reader, its
// counts and the answers it must give.
func lastReaderOn(t *testing.T, name string, direct bool) (*bundle, *streamread.LastReader, *readCounts, map[string]string) {
	t.Helper()
	b := setup(t)
	st, want := lastReaderStream(t, b, name, direct)
	counts := &readCounts{}
	r := streamread.NewLastReader(b.js, st, counts.options())
	t.Cleanup(r.Close)
	return b, r, counts, want
}

// checkLast checks each read's answer got[i] of subjects[i] against want.
func checkLast(t *testing.T, what string, subjects, got []string, want map[string]string) {
	t.Helper()
	for i, s := range subjects {
		if w := wantLast(want, s); got[i] != w {
			t.Errorf("%sLast(%s) = %s, want %s", what, s, got[i], w)
		}
	}
}

// lastStats counts what a LastReader reported (its options): Batches
// multi_last requests sent, answering Batched reads; Alone reads sent in
// a request for their subject alone; Fallbacks reads sent alone because
// a batch read was unavailable; Leader reads sent to the stream's leader.
type lastStats struct {
	Batches, Batched, Alone, Fallbacks, Leader uint64
}

// readCounts collects lastStats through LastReaderOptions.
type readCounts struct {
	mu sync.Mutex
	st lastStats
}

func (c *readCounts) options() streamread.LastReaderOptions {
	return streamread.LastReaderOptions{
		OnReads: func(how string, n int) {
			c.mu.Lock()
			defer c.mu.Unlock()
			switch how {
			case streamread.ReadBatched:
				c.st.Batched += uint64(n)
			case streamread.ReadAlone:
				c.st.Alone += uint64(n)
			case streamread.ReadFallback:
				c.st.Fallbacks += uint64(n)
			case streamread.ReadLeader:
				c.st.Leader += uint64(n)
			}
		},
		OnBatch: func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.st.Batches++
		},
	}
}

func (c *readCounts) get() lastStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// readRounds reads subjects twice through readMany and checks every
// answer against want and, after each round, that batches multi_last
// requests were sent in all and every read so far fell back.
func readRounds(t *testing.T, b *bundle, r *streamread.LastReader, counts *readCounts, subjects []string, want map[string]string, batches uint64) {
	t.Helper()
	for round := range 2 {
		checkLast(t, fmt.Sprintf("round %d: ", round), subjects, readMany(t, b, r, subjects), want)
		if st := counts.get(); st.Batches != batches || st.Fallbacks != uint64((round+1)*len(subjects)) {
			t.Errorf("round %d: stats %+v, want %d batches tried, every read fallen back", round, st, batches)
		}
	}
}

// lastText is a read's result as a comparable line: subject, sequence
// and data, or that nothing is there. A message stored more than a minute
// ago (the forged time) is an error. Nothing there is the sentinel
// itself, as Last promises (unwrapped: see Last).
func lastText(m *jetstream.RawStreamMsg, err error) string {
	switch {
	case err == jetstream.ErrMsgNotFound: //nolint:errorlint // the sentinel itself is the promise
		return "not found"
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return "not found, wrapped: " + err.Error()
	case err != nil:
		return "error: " + err.Error()
	case time.Since(m.Time) > time.Minute:
		return "stored at " + m.Time.String()
	}
	return fmt.Sprintf("%s #%d %q", m.Subject, m.Sequence, m.Data)
}

// readMany holds the first read in flight (the leader's hook) until the
// others are queued behind it, then lets it go: each read's answer, in
// the order of subjects.
func readMany(t *testing.T, b *bundle, r *streamread.LastReader, subjects []string) []string {
	t.Helper()
	var once sync.Once
	release := make(chan struct{})
	streamread.HookLastTake(r, func() {
		once.Do(func() { <-release })
	}, nil)
	got := make([]string, len(subjects))
	var wg sync.WaitGroup
	wg.Go(func() { got[0] = lastText(r.Last(b.ctx, subjects[0])) })
	waitQueued(t, r, 1) // the first leads: its own read is queued until it takes the queue
	for i := 1; i < len(subjects); i++ {
		wg.Go(func() { got[i] = lastText(r.Last(b.ctx, subjects[i])) })
	}
	waitQueued(t, r, len(subjects))
	close(release)
	wg.Wait()
	return got
}

// waitQueued polls until n reads wait in r's queue.
func waitQueued(t *testing.T, r *streamread.LastReader, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for streamread.QueuedLastReads(r) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d reads queued, want %d", streamread.QueuedLastReads(r), n)
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}

// TestLastReaderBatchesConcurrentReads: reads asked for while one is in
// flight go in one multi_last, and each gets what GetLastMsgForSubject
// answers: the last message, by the server's headers (not the forged
// ones), or not found.
func TestLastReaderBatchesConcurrentReads(t *testing.T) {
	t.Parallel()
	b, r, counts, want := lastReaderOn(t, "LR", true)
	subjects := []string{"LR.b", "LR.a", "LR.c", "LR.none", "LR.a", "LR.b", "LR.other"}
	checkLast(t, "", subjects, readMany(t, b, r, subjects), want)
	if st := counts.get(); st != (lastStats{Batches: 1, Batched: uint64(len(subjects))}) {
		t.Errorf("stats %+v, want one batch of %d reads", st, len(subjects))
	}

	// Idle again: a read goes alone.
	for _, s := range []string{"LR.a", "LR.c", "LR.none"} {
		if got, w := lastText(r.Last(b.ctx, s)), wantLast(want, s); got != w {
			t.Errorf("alone: Last(%s) = %s, want %s", s, got, w)
		}
	}
	if st := counts.get(); st.Alone != 3 || st.Batches != 1 {
		t.Errorf("stats %+v, want the lone reads sent alone", st)
	}
	if _, err := r.Last(b.ctx, "LR.*"); err == nil {
		t.Error("a wildcard read: no error")
	}
}

// TestLastReaderFallsBackWithoutDirectGets: on a stream without direct
// gets the batch read is unavailable, so each read is sent alone (as
// GetLastMsgForSubject does it there) and answers the same.
func TestLastReaderFallsBackWithoutDirectGets(t *testing.T) {
	t.Parallel()
	b, r, counts, want := lastReaderOn(t, "LRN", false)
	// Without direct gets, no batch is ever tried.
	readRounds(t, b, r, counts, []string{"LRN.a", "LRN.b", "LRN.none", "LRN.c"}, want, 0)
}

// TestLastReaderReadsFromTheLeaderWhenTold: with Leader set, reads
// asked for at once are neither batched nor direct gets: each is the
// stream leader's (STREAM.MSG.GET, which a spy on the API subjects sees),
// and each answers what GetLastMsgForSubject would, the server's own
// subject and sequence (not the forged headers), or the not-found
// sentinel itself.
func TestLastReaderReadsFromTheLeaderWhenTold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, want := lastReaderStream(t, b, "LRL", true)
	counts := &readCounts{}
	opts := counts.options()
	opts.Leader = true
	r := streamread.NewLastReader(b.js, st, opts)
	t.Cleanup(r.Close)
	var direct, leader atomic.Int64
	for subj, n := range map[string]*atomic.Int64{"$JS.API.DIRECT.GET.LRL": &direct, "$JS.API.DIRECT.GET.LRL.>": &direct, "$JS.API.STREAM.MSG.GET.LRL": &leader} {
		if _, err := b.nc.Subscribe(subj, func(*nats.Msg) { n.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	subjects := []string{"LRL.b", "LRL.a", "LRL.c", "LRL.none", "LRL.a"}
	got := make([]string, len(subjects))
	var wg sync.WaitGroup
	for i, s := range subjects {
		wg.Go(func() { got[i] = lastText(r.Last(b.ctx, s)) })
	}
	wg.Wait()
	checkLast(t, "", subjects, got, want)
	if st := counts.get(); st != (lastStats{Leader: uint64(len(subjects))}) {
		t.Errorf("stats %+v, want every read the leader's", st)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if d, l := direct.Load(), leader.Load(); d != 0 || l != int64(len(subjects)) {
		t.Errorf("%d direct gets and %d STREAM.MSG.GET requests, want 0 and %d", d, l, len(subjects))
	}
}

// TestLastReaderCancelWhileQueued: a read whose context ends while it
// waits leaves the queue at once; the reads around it are answered.
func TestLastReaderCancelWhileQueued(t *testing.T) {
	t.Parallel()
	b, r, counts, want := lastReaderOn(t, "LRC", true)
	release := make(chan struct{})
	var once sync.Once
	streamread.HookLastTake(r, func() { once.Do(func() { <-release }) }, nil)
	var wg sync.WaitGroup
	var first, third string
	wg.Go(func() { first = lastText(r.Last(b.ctx, "LRC.a")) })
	waitQueued(t, r, 1)
	ctx, cancel := context.WithCancel(b.ctx)
	cancelled := make(chan error, 1)
	go func() {
		_, err := r.Last(ctx, "LRC.b")
		cancelled <- err
	}()
	waitQueued(t, r, 2)
	wg.Go(func() { third = lastText(r.Last(b.ctx, "LRC.c")) })
	waitQueued(t, r, 3)
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled read: %v, want context.Canceled", err)
	}
	waitQueued(t, r, 2)
	close(release)
	wg.Wait()
	for s, got := range map[string]string{"LRC.a": first, "LRC.c": third} {
		if w := wantLast(want, s); got != w {
			t.Errorf("Last(%s) = %s, want %s", s, got, w)
		}
	}
	if st := counts.get(); st.Batched != 2 {
		t.Errorf("stats %+v, want the two reads left batched", st)
	}
}

// TestLastReaderHandsTheLeadOn: reads asked for while a lone read is in
// flight wait for it, and the first of them then sends them all in one
// batch.
func TestLastReaderHandsTheLeadOn(t *testing.T) {
	t.Parallel()
	b, r, counts, want := lastReaderOn(t, "LRH", true)
	taken, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	streamread.HookLastTake(r, nil, func(int) { // the first read, taken, waits
		once.Do(func() {
			close(taken)
			<-release
		})
	})
	subjects := []string{"LRH.a", "LRH.b", "LRH.none", "LRH.c"}
	got := make([]string, len(subjects))
	var wg sync.WaitGroup
	wg.Go(func() { got[0] = lastText(r.Last(b.ctx, subjects[0])) })
	<-taken
	for i := 1; i < len(subjects); i++ {
		wg.Go(func() { got[i] = lastText(r.Last(b.ctx, subjects[i])) })
	}
	waitQueued(t, r, len(subjects)-1)
	close(release)
	wg.Wait()
	checkLast(t, "", subjects, got, want)
	if st := counts.get(); st != (lastStats{Alone: 1, Batches: 1, Batched: uint64(len(subjects) - 1)}) {
		t.Errorf("stats %+v, want the first read alone, then one batch of the %d queued behind it", st, len(subjects)-1)
	}
}

// TestLastReaderFallsBackWhenBatchesAreDenied: a connection allowed the
// lone direct get but not the batch request gets no answer to a batch (the
// server drops what it may not send); the reads go alone, answered right,
// and the next batch is not tried.
func TestLastReaderFallsBackWhenBatchesAreDenied(t *testing.T) {
	t.Parallel()
	srv := embedded.StartTestOpts(t, embedded.Options{Configure: func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "reader", Password: "reader", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{
					"$JS.API.INFO", "$JS.API.STREAM.INFO.LRD", "$JS.API.DIRECT.GET.LRD.>",
				}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		}
	}})
	connect := func(user string, opts ...jetstream.JetStreamOpt) (*nats.Conn, jetstream.JetStream) {
		nc, err := srv.Connect(nats.UserInfo(user, user))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	anc, ajs := connect("admin")
	_, want := lastReaderStream(t, &bundle{ctx: ctx, nc: anc, js: ajs}, "LRD", true)

	_, js := connect("reader", jetstream.WithDefaultTimeout(time.Second))
	st, err := js.Stream(ctx, "LRD")
	if err != nil {
		t.Fatal(err)
	}
	counts := &readCounts{}
	r := streamread.NewLastReader(js, st, counts.options())
	defer r.Close()
	b := &bundle{ctx: ctx, js: js}
	// One batch tried in the first round, none in the second.
	readRounds(t, b, r, counts, []string{"LRD.a", "LRD.b", "LRD.none", "LRD.c"}, want, 1)
}
