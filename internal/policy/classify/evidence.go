package classify

import (
	"math"
	"strconv"
	"time"

	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/internal/policy/classify/internal/excerpt"
	"github.com/failbus/failbus/internal/policy/classify/internal/pattern"
	"github.com/failbus/failbus/pkg/events"
)

// Evidence: the short, redacted words a classification carries so a human
// sees why it was decided without reading the raw outcome.

func pct(r float64) string {
	p := r * 100
	if p < 10 || p > 99 && p < 100 {
		return strconv.FormatFloat(math.Floor(p*10)/10, 'f', 1, 64) + "%"
	}
	return strconv.FormatFloat(math.Floor(p), 'f', 0, 64) + "%"
}

func fmtMS(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).String()
}

// statusNote holds "status N" for every status, so evidence costs nothing.
var statusNote = func() (t [1000]string) {
	for i := range t {
		t[i] = "status " + strconv.Itoa(i)
	}
	t[0] = "no HTTP response"
	return t
}()

func statusEvidence(v *digest.View, o *events.Outcome) string {
	if v.StatusFromBody && v.Status < 600 {
		if o.Status == 0 {
			return "streamed error with code " + statusNote[v.Status][len("status "):]
		}
		return statusNote[o.Status] + ", error code " + statusNote[v.Status][len("status "):] + " in the body"
	}
	if o.Status >= 0 && o.Status < len(statusNote) {
		return statusNote[o.Status]
	}
	return "status " + strconv.Itoa(o.Status)
}

// placeholderNote is the evidence for a body that is a client library's
// "NNN status code (no body)" (see isNoBodyPlaceholder).
const placeholderNote = `body is a client's "status code (no body)" placeholder: no body`

// messageEvidence quotes what the provider (or the transport) said, short
// and redacted: the error message of a JSON body, the <title> of an HTML
// page, the start of a text body, or the transport error.
func (c *Classifier) messageEvidence(o *events.Outcome, v *digest.View, r *rule) string {
	transportRule := r != nil && len(r.transport) > 0 || r != nil && r.class == events.ClassTransport && o.TransportError != ""
	switch {
	case transportRule && o.TransportError != "":
		return excerpt.Make("transport: ", o.TransportError, false, c.transportMayHoldSecret(o, v))
	case v.Msg.OK():
		return excerpt.Make("message: ", v.Str(v.Msg), true, c.textMayHoldSecret(v))
	case v.HTML && v.TitleHi > v.TitleLo && v.TitleHi <= len(o.Body):
		return excerpt.Make("page title: ", o.Body[v.TitleLo:v.TitleHi], false, c.textMayHoldSecret(v))
	case !v.EmptyBody && !v.JSON && !v.HTML:
		return excerpt.Make("body: ", o.Body, false, c.textMayHoldSecret(v))
	case o.TransportError != "":
		return excerpt.Make("transport: ", o.TransportError, false, c.transportMayHoldSecret(o, v))
	}
	return ""
}

// textMayHoldSecret reports whether an excerpt of v's body may hold a
// secret. Every excerpt is, up to whitespace and JSON escapes (which no
// redaction trigger contains), a substring of v.text; so when the text was
// already scanned whole and holds no trigger, Redact has nothing to do. In
// any other case it answers true and Redact looks for itself.
func (c *Classifier) textMayHoldSecret(v *digest.View) bool {
	if !v.Scanned || v.TextFull {
		return true
	}
	for _, id := range c.redactIDs {
		if pattern.Hit(v.Hits, id) {
			return true
		}
	}
	return false
}

func (c *Classifier) transportMayHoldSecret(o *events.Outcome, v *digest.View) bool {
	if !v.TScanned || len(o.TransportError) > digest.MaxTransport {
		return true
	}
	for _, id := range c.tredactIDs {
		if pattern.Hit(v.THits, id) {
			return true
		}
	}
	return false
}
