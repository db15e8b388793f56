package delivery

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/policy/notification"
)

// Ledger states of a dedupe key (one entry per key in the dedupe bucket).
// Every transition is a compare-and-set on the entry's revision, so two
// replicas never both believe they own a key.
const (
	// ledgerClaimed: a replica owns the key until Until (its lease) and is
	// delivering.
	ledgerClaimed = "claimed"
	// ledgerPending: a delivery failed; the request that owns the key comes
	// back (JetStream redelivery) before Until.
	ledgerPending = "pending"
	// ledgerSent: every routed sink accepted it at SentAt; the key is spent
	// for the dedupe lifetime.
	ledgerSent = "sent"
	// ledgerHeld: the daily budget held it back on HeldDay.
	ledgerHeld = "held"
	// ledgerFailed: it was dead-lettered; a new request with the key starts
	// over.
	ledgerFailed = "failed"
)

// ledgerEntry is the stored state of one dedupe key. It is JSON so an
// operator can read it with `nats kv get FAILBUS_NOTIFY_DEDUPE <key>`.
type ledgerEntry struct {
	DedupeKey string `json:"dedupe_key"`
	State     string `json:"state"`
	// Generation is the idempotency key of this lifetime of the dedupe
	// key: created with the entry, kept across retries and takeovers,
	// replaced when the lifetime ends.
	Generation string `json:"generation"`
	// Request is the identity of the request responsible for delivery.
	Request string `json:"request"`
	// Owner is the replica holding the claim.
	Owner string `json:"owner,omitempty"`
	// Until is the end of the owner's lease (claimed) or the time by which
	// the responsible request should be back (pending).
	Until time.Time `json:"until,omitzero"`
	// BudgetDay is the UTC day whose budget slot this notification holds;
	// set once, so a retry never takes a second slot.
	BudgetDay string `json:"budget_day,omitempty"`
	// HeldDay is the UTC day the budget held it back.
	HeldDay string `json:"held_day,omitempty"`
	// Sinks is the delivery state per sink name.
	Sinks map[string]*SinkState `json:"sinks,omitempty"`
	// FailReason is the dead-letter reason (failed).
	FailReason string    `json:"fail_reason,omitempty"`
	Created    time.Time `json:"created"`
	SentAt     time.Time `json:"sent_at,omitzero"`
}

// SinkState is one sink's part of a ledger entry.
type SinkState struct {
	Sent       bool      `json:"sent,omitempty"`
	SentAt     time.Time `json:"sent_at,omitzero"`
	Attempts   int       `json:"attempts,omitempty"`
	LastAnswer string    `json:"last_answer,omitempty"`
}

// sink returns the state of the named sink, creating it.
func (e *ledgerEntry) sink(name string) *SinkState {
	if e.Sinks == nil {
		e.Sinks = map[string]*SinkState{}
	}
	s := e.Sinks[name]
	if s == nil {
		s = &SinkState{}
		e.Sinks[name] = s
	}
	return s
}

// ledgerKey is the dedupe bucket key of a dedupe key: "k." and the hex
// SHA-256 of the key, since dedupe keys hold characters KV keys do not
// allow (':', '#', ',').
func ledgerKey(dedupeKey string) string {
	sum := sha256.Sum256([]byte(dedupeKey))
	return "k." + hex.EncodeToString(sum[:])
}

func encodeEntry(e *ledgerEntry) []byte {
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("notify: encode ledger entry: %v", err)) // plain structs: cannot fail
	}
	return b
}

func decodeEntry(b []byte) (*ledgerEntry, error) {
	var e ledgerEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("decode ledger entry: %w", err)
	}
	return &e, nil
}

// BudgetRecord is one UTC day's budget of non-critical notifications, in
// the budget bucket under BudgetKey(day).
type BudgetRecord struct {
	Day string `json:"day"`
	// Limit is the daily budget in force when the record was last
	// written.
	Limit int `json:"limit"`
	// Sent counts slots taken: non-critical notifications sent (or being
	// sent) that day.
	Sent int `json:"sent"`
	// Held counts distinct dedupe keys held back that day.
	Held int `json:"held"`
	// ExhaustedAt is the time (`at`) of the first request held back.
	ExhaustedAt time.Time `json:"exhausted_at,omitzero"`
	// DigestRequested is set once the day's digest request is on the bus.
	DigestRequested bool `json:"digest_requested,omitempty"`
}

// BudgetKey is the budget bucket key of a UTC day ("2006-01-02").
func BudgetKey(day string) string { return "day." + day }

// utcDay is the budget day of t (notification.UTCDay).
func utcDay(t time.Time) string { return notification.UTCDay(t) }

// day is the record as admission reads it.
func (b *BudgetRecord) day() notification.Day {
	return notification.Day{Day: b.Day, Sent: b.Sent, Held: b.Held, DigestRequested: b.DigestRequested}
}

func encodeBudget(b *BudgetRecord) []byte {
	out, err := json.Marshal(b)
	if err != nil {
		panic(fmt.Sprintf("notify: encode budget record: %v", err))
	}
	return out
}

func decodeBudget(data []byte) (*BudgetRecord, error) {
	var b BudgetRecord
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("decode budget record: %w", err)
	}
	return &b, nil
}
