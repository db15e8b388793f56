package testcluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Advisory subjects of JetStream leader elections in an account.
const (
	streamElectedSubject   = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.>"
	consumerElectedSubject = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.>"
)

// Elections counts the stream and consumer leader elections the cluster
// announces (JetStream's LEADER_ELECTED advisories), for the figures a
// cluster test reports. Advisories published while the watching
// connection is reconnecting are missed: connect it to a node the test
// does not kill.
type Elections struct {
	mu        sync.Mutex
	streams   map[string]int
	consumers map[string]int
	subs      []*nats.Subscription
}

// WatchElections subscribes on nc until Stop.
func WatchElections(nc *nats.Conn) (*Elections, error) {
	e := &Elections{streams: map[string]int{}, consumers: map[string]int{}}
	for _, w := range []struct {
		subject string
		into    map[string]int
		prefix  string
	}{
		{streamElectedSubject, e.streams, "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED."},
		{consumerElectedSubject, e.consumers, "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED."},
	} {
		sub, err := nc.Subscribe(w.subject, func(m *nats.Msg) {
			e.mu.Lock()
			w.into[strings.TrimPrefix(m.Subject, w.prefix)]++
			e.mu.Unlock()
		})
		if err != nil {
			e.Stop()
			return nil, fmt.Errorf("testcluster: watch %s: %w", w.subject, err)
		}
		e.subs = append(e.subs, sub)
	}
	if err := nc.Flush(); err != nil {
		e.Stop()
		return nil, fmt.Errorf("testcluster: watch elections: %w", err)
	}
	return e, nil
}

// Stop ends the watch.
func (e *Elections) Stop() {
	for _, s := range e.subs {
		_ = s.Unsubscribe()
	}
}

// Streams is the number of stream leader elections seen.
func (e *Elections) Streams() int { return e.total(e.streams) }

// Consumers is the number of consumer leader elections seen.
func (e *Elections) Consumers() int { return e.total(e.consumers) }

// Stream is the number of leader elections of one stream seen.
func (e *Elections) Stream(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.streams[name]
}

func (e *Elections) total(m map[string]int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// String reads "12 stream, 31 consumer leader elections (FAILBUS_RETRIES 2, ...)".
func (e *Elections) String() string {
	e.mu.Lock()
	names := make([]string, 0, len(e.streams))
	for k := range e.streams {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s %d", k, e.streams[k]))
	}
	e.mu.Unlock()
	return fmt.Sprintf("%d stream, %d consumer leader elections (streams: %s)", e.Streams(), e.Consumers(), strings.Join(parts, ", "))
}

// StreamLeader returns the server name of the current leader of stream,
// as JetStream reports it ("" while there is none).
func StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", fmt.Errorf("testcluster: stream %s: %w", stream, err)
	}
	if ci := s.CachedInfo().Cluster; ci != nil {
		return ci.Leader, nil
	}
	return "", nil
}
