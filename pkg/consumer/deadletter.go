package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/pkg/events"
)

// Bounds of a dead letter, so one always fits in a message whatever the
// input: an input already at the server's max_payload cannot be copied
// whole into a record that adds an envelope to it.
const (
	// MaxReasonBytes bounds a dead letter's reason and the reason logged
	// with it: 1 KiB, cut at a character boundary and marked.
	MaxReasonBytes = 1024
	// DefaultDeadLetterPrefix is how much of an input that does not fit
	// whole a dead letter keeps: 64 KiB (less when the server's max_payload
	// is below 256 KiB: at most a quarter of it).
	DefaultDeadLetterPrefix = 64 << 10
	// maxTruncatedHeaders bounds the input headers a truncated dead letter
	// keeps.
	maxTruncatedHeaders = 4 << 10
	// maxWholeHeaders and maxWholeHeaderValues bound the headers a dead
	// letter keeps whole; beyond them it is truncated, so the record itself
	// always decodes within events' default Limits (as does its Data,
	// at most events.DefaultMaxString whole).
	maxWholeHeaders      = 64 << 10
	maxWholeHeaderValues = 1024
	// envelopeRoom is what a dead letter needs beside the input's bytes and
	// headers: reason, subject, stream, service, hash, its own headers.
	envelopeRoom = 8 << 10
)

// deadLetterRecord builds the dead letter of m: its reason masked by
// redact.String (a reason may quote the field that was wrong, and the dead
// letter is read by operators who must not see credentials), and the whole input when the
// record fits in maxPayload and within events' default decode limits
// (input at most 4 MiB, headers at most 64 KiB and 1024 values), else a
// bounded prefix, the input's length and
// SHA-256 and a bounded part of its headers, with Truncated set. Stream and
// Seq say where the whole input still lies. It returns the encoded record.
func deadLetterRecord(service string, m *Msg, reason string, maxPayload int64) ([]byte, nats.Header, *events.DeadLetter, error) {
	sum := sha256.Sum256(m.Data)
	dl := &events.DeadLetter{
		At:         events.At(time.Now()),
		Service:    service,
		Reason:     logText(reason),
		Subject:    m.Subject,
		Stream:     m.Stream,
		Seq:        m.Seq,
		Headers:    m.Header,
		Data:       m.Data,
		DataLen:    len(m.Data),
		DataSHA256: hex.EncodeToString(sum[:]),
	}
	if dl.Data == nil {
		dl.Data = []byte{}
	}
	if maxPayload <= 0 {
		maxPayload = 1 << 20 // nats-server's default
	}
	if int64(len(m.Data)+headerSize(m.Header)+envelopeRoom) > maxPayload || len(m.Data) > events.DefaultMaxString ||
		headerSize(m.Header) > maxWholeHeaders || headerValues(m.Header) > maxWholeHeaderValues {
		dl.Truncated = true
		prefix := min(int64(DefaultDeadLetterPrefix), maxPayload/4)
		dl.Data = m.Data[:min(int64(len(m.Data)), prefix)]
		dl.Headers = boundHeaders(m.Header, maxTruncatedHeaders)
	}
	data, hdr, err := events.Encode(dl)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encode dead letter: %w", err)
	}
	if int64(len(data)+headerSize(hdr)) > maxPayload {
		// Only a pathological subject gets here: keep nothing of the input
		// but where it lies and what identifies it.
		dl.Truncated, dl.Data, dl.Headers = true, []byte{}, nil
		if data, hdr, err = events.Encode(dl); err != nil {
			return nil, nil, nil, fmt.Errorf("encode dead letter: %w", err)
		}
	}
	return data, hdr, dl, nil
}

// deadLetter stores the input in failbus.dlq.<service> with reason and
// acknowledges it; if the dead letter cannot be stored the input is
// redelivered after the backoff instead, so it is never lost here. The
// record always fits (deadLetterRecord), so a redelivery never meets the
// same "maximum payload exceeded" again.
func (r *Runner) deadLetter(ctx context.Context, m *Msg, reason string) (string, string) {
	data, hdr, dl, err := deadLetterRecord(r.cfg.Service, m, reason, r.js.Conn().MaxPayload())
	if err != nil {
		return r.nak(m, r.cfg.backoff(m.Delivered), resultError, err.Error())
	}
	hdr.Set(events.HeaderMsgID, msgid.DeadLetter(r.cfg.Service, m.Stream, m.Seq))
	pctx, cancel := context.WithTimeout(ctx, SettleTimeout)
	defer cancel()
	_, err = r.js.PublishMsg(pctx, &nats.Msg{Subject: events.DLQSubject(r.cfg.Service), Header: hdr, Data: data})
	if ctx.Err() == nil {
		r.stored(err)
	}
	if err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			err = fmt.Errorf("%w (a %d-byte record; the server's max_payload is %d)", err, len(data), r.js.Conn().MaxPayload())
		}
		return r.nak(m, r.cfg.backoff(m.Delivered), resultError, fmt.Sprintf("publish dead letter (%s): %v", dl.Reason, err))
	}
	if dl.Truncated {
		r.m.deadLettersTruncated.WithLabelValues(r.cfg.Service).Inc()
	}
	if err := m.raw.DoubleAck(pctx); err != nil {
		return resultDeadLetter, dl.Reason + "; ack failed, dead letter deduplicated on redelivery: " + err.Error()
	}
	return resultDeadLetter, dl.Reason
}

// headerSize is roughly what h takes on the wire ("Name: value\r\n" each).
func headerSize(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// headerValues counts the values of h.
func headerValues(h nats.Header) (n int) {
	for _, vs := range h {
		n += len(vs)
	}
	return n
}

// boundHeaders keeps the headers of h, in name order, while they fit in
// limit bytes; a value too long is cut.
func boundHeaders(h nats.Header, limit int) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	sort.Strings(names)
	out := map[string][]string{}
	used := 0
	for _, k := range names {
		for _, v := range h[k] {
			v = boundText(v, 256)
			if len(k) > 256 || used+len(k)+len(v)+4 > limit {
				return out
			}
			used += len(k) + len(v) + 4
			out[k] = append(out[k], v)
		}
	}
	return out
}

// boundText cuts s to at most limit bytes at a character boundary and says
// how long it was.
func boundText(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	marker := fmt.Sprintf("… (%d bytes)", len(s))
	cut := max(limit-len(marker), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + marker
}

// Quarantine dead-letters input that did not come through a Runner: a KV
// entry a watch or a start-up replay read and could not use (it panicked,
// or cannot be decoded). The record is the one a Runner writes (reason,
// subject, the bytes, bounded to fit), on failbus.dlq.<service>, with a
// Nats-Msg-Id from m's stream and sequence, so quarantining the same entry
// again (a replica, a restart's replay) stores it once within the stream's
// duplicate window. Removing the entry is the caller's: quarantine only
// keeps what it held.
func Quarantine(ctx context.Context, js jetstream.JetStream, service string, m *Msg, reason string) error {
	data, hdr, _, err := deadLetterRecord(service, m, reason, js.Conn().MaxPayload())
	if err != nil {
		return err
	}
	hdr.Set(events.HeaderMsgID, msgid.DeadLetter(service, m.Stream, m.Seq))
	pctx, cancel := context.WithTimeout(ctx, SettleTimeout)
	defer cancel()
	if _, err := js.PublishMsg(pctx, &nats.Msg{Subject: events.DLQSubject(service), Header: hdr, Data: data}); err != nil {
		return fmt.Errorf("quarantine %s: %w", m.Subject, err)
	}
	return nil
}
