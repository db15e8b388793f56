package tail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"text/template"
	"time"
)

// translator is --translate CMD, in the nats CLI's manner: CMD runs once
// per message with the payload on its stdin, and what it prints replaces
// the payload in the output. CMD is split into words like a shell would
// (quotes, backslashes; no pipes or variables: no shell runs), and each
// word is a Go template with {{Subject}} and {{Stream}}, so
// `--translate 'failbus decode --subject {{Subject}}'` decodes what the
// nats CLI shows raw.
type translator struct {
	words []string
}

// translateTimeout bounds one run of the command.
const translateTimeout = 30 * time.Second

func newTranslator(cmd string) (*translator, error) {
	words, err := splitWords(cmd)
	if err != nil {
		return nil, fmt.Errorf("--translate %q: %w", cmd, err)
	}
	if len(words) == 0 {
		return nil, errors.New("--translate: empty command")
	}
	t := &translator{words: words}
	if _, err := t.args("", ""); err != nil {
		return nil, fmt.Errorf("--translate %q: %w", cmd, err)
	}
	return t, nil
}

// args are the command's words with {{Subject}} and {{Stream}} filled in.
func (t *translator) args(subject, stream string) ([]string, error) {
	funcs := template.FuncMap{
		"Subject": func() string { return subject },
		"Stream":  func() string { return stream },
	}
	out := make([]string, len(t.words))
	for i, w := range t.words {
		tmpl, err := template.New("translate").Funcs(funcs).Parse(w)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, nil); err != nil {
			return nil, err
		}
		out[i] = b.String()
	}
	return out, nil
}

// run translates one payload. The output is JSON when the command printed
// JSON, else a JSON string of what it printed.
func (t *translator) run(ctx context.Context, subject, stream string, data []byte) (json.RawMessage, error) {
	args, err := t.args(subject, stream)
	if err != nil {
		return nil, fmt.Errorf("translate: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, translateTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(string(out))
		}
		if msg != "" {
			return nil, fmt.Errorf("translate: %s: %w: %s", args[0], err, oneLine(msg, 300))
		}
		return nil, fmt.Errorf("translate: %s: %w", args[0], err)
	}
	out = bytes.TrimSpace(out)
	if json.Valid(out) && len(out) > 0 {
		return out, nil
	}
	b, _ := json.Marshal(string(out))
	return b, nil
}

// oneLine flattens s to one line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// splitWords splits a command line into words as a POSIX shell would for
// a simple command: blanks separate words; single quotes keep everything
// up to the next one; double quotes keep everything but a backslash
// before " or \; a backslash outside quotes keeps the next character.
func splitWords(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // a word has started (possibly empty: '')
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			in = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New("unterminated double quote")
			}
			in = true
		case c == '\\':
			if i+1 >= len(s) {
				return nil, errors.New("trailing backslash")
			}
			i++
			cur.WriteByte(s[i])
			in = true
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}
