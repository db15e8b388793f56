// Package httpheader turns HTTP headers into the map an Outcome keeps.
package httpheader

import (
	"net/http"
	"strings"
)

// Map is h with lower-case names, one value each, as an Outcome
// keeps them.
func Map(h http.Header) map[string]string {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[strings.ToLower(k)] = v[0]
		}
	}
	return out
}
