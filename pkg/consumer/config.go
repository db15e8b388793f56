package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Defaults of Config, exported so callers and docs can name them.
const (
	// defaultConcurrency handles one message at a time, which keeps stream
	// order (see Config.Concurrency).
	defaultConcurrency = 1
	// defaultMaxDeliver is the last delivery on which the handler runs when
	// the consumer itself has no limit (MaxDeliver -1); with a limit, the
	// runner stops one short of it (see Config.MaxDeliver).
	defaultMaxDeliver = 10
	// DefaultFetchWait is how long one pull request waits for messages. A
	// shutdown waits at most this long for the outstanding pull to end.
	DefaultFetchWait = 2 * time.Second
	// defaultMaxInFlight is how many inputs a runner holds at most between
	// fetching and settling them (handlers running, outputs being stored,
	// acks), unless the consumer's MaxAckPending is lower.
	defaultMaxInFlight = 256
	// defaultFetchBatch is how many messages one pull asks for at least
	// (see Config.FetchBatch).
	defaultFetchBatch = 64
	// DefaultDrainTimeout is how long in-flight handlers may keep running
	// after Run's context is cancelled before their own context is.
	DefaultDrainTimeout = 30 * time.Second
)

// defaultBackoff is the redelivery delay after a handler error, indexed by
// delivery count (the last entry repeats): 1s, 5s, 30s, 1m, 5m. Its longest
// step equals topology.MaxRedeliveryDelay, which the streams' duplicate
// window is built to exceed.
func defaultBackoff() []time.Duration {
	return []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute}
}

// ErrInvalidConfig is wrapped by every error New returns for a bad Config,
// so callers (flags parsing, failbus dev) can tell a usage error from a
// server problem with errors.Is.
var ErrInvalidConfig = errors.New("consumer: invalid config")

// Config configures a Runner. Every field documents its default; the zero
// value of an optional field selects it.
type Config struct {
	// Service names the service. It labels metrics and logs, names the
	// dead-letter subject failbus.dlq.<Service>, and prefixes the
	// Nats-Msg-Id of every output and dead letter. Required; it must be a
	// valid subject token (letters, digits, '_' and '-').
	Service string

	// Stream is the stream the durable consumer reads. Defaults to the
	// stream the failbus topology (package topology) declares for Consumer;
	// required when Consumer is not a topology consumer.
	Stream string

	// Consumer is the name of the durable pull consumer. Defaults to
	// Service. Replicas of a service share it, so each message goes to one
	// of them.
	Consumer string

	// ConsumerConfig, when set, is created on the server (or updated to
	// match) before consuming, with Durable and Name set to Consumer. Leave
	// it nil for the topology's consumers, which topology.Apply creates; set
	// it for a consumer of your own. When nil, Run fails if the consumer
	// does not exist.
	ConsumerConfig *jetstream.ConsumerConfig

	// Decode makes the runner decode every message with events.Decode into
	// Msg.Value before calling the handler. A message that does not decode
	// or validate is dead-lettered with the decoder's reason (it names the
	// field) and the handler never sees it. Defaults to false: the handler
	// gets raw bytes.
	Decode bool

	// Limits bound what one input may cost to decode (nesting depth,
	// entries, values, string and payload size; see events.Limits). Every
	// msgpack input (Content-Type application/msgpack, or no Content-Type
	// on a failbus.> subject) is pre-scanned against them before the
	// handler runs, and one beyond a limit is dead-lettered with the limit
	// in the reason. Decode decodes within them. The zero value selects the
	// events defaults (events.DefaultMaxDepth, ...). A handler that
	// decodes by itself with events.Decode uses the defaults, so raising a
	// limit above its default takes effect only with Decode.
	Limits events.Limits

	// Concurrency is how many handlers run at the same time (workers).
	// Defaults to 1, which handles messages in stream
	// order, apart from redeliveries. Above 1 without Key there is no order
	// between messages; with Key, messages with equal keys are handled one
	// at a time, in delivery order. A worker does not wait for its outputs
	// to be stored (the runner does, before acknowledging), so a handler
	// that does no I/O of its own needs few workers.
	Concurrency int

	// Key, when set, orders messages by key: messages with equal keys are
	// handled one at a time, in delivery order, so a handler whose state
	// is per key (a budget, a provider, a segment) never races itself on
	// it within one process; a message whose key has nothing in a worker
	// goes to the first free worker, never queued behind another key's
	// (keys are not hashed onto workers). An empty key orders nothing. It
	// is called on the pull's goroutine with the message before decoding
	// (Value is nil; a Key that decodes may leave the value there for the
	// handler): keep it cheap, and never block. Defaults to nil: any free
	// worker takes any message.
	Key func(m *Msg) string

	// MaxInFlight bounds the inputs held between fetching and settling:
	// waiting for a worker, being handled, outputs being stored. The
	// runner stores a handled input's outputs with async publishes and
	// acknowledges it once every one is stored, without holding up its
	// worker, so this is the pipeline's window. It is further bounded by
	// the consumer's MaxAckPending, which is the backpressure. Defaults to
	// 256.
	MaxInFlight int

	// MaxDeliver is the last delivery on which the handler runs: a message
	// whose handler still fails then (an error or Retry) is dead-lettered
	// instead of redelivered. Defaults to one less than the consumer's own
	// MaxDeliver (9 for the topology's 10), or 10 when the
	// consumer has no limit. The delivery left over is a spare: the server
	// stops delivering after its MaxDeliver, so when the process dies during
	// the handler's last delivery, the spare redelivery (after AckWait) is
	// dead-lettered at once, without running the handler, instead of being
	// dropped by the server without a trace. It must not exceed the
	// consumer's MaxDeliver (Run checks this); setting it equal gives up
	// the spare, and Run logs a warning.
	MaxDeliver int

	// Backoff is the redelivery delay after a handler error: delivery n
	// waits Backoff[n-1], and the last entry repeats. Defaults to
	// defaultBackoff(). Every entry must be positive and at most
	// topology.MaxRedeliveryDelay, so that outputs re-published by a
	// redelivery still fall inside the duplicate window. Retry(after) uses
	// its own delay instead.
	Backoff []time.Duration

	// FetchBatch is how many messages one pull request asks for at most;
	// a pull never asks for more than the window (MaxInFlight) has room
	// for. Defaults to the larger of Concurrency and 64,
	// capped at MaxInFlight. Fetched messages wait for a free handler
	// while their AckWait runs; the runner keeps them alive with a progress
	// signal for at most ten AckWaits, so keep MaxInFlight × handler time /
	// Concurrency well below that.
	FetchBatch int

	// FetchWait is how long one pull request waits for messages before the
	// runner asks again. Defaults to DefaultFetchWait (2s). A shutdown waits
	// at most this long for the outstanding pull. It also sets how long
	// nats.go's Fetch listens for the pull's next message: FetchWait plus
	// one second after the previous one. A message the server delivered
	// to the pull that reaches the process later than that (a starved
	// process, a message of several MiB) is dropped by the client and
	// redelivered after AckWait: delayed, never lost or doubled. Short
	// waits (tests use 100-200 ms) leave little of that margin.
	FetchWait time.Duration

	// DrainTimeout is how long in-flight handlers may run after Run's
	// context is cancelled; then their context is cancelled too, and a
	// handler that returns the context's error is handed back for immediate
	// redelivery. Defaults to DefaultDrainTimeout (30s). A drain whose
	// writes are not being stored (Healthy says ErrCannotStore) does not
	// wait: in-flight work is left for redelivery at once.
	DrainTimeout time.Duration

	// StoreCheckEvery is how long a runner may see none of its writes go
	// either way (it is idle) before it writes a store check record to
	// failbus.storecheck.<service> to find out whether it can still store
	// (store.go); Healthy fails while it cannot. The stream
	// FAILBUS_STORECHECK of the failbus topology holds those subjects, and
	// the failbus services set DefaultStoreCheckEvery (15s). 0, the
	// default: never (a runner on another topology, where nothing would
	// store the check).
	StoreCheckEvery time.Duration

	// Middleware wraps the handler, the first entry outermost. Recover is
	// always applied outside all of them, so a panic anywhere becomes a
	// dead letter. Defaults to none.
	Middleware []Middleware

	// Logger receives one structured line per notable event (start, stop,
	// retry, dead letter, failure; acks at debug level). It never logs
	// message bodies. The zero value logs nothing.
	Logger zerolog.Logger

	// Registerer receives the runner's metrics. Defaults to a new
	// *prometheus.Registry, returned by Runner.Gatherer. Several runners may
	// share one Registerer: their series differ by the service label.
	Registerer prometheus.Registerer
}

// resolve fills defaults and validates. It does no I/O.
func (c Config) resolve() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if c.Service == "" {
		return bad("Service is required")
	}
	if events.Token(c.Service) != c.Service {
		return bad("Service %q: only letters, digits, '_' and '-' are allowed (it is a subject token)", c.Service)
	}
	if c.Consumer == "" {
		c.Consumer = c.Service
	}
	if c.Stream == "" {
		stream, _, ok := topology.Consumer(c.Consumer)
		if !ok {
			return bad("Stream is required: consumer %q is not in the failbus topology", c.Consumer)
		}
		c.Stream = stream
	}
	switch {
	case c.Concurrency < 0:
		return bad("Concurrency %d: must be positive (0 selects %d)", c.Concurrency, defaultConcurrency)
	case c.Concurrency == 0:
		c.Concurrency = defaultConcurrency
	}
	if c.MaxDeliver < 0 {
		return bad("MaxDeliver %d: must be positive (0 selects the consumer's)", c.MaxDeliver)
	}
	if c.Backoff == nil {
		c.Backoff = defaultBackoff()
	}
	if len(c.Backoff) == 0 {
		return bad("Backoff: needs at least one delay (nil selects the default)")
	}
	for i, d := range c.Backoff {
		if d <= 0 || d > topology.MaxRedeliveryDelay {
			return bad("Backoff[%d] %v: must be positive and at most %v", i, d, topology.MaxRedeliveryDelay)
		}
	}
	c.Backoff = append([]time.Duration(nil), c.Backoff...)
	switch {
	case c.MaxInFlight < 0:
		return bad("MaxInFlight %d: must be positive (0 selects %d)", c.MaxInFlight, defaultMaxInFlight)
	case c.MaxInFlight == 0:
		c.MaxInFlight = defaultMaxInFlight
	}
	switch {
	case c.FetchBatch < 0:
		return bad("FetchBatch %d: must be positive (0 selects max(Concurrency, %d))", c.FetchBatch, defaultFetchBatch)
	case c.FetchBatch == 0:
		c.FetchBatch = min(max(c.Concurrency, defaultFetchBatch), c.MaxInFlight)
	}
	if c.StoreCheckEvery < 0 {
		return bad("StoreCheckEvery %v: must not be negative (0: never)", c.StoreCheckEvery)
	}
	switch {
	case c.FetchWait < 0:
		return bad("FetchWait %v: must be positive", c.FetchWait)
	case c.FetchWait == 0:
		c.FetchWait = DefaultFetchWait
	case c.FetchWait < 10*time.Millisecond:
		return bad("FetchWait %v: must be at least 10ms", c.FetchWait)
	}
	switch {
	case c.DrainTimeout < 0:
		return bad("DrainTimeout %v: must be positive", c.DrainTimeout)
	case c.DrainTimeout == 0:
		c.DrainTimeout = DefaultDrainTimeout
	}
	for i, mw := range c.Middleware {
		if mw == nil {
			return bad("Middleware[%d] is nil", i)
		}
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return c, nil
}

// backoff is the nak delay after the delivered-th delivery failed.
func (c *Config) backoff(delivered int) time.Duration {
	i := max(delivered-1, 0)
	if i >= len(c.Backoff) {
		i = len(c.Backoff) - 1
	}
	return c.Backoff[i]
}
