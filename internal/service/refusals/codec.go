package refusals

// The stored form of a refusal record (the value of one refusal-bucket key):
// msgpack with snake_case keys, or JSON with the same keys when an operator
// wrote it with `nats kv put`. The state is read conservatively: a value
// without a refusal count, or one that cannot be read at all, is a Legacy
// (frozen) state, never "no refusal".

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/pkg/events"
)

// stateWire is the stored form of refusal.State, in msgpack (KV) and JSON
// with the same snake_case keys. Refusals is a pointer so that a value
// without the key (written before counts existed, or by something else) is
// told apart from a count of zero: it decodes as Legacy, i.e. frozen.
type stateWire struct {
	Segment   string      `msgpack:"segment" json:"segment"`
	Provider  string      `msgpack:"provider" json:"provider"`
	Agent     string      `msgpack:"agent,omitempty" json:"agent,omitempty"`
	Refusals  *int        `msgpack:"refusals" json:"refusals"`
	RefusedAt events.Time `msgpack:"refused_at" json:"refused_at"`
	Increment string      `msgpack:"increment,omitempty" json:"increment,omitempty"`
	Rerenders int         `msgpack:"rerenders,omitempty" json:"rerenders,omitempty"`
}

// wireOf is the stored form of s; a Legacy state is written without a count
// (nil) so it stays frozen when read back.
func wireOf(s refusal.State) stateWire {
	w := stateWire{
		Segment: s.Segment, Provider: s.Provider, Agent: s.Agent,
		RefusedAt: s.RefusedAt, Increment: s.Increment, Rerenders: s.Rerenders,
	}
	if !s.Legacy {
		n := s.Refusals
		w.Refusals = &n
	}
	return w
}

// state reads the stored form. The refusal time may be a msgpack timestamp,
// epoch milliseconds or an RFC 3339 string (events.Time). A value without a
// refusal count decodes as Legacy (frozen).
func (w stateWire) state() refusal.State {
	s := refusal.State{
		Segment: w.Segment, Provider: w.Provider, Agent: w.Agent,
		RefusedAt: w.RefusedAt, Increment: w.Increment, Rerenders: w.Rerenders,
	}
	switch {
	case w.Refusals == nil || *w.Refusals < 0:
		s.Legacy = true // no usable count: frozen until a boundary
	case *w.Refusals > 0 && w.RefusedAt.IsZero():
		s.Refusals = *w.Refusals
		s.Legacy = true // a count without a time: nothing to measure from
	default:
		s.Refusals = *w.Refusals
	}
	return s
}

// EncodeState is the KV value of a state: msgpack, like everything on the
// bus.
func EncodeState(s refusal.State) ([]byte, error) {
	w := wireOf(s)
	b, err := msgpack.Marshal(&w)
	if err != nil {
		return nil, fmt.Errorf("encode refusal state %s/%s: %w", s.Segment, s.Provider, err)
	}
	return b, nil
}

// DecodeState reads a KV value written as msgpack or as JSON (an operator's
// `nats kv put`): JSON when the first non-space byte is '{', which can never
// start a msgpack map. A value that cannot be read at all still yields a
// usable answer: a Legacy (frozen) state, together with the error for the
// log. Unknown state is never read as "no refusal".
func DecodeState(data []byte) (refusal.State, error) {
	var w stateWire
	var err error
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		err = json.Unmarshal(t, &w)
	} else {
		err = msgpack.Unmarshal(data, &w)
	}
	if err != nil {
		return refusal.State{Legacy: true}, fmt.Errorf("decode refusal state: refusal state: %w", err)
	}
	return w.state(), nil
}

// recordExtras is the part of the stored record beyond the state:
// extra keys in the same map, so `nats kv get` shows one flat value and a
// reader that knows only refusal.State (DecodeState) still reads it.
type recordExtras struct {
	ProbeAgent string        `msgpack:"probe_agent,omitempty" json:"probe_agent,omitempty"`
	ProbeUntil events.Time   `msgpack:"probe_until,omitempty" json:"probe_until,omitempty"`
	Applied    []appliedWire `msgpack:"applied,omitempty" json:"applied,omitempty"`
}

type appliedWire struct {
	ID          string      `msgpack:"id" json:"id"`
	Agent       string      `msgpack:"agent,omitempty" json:"agent,omitempty"`
	Action      string      `msgpack:"action" json:"action"`
	Rerender    int         `msgpack:"rerender,omitempty" json:"rerender,omitempty"`
	Refusals    int         `msgpack:"refusals" json:"refusals"`
	Reprobes    int         `msgpack:"reprobes" json:"reprobes"`
	RefusedAt   events.Time `msgpack:"refused_at,omitempty" json:"refused_at,omitempty"`
	NextProbeAt events.Time `msgpack:"next_probe_at,omitempty" json:"next_probe_at,omitempty"`
	Frozen      bool        `msgpack:"frozen,omitempty" json:"frozen,omitempty"`
	Legacy      bool        `msgpack:"legacy,omitempty" json:"legacy,omitempty"`
	Notify      bool        `msgpack:"notify,omitempty" json:"notify,omitempty"`
	Peers       []string    `msgpack:"peers,omitempty" json:"peers,omitempty"`
}

// extrasOf is the part of r stored beside its state.
func extrasOf(r refusal.Record) recordExtras {
	x := recordExtras{ProbeAgent: r.Claim.Agent}
	if r.Claim.Agent != "" {
		x.ProbeUntil = events.At(r.Claim.Until)
	}
	for _, a := range r.Applied {
		e := a.Event
		w := appliedWire{
			ID: a.OutcomeID, Agent: e.Agent, Action: e.Action, Rerender: e.Rerender,
			Refusals: e.Refusals, Reprobes: e.Reprobes,
			Frozen: e.Frozen, Legacy: e.Legacy, Notify: e.Notify, Peers: a.Peers,
		}
		if !e.RefusedAt.IsZero() {
			w.RefusedAt = events.At(e.RefusedAt)
		}
		if !e.NextProbeAt.IsZero() {
			w.NextProbeAt = events.At(e.NextProbeAt)
		}
		x.Applied = append(x.Applied, w)
	}
	return x
}

// apply adds the claim and applied refusals of x to r.
func (x recordExtras) apply(r *refusal.Record) {
	if x.ProbeAgent != "" {
		r.Claim = refusal.Claim{Agent: x.ProbeAgent, Until: x.ProbeUntil.Time}
	}
	for _, w := range x.Applied {
		r.Applied = append(r.Applied, refusal.Applied{
			OutcomeID: w.ID,
			Peers:     w.Peers,
			Event: refusal.Event{
				Segment: r.State.Segment, Provider: r.State.Provider, Agent: w.Agent,
				Action: w.Action, Rerender: w.Rerender, Refusals: w.Refusals, Reprobes: w.Reprobes,
				RefusedAt: w.RefusedAt.Time, NextProbeAt: w.NextProbeAt.Time,
				Frozen: w.Frozen, Legacy: w.Legacy, Notify: w.Notify,
			},
		})
	}
}

// recordWire is the stored record as one struct: the state's keys and
// the extras', in sorted key order, so msgpack writes one flat map with
// its keys sorted in a single pass. It was the state encoded, decoded
// into a map, the extras encoded and decoded into it, and the map encoded
// again: five passes on every refusal the tiers store, and the keys were
// in Go's map order, not sorted as this doc said (SetSortMapKeys does not
// sort a map of RawMessage).
// TestRecordWireMatchesMerge holds it to the merged form, key for key and
// value byte for value byte, and checks the keys are sorted.
type recordWire struct {
	Agent      string        `msgpack:"agent,omitempty"`
	Applied    []appliedWire `msgpack:"applied,omitempty"`
	Increment  string        `msgpack:"increment,omitempty"`
	ProbeAgent string        `msgpack:"probe_agent,omitempty"`
	ProbeUntil events.Time   `msgpack:"probe_until,omitempty"`
	Provider   string        `msgpack:"provider"`
	Refusals   *int          `msgpack:"refusals"`
	RefusedAt  events.Time   `msgpack:"refused_at"`
	Rerenders  int           `msgpack:"rerenders,omitempty"`
	Segment    string        `msgpack:"segment"`
}

// recordWireOf is the stored form of r.
func recordWireOf(r refusal.Record) recordWire {
	w, x := wireOf(r.State), extrasOf(r)
	return recordWire{
		Agent: w.Agent, Applied: x.Applied, Increment: w.Increment,
		ProbeAgent: x.ProbeAgent, ProbeUntil: x.ProbeUntil,
		Provider: w.Provider, RefusedAt: w.RefusedAt, Refusals: w.Refusals,
		Rerenders: w.Rerenders, Segment: w.Segment,
	}
}

// split is w's state and extras.
func (w *recordWire) split() (stateWire, recordExtras) {
	return stateWire{
			Segment: w.Segment, Provider: w.Provider, Agent: w.Agent, Refusals: w.Refusals,
			RefusedAt: w.RefusedAt, Increment: w.Increment, Rerenders: w.Rerenders,
		}, recordExtras{
			ProbeAgent: w.ProbeAgent, ProbeUntil: w.ProbeUntil, Applied: w.Applied,
		}
}

// EncodeRecord is the KV value of a record: the state's stored form
// (EncodeState) with the claim and the applied refusals as extra keys
// (probe_agent, probe_until, applied) in the same msgpack map, keys sorted.
func EncodeRecord(r refusal.Record) ([]byte, error) {
	w := recordWireOf(r)
	b, err := msgpack.Marshal(&w)
	if err != nil {
		return nil, fmt.Errorf("encode refusal record %s/%s: %w", r.State.Segment, r.State.Provider, err)
	}
	return b, nil
}

// DecodeRecord reads a KV value written by EncodeRecord, by
// EncodeState (no claim, nothing applied) or by an operator as JSON.
// The state follows DecodeState: unreadable means Legacy (frozen),
// returned with the error. Unreadable extra keys are dropped and reported
// in the error too, with the state kept.
func DecodeRecord(data []byte) (refusal.Record, error) {
	if events.IsMsgpackMap(data) {
		// One pass for what EncodeRecord wrote (a map); a value it cannot
		// read whole, or another shape, is read in two below, to keep
		// what can be kept.
		var w recordWire
		if msgpack.Unmarshal(data, &w) == nil {
			sw, x := w.split()
			r := refusal.Record{State: sw.state()}
			x.apply(&r)
			return r, nil
		}
	}
	s, err := DecodeState(data)
	r := refusal.Record{State: s}
	if err != nil {
		return r, err
	}
	var x recordExtras
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		err = json.Unmarshal(t, &x)
	} else {
		err = msgpack.Unmarshal(data, &x)
	}
	if err != nil {
		return r, fmt.Errorf("decode refusal record %s/%s: claim and applied refusals dropped: %w", s.Segment, s.Provider, err)
	}
	x.apply(&r)
	return r, nil
}
