package memstore

import (
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/pkg/events"
)

// copyRecord returns what saving r in KV and loading it back gives: a deep
// copy that shares nothing with r, its times in UTC without a monotonic
// reading, empty omitempty slices nil. The fields read and written for
// every input (users, queue, probe schedule, lease) are copied by hand —
// a msgpack round trip of the whole record per outcome was a third of a
// shadow run's CPU; the rarely set ones that carry messages (episodes, a
// pending probe) take the round trip. A time outside what events.Time
// decodes (years 0001–9999) takes the whole round trip, which fails as KV
// would. TestCopyRecordIsARoundTrip holds it to msgpack for every field.
func copyRecord(r *recovery.ProviderRecord) (*recovery.ProviderRecord, error) {
	out := *r
	ok := true
	norm := func(t events.Time) events.Time {
		n, in := normTime(t)
		ok = ok && in
		return n
	}
	out.HealthAt = norm(r.HealthAt)
	out.Episodes = nil
	if len(r.Episodes) > 0 {
		if err := roundTrip(r.Episodes, &out.Episodes); err != nil {
			return nil, err
		}
	}
	out.Queue.NextAt = norm(r.Queue.NextAt)
	if r.Queue.Sending != nil {
		out.Queue.Sending = &recovery.Sending{Seq: r.Queue.Sending.Seq, Since: norm(r.Queue.Sending.Since), At: norm(r.Queue.Sending.At)}
	}
	out.Probe.NextAt = norm(r.Probe.NextAt)
	if r.Probe.Pending != nil {
		out.Probe.Pending = nil
		if err := roundTrip(r.Probe.Pending, &out.Probe.Pending); err != nil {
			return nil, err
		}
	}
	out.Users = nil
	if len(r.Users) > 0 {
		out.Users = make([]recovery.User, len(r.Users))
		for i, u := range r.Users {
			out.Users[i] = recovery.User{Agent: u.Agent, At: norm(u.At)}
		}
	}
	out.Lease = recovery.Lease{Owner: r.Lease.Owner, Until: norm(r.Lease.Until)}
	if !ok {
		var whole recovery.ProviderRecord
		if err := roundTrip(r, &whole); err != nil {
			return nil, err
		}
		return &whole, nil
	}
	return &out, nil
}

// roundTrip decodes the msgpack encoding of v into out.
func roundTrip(v, out any) error {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return err
	}
	return msgpack.Unmarshal(b, out)
}

// Bounds of what events.Time decodes (its minEpochMillis, maxEpochMillis).
var (
	minTime = time.UnixMilli(-62135596800000).UTC()
	maxTime = time.UnixMilli(253402300799999).UTC()
)

// normTime is t after a msgpack round trip (a timestamp to the
// nanosecond, decoded in UTC); false when decoding would refuse it.
func normTime(t events.Time) (events.Time, bool) {
	if t.IsZero() {
		return events.Time{}, true
	}
	if t.Before(minTime) || t.After(maxTime) {
		return events.Time{}, false
	}
	return events.At(time.Unix(t.Unix(), int64(t.Nanosecond()))), true
}
