// Package decode is `failbus decode`: one failbus payload on stdin, its
// JSON on stdout. It is the translator for tools that show payloads raw,
// in the nats CLI's manner:
//
//	nats sub 'failbus.>' --translate 'failbus decode --subject {{Subject}}'
//	nats stream view FAILBUS_RETRIES --translate 'failbus decode --subject {{Subject}}'
//
// The subject picks the type, as on the bus (a subject carries one type);
// --schema names it for a payload whose subject carries none (the retry
// schedules, say). Every record type the bus writes decodes typed.
package decode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/wiretypes"
	"github.com/failbus/failbus/pkg/events"
)

// Command is `failbus decode`.
var Command = cli.Command{Name: "decode", Summary: "one payload on stdin to JSON on stdout (a translator for nats sub/stream view --translate)", Run: run}

const usage = `[--subject SUBJECT] [--schema NAME] [--pretty] < payload

Reads one payload (all of stdin) and writes its JSON: a failbus record with
its snake_case keys, typed by --subject (the type the subject carries) or
--schema (e.g. retry_due for a retry schedule); a dead letter with the
payload it carries decoded ("data_as" says how). Without either, a msgpack
payload is shown as the JSON of its value. A payload that is not msgpack is
an error on stderr (exit 1), with the payload shown as text or base64 on
stdout so a translator still prints something.

In the nats CLI:
  nats sub 'failbus.>' --translate 'failbus decode --subject {{Subject}}'`

// maxPayload bounds what is read from stdin: far above any NATS payload.
const maxPayload = 64 << 20

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("decode", usage, stderr)
	subject := fs.String("subject", "", "the subject the payload was published to: picks its type")
	schema := fs.String("schema", "", "the payload's type, for a subject that carries none (one of "+schemaList()+")")
	pretty := fs.Bool("pretty", false, "indent the JSON")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q: the payload is read from stdin", rest)
	}
	if *schema != "" && wiretypes.Bus.New(*schema) == nil {
		return cli.UsageError(fs, stderr, "--schema %q: unknown; one of %s", *schema, schemaList())
	}
	data, err := io.ReadAll(io.LimitReader(stdin, maxPayload+1))
	if err != nil {
		fmt.Fprintf(stderr, "failbus decode: read stdin: %v\n", err)
		return 1
	}
	if len(data) > maxPayload {
		fmt.Fprintf(stderr, "failbus decode: stdin holds more than %d bytes: not one payload\n", maxPayload)
		return 1
	}
	out, derr := Decode(*subject, *schema, data)
	if *pretty {
		var b bytes.Buffer
		if json.Indent(&b, out, "", "  ") == nil {
			out = b.Bytes()
		}
	}
	if _, err := fmt.Fprintf(stdout, "%s\n", out); err != nil {
		fmt.Fprintf(stderr, "failbus decode: write output: %v\n", err)
		return 1
	}
	if derr != nil {
		fmt.Fprintf(stderr, "failbus decode: %v\n", derr)
		return 1
	}
	return 0
}

// Decode renders one payload as JSON: typed by subject or schema when one
// is given and the payload is that type, else the JSON of its msgpack
// value. err says why it is not what was asked for; out then still shows
// the payload (cli.PayloadJSON).
func Decode(subject, schema string, data []byte) (out []byte, err error) {
	h := nats.Header{}
	if schema != "" {
		h.Set(events.HeaderSchema, schema)
	}
	if schema != "" || wiretypes.Bus.SubjectSchema(subject) != "" {
		m, err := wiretypes.Bus.Decode(subject, h, data)
		if err == nil {
			if dl, ok := m.(*events.DeadLetter); ok {
				return cli.DeadLetterJSON(dl)
			}
			return json.Marshal(m)
		}
		shown, _ := cli.PayloadJSON(data)
		return shown, err
	}
	if b, err := events.MsgpackToJSON(data); err == nil {
		return b, nil
	}
	shown, as := cli.PayloadJSON(data)
	return shown, fmt.Errorf("%w: the payload is not msgpack (shown as %s)", events.ErrNotFailbus, as)
}

func schemaList() string {
	var b bytes.Buffer
	for i, s := range wiretypes.Bus.Schemas() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(s)
	}
	return b.String()
}
