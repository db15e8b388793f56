package streamread

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MsgQuery says which one message LeaderGet reads: the one at Seq, the
// first at or after Seq (or StartTime) whose subject matches NextFor, or
// the last whose subject matches LastFor (then neither Seq nor StartTime).
type MsgQuery struct {
	Seq       uint64     `json:"seq,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
	NextFor   string     `json:"next_by_subj,omitempty"`
	LastFor   string     `json:"last_by_subj,omitempty"`
}

// LeaderGet reads one message of stream through the stream's JSON API
// ($JS.API.STREAM.MSG.GET.<stream>), which only the stream's leader
// answers, never through a direct get, which any replica answers, one
// that lags the leader included. The leader has stored every message
// whose publish was acknowledged, so the answer reflects every write
// acknowledged before the read: what a read needs whose answer decides
// something no compare-and-set checks afterwards (a decision that appends
// nothing). It costs the leader a JSON answer per read and cannot be
// batched, where direct gets spread over the replicas and batch.
//
// A message that does not exist is jetstream.ErrMsgNotFound itself (an
// answer, not a failure: callers read it on hot paths); other refusals are
// the server's *jetstream.APIError. Without a deadline in ctx, the read is
// bounded by js's default API timeout.
func LeaderGet(ctx context.Context, js jetstream.JetStream, stream string, q MsgQuery) (*jetstream.RawStreamMsg, error) {
	body, err := json.Marshal(q)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx, js)
	defer cancel()
	m, err := js.Conn().RequestWithContext(ctx, apiPrefix(js.Options())+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("read %s from its leader: %w", stream, err)
	}
	var resp leaderGetResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("read %s from its leader: answer: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("read %s from its leader: %w", stream, resp.Error)
	case resp.Message == nil:
		return nil, fmt.Errorf("read %s from its leader: %w", stream, jetstream.ErrInvalidJetStreamResponse)
	}
	raw := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if raw.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("read %s from its leader: headers of seq %d: %w", stream, raw.Sequence, err)
		}
	}
	return raw, nil
}

// leaderGetResponse is the answer of $JS.API.STREAM.MSG.GET.
type leaderGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Subject  string    `json:"subject"`
		Sequence uint64    `json:"seq"`
		Header   []byte    `json:"hdrs,omitempty"`
		Data     []byte    `json:"data,omitempty"`
		Time     time.Time `json:"time"`
	} `json:"message,omitempty"`
}

// Replicated reports whether stream, by the configuration in its cached
// info, keeps more than one copy: a direct get of it may then be answered
// by a replica that has not applied the latest writes yet.
func Replicated(stream jetstream.Stream) bool {
	info := stream.CachedInfo()
	return info != nil && info.Config.Replicas > 1
}
