package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/durable"
)

// snapshotEvery is how often the runner reads its consumer's info (one
// request): the configuration and ack floor a recreation starts from.
const snapshotEvery = 10 * time.Second

// idleSnapshotEvery is how often it does so while no messages arrive, so
// the snapshot catches up with the acks once a burst is handled.
const idleSnapshotEvery = time.Second

// position remembers where the runner stands in its stream, so a durable
// deleted under it (an operator's slip, a script) can be recreated at the
// oldest message not yet settled instead of at the start of the stream,
// which would hand the whole history to the handler again.
type position struct {
	mu sync.Mutex
	// open holds the stream sequences delivered and not yet settled for
	// good (in flight, or handed back for redelivery).
	open map[uint64]struct{}
	// maxSeen is the highest stream sequence delivered.
	maxSeen uint64
	// ackFloor is the consumer's ack floor (stream sequence) at the last
	// snapshot: every message at or below it was acknowledged, by any
	// replica. 0 when unknown.
	ackFloor uint64
	// cfg is the consumer's configuration at the last snapshot.
	cfg jetstream.ConsumerConfig
}

func (p *position) delivered(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open == nil {
		p.open = map[uint64]struct{}{}
	}
	p.open[seq] = struct{}{}
	p.maxSeen = max(p.maxSeen, seq)
}

func (p *position) settled(seq uint64) {
	p.mu.Lock()
	delete(p.open, seq)
	p.mu.Unlock()
}

func (p *position) snapshot(info *jetstream.ConsumerInfo) {
	p.mu.Lock()
	p.ackFloor = info.AckFloor.Stream
	p.cfg = info.Config
	p.mu.Unlock()
}

// startSeq is the stream sequence a recreated consumer starts at: the
// oldest message this runner has open, or the one after the newest it saw,
// but never above the server's ack floor + 1 at the last snapshot (other
// replicas may hold messages this one never saw; the snapshot is at most
// snapshotEvery old, so messages settled since are handled again, their
// outputs deduplicated by the output streams). 1 is the start of the
// stream.
func (p *position) startSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.maxSeen + 1
	for seq := range p.open {
		start = min(start, seq)
	}
	return min(start, p.ackFloor+1)
}

// metaRecreated is the metadata key a recreated durable carries: when and
// why the runner recreated it. topology.Apply keeps such a consumer's start
// position instead of calling it incompatible.
const metaRecreated = durable.MetaRecreated

// consumerGone reports whether a pull error means the durable (or its
// stream) may no longer exist: later pulls find no responder. The
// "consumer deleted" a pending pull receives is not acted on: the server
// sends it before it has removed the consumer's files, and a consumer
// recreated under the same name at once would have its folder removed
// under it (seen with nats-server 2.15.2: its next update fails "open
// .../obs/<name>/meta.inf.tmp: no such file"). The runner pauses after
// that error like after any other, and the next pull, a second later,
// finds no responder.
func consumerGone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// heal checks whether the durable is gone and, if so, recreates it with its
// last known configuration (the topology's, as applied) starting at the
// oldest unsettled message. It returns the consumer to pull from, or an
// error when it could not heal (the stream itself is gone: that takes the
// topology to be applied again, which the runner does not do behind an
// operator's back).
func (r *Runner) heal(ctx context.Context, cause error) (jetstream.Consumer, error) {
	cons, err := r.js.Consumer(ctx, r.cfg.Stream, r.cfg.Consumer)
	if err == nil {
		return cons, nil // still there, or another replica recreated it
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("look up %s/%s: %w", r.cfg.Stream, r.cfg.Consumer, err)
	}
	r.pos.mu.Lock()
	cfg := r.pos.cfg
	r.pos.mu.Unlock()
	cfg.Durable, cfg.Name = r.cfg.Consumer, r.cfg.Consumer
	start := r.pos.startSeq()
	if start > 1 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = start
		cfg.OptStartTime = nil
	}
	meta := make(map[string]string, len(cfg.Metadata)+1)
	for k, v := range cfg.Metadata {
		meta[k] = v
	}
	meta[metaRecreated] = fmt.Sprintf("%s by %s at stream sequence %d", time.Now().UTC().Format(time.RFC3339), r.cfg.Service, max(start, 1))
	cfg.Metadata = meta
	cons, err = r.js.CreateConsumer(ctx, r.cfg.Stream, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return r.js.Consumer(ctx, r.cfg.Stream, r.cfg.Consumer) // a replica was first
	}
	if err != nil {
		return nil, fmt.Errorf("recreate %s/%s: %w", r.cfg.Stream, r.cfg.Consumer, err)
	}
	r.m.recreated.WithLabelValues(r.cfg.Service).Inc()
	r.log.Warn().Str("stream", r.cfg.Stream).Str("consumer", r.cfg.Consumer).Uint64("start_seq", max(start, 1)).
		AnErr("cause", cause).
		Msg("durable consumer was deleted: recreated from the topology at the oldest unsettled message")
	return cons, nil
}
