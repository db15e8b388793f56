package publish

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/msgid"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// publishTimeout bounds the wait for JetStream to store one line.
const publishTimeout = 10 * time.Second

// errorRecord is the JSON Lines record of a line that was not published,
// the same shape as the offline commands' (CONTRACT.md).
type errorRecord struct {
	Type  string `json:"type"`
	Line  int    `json:"line"`
	Error string `json:"error"`
}

// publishStats counts what publish did, for its summary.
type publishStats struct {
	published, duplicates, invalid, failed int
	// stamped counts the published lines that had no "at" and got the
	// time of publishing.
	stamped int
}

// summary is the line publish ends with on stderr.
func (st publishStats) summary() string {
	s := fmt.Sprintf("%d published, %s, %d invalid, %d failed", st.published, cli.Count(st.duplicates, "duplicate"), st.invalid, st.failed)
	if st.stamped > 0 {
		s += fmt.Sprintf("; %d published without \"at\" carries the time of publishing", st.stamped)
		if st.stamped > 1 {
			s = strings.Replace(s, "carries", "carry", 1)
		}
	}
	return s
}

// Command is `failbus publish`.
var Command = cli.Command{Name: "publish", Summary: "publish Outcome (and boundary) JSON Lines from stdin to the bus", Run: run}

// run is `failbus publish`: Outcome JSON Lines on stdin become
// msgpack Outcomes on failbus.outcome.<provider>.<agent>, each with
// Nats-Msg-Id = its id and stored by JetStream before the next line is read.
// A line {"type":"boundary",...} is a segment boundary
// (failbus.segment.<agent>). A line without "at" gets the time it is
// published (the summary counts them). A line that cannot be published is
// an error record on stdout and publishing goes on; a summary goes to
// stderr.
//
// Exit code: 0 when every line was published (a duplicate of a stored id
// counts: it is on the bus); 1, after the summary, when any line was not
// (invalid, or the bus failed to store it) or the bus could not be reached;
// 2 for unusable arguments.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("publish", "[--server URL] [--nkey FILE | --creds FILE | --user U --password P] [--tls-ca FILE] < outcomes.jsonl", stderr)
	var conn cli.Conn
	conn.Register(fs)
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q: input is read from stdin", rest)
	}
	ctx := context.Background()
	nc, js, err := conn.JetStream(ctx, "publish")
	if err != nil {
		fmt.Fprintf(stderr, "failbus publish: %v\n", err)
		return 1
	}
	defer nc.Close()
	st, err := publishLines(ctx, js, nc, stdin, stdout)
	fmt.Fprintf(stderr, "failbus publish: %s\n", st.summary())
	if err != nil {
		fmt.Fprintf(stderr, "failbus publish: %v\n", err)
		return 1
	}
	if n := st.invalid + st.failed; n > 0 {
		fmt.Fprintf(stderr, "failbus publish: %s not published (see the error records on stdout)\n", cli.Count(n, "line"))
		return 1
	}
	return 0
}

// publishLines publishes every line of r and writes error records to w; a
// line the user may not publish fails at once and its error names the
// permission (connect.Conn's FailFast and Explain). It returns an error
// when reading r or writing w fails, and when the bus cannot store
// outcomes at all (no JetStream, no topology: cli.Diagnose).
func publishLines(ctx context.Context, js jetstream.JetStream, nc *connect.Conn, r io.Reader, w io.Writer) (publishStats, error) {
	var st publishStats
	br := bufio.NewReaderSize(r, 64<<10)
	enc := json.NewEncoder(w)
	for n := 1; ; n++ {
		line, rerr := br.ReadBytes('\n')
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return st, fmt.Errorf("read stdin: %w", rerr)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			msg, stamped, perr := lineMsg(line, time.Now())
			var ack *jetstream.PubAck
			if perr == nil {
				pctx, cancel := context.WithTimeout(ctx, publishTimeout)
				pctx, stop := nc.FailFast(pctx)
				ack, perr = js.PublishMsg(pctx, msg)
				stop()
				cancel()
				if perr != nil {
					st.failed++
					if cli.NoAnswer(perr) {
						// Every line would fail alike when the bus lacks
						// JetStream or the topology: say so, and stop.
						if d := cli.Diagnose(ctx, js, nc.ConnectedUrlRedacted(), topology.StreamOutcomes); d != nil {
							_ = enc.Encode(errorRecord{Type: "error", Line: n, Error: d.Error()})
							return st, d
						}
					}
					perr = fmt.Errorf("publish to %s: %w", msg.Subject, nc.Explain(perr))
				}
			} else {
				st.invalid++
			}
			switch {
			case perr != nil:
				if err := enc.Encode(errorRecord{Type: "error", Line: n, Error: perr.Error()}); err != nil {
					return st, fmt.Errorf("write stdout: %w", err)
				}
			case ack.Duplicate:
				st.duplicates++
			default:
				st.published++
				if stamped {
					st.stamped++
				}
			}
		}
		if rerr != nil {
			return st, nil
		}
	}
}

// lineMsg turns one JSON line into the message to publish; a record
// without "at" gets now (stamped).
func lineMsg(line []byte, now time.Time) (_ *nats.Msg, stamped bool, _ error) {
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(line, &head); err != nil {
		return nil, false, fmt.Errorf("not a JSON object: %w", err)
	}
	var (
		m       events.Message
		subject string
		id      string
	)
	switch head.Type {
	case "", "outcome":
		o := &events.Outcome{}
		if err := events.UnmarshalJSON(line, o); err != nil {
			return nil, false, err
		}
		if o.At.IsZero() {
			o.At, stamped = events.At(now), true
		}
		m, subject, id = o, events.OutcomeSubject(o.Provider, o.Agent), o.ID
	case "boundary":
		b := &events.Boundary{}
		if err := events.UnmarshalJSON(line, b); err != nil {
			return nil, false, err
		}
		if b.At.IsZero() {
			b.At, stamped = events.At(now), true
		}
		m, subject, id = b, events.SegmentSubject(b.Agent), msgid.Boundary(*b)
	default:
		return nil, false, fmt.Errorf("unknown type %q: want outcome (or no type) or boundary", head.Type)
	}
	data, hdr, err := events.Encode(m)
	if err != nil {
		return nil, false, err
	}
	hdr.Set(events.HeaderMsgID, id)
	return &nats.Msg{Subject: subject, Header: hdr, Data: data}, stamped, nil
}
