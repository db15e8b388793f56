package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Why a bus cannot take failbus traffic (Diagnose); errors.Is finds them.
var (
	// ErrNoJetStream: the server runs without JetStream.
	ErrNoJetStream = errors.New("no JetStream")
	// ErrNoTopology: a failbus stream is missing.
	ErrNoTopology = errors.New("failbus topology not applied")
)

// diagnoseTimeout bounds the requests Diagnose makes.
const diagnoseTimeout = 5 * time.Second

// NoAnswer reports whether err is how JetStream fails when the bus itself
// is missing something: nobody answered the request.
func NoAnswer(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, jetstream.ErrStreamNotFound)
}

// Diagnose says what the bus at server lacks for a command that needs
// streams: JetStream itself (ErrNoJetStream), or one of the streams, which
// means the failbus topology is not applied (ErrNoTopology); each error
// names the command that fixes it. It returns nil when neither is missing
// or when it cannot tell (a user not allowed to ask), so the caller keeps
// its own error.
func Diagnose(ctx context.Context, js jetstream.JetStream, server string, streams ...string) error {
	ctx, cancel := context.WithTimeout(ctx, diagnoseTimeout)
	defer cancel()
	_, err := js.AccountInfo(ctx)
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
		return fmt.Errorf("%w: the server at %s has no JetStream, where failbus keeps every stream: "+
			"run `failbus dev` (a server with JetStream and the topology), or start nats-server with -js "+
			"(or jetstream {} in its config) and then a failbus service against it, which applies the topology", ErrNoJetStream, server)
	}
	if err != nil {
		return nil
	}
	for _, s := range streams {
		_, err := js.Stream(ctx, s)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("%w: the failbus topology is not applied on %s (no stream %s): start any failbus service "+
				"against it once, which applies it at start (e.g. `scheduler --server %s`; --apply-topology is on by default), "+
				"or apply jetstream/ with the nats CLI (jetstream/README.md)", ErrNoTopology, server, s, server)
		}
	}
	return nil
}

// StreamsOf returns the failbus streams (jetstream/) that hold messages
// matching any of filters, in the topology's order: what Diagnose should
// look for before a command reads or writes those subjects.
func StreamsOf(filters ...string) []string {
	var out []string
	for _, s := range topology.Streams() {
		if slices.ContainsFunc(filters, func(f string) bool {
			return slices.ContainsFunc(s.Subjects, func(p string) bool { return events.SubjectsCollide(f, p) })
		}) {
			out = append(out, s.Name)
		}
	}
	return out
}
