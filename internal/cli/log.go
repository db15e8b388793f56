package cli

import (
	"io"
	"time"

	"github.com/rs/zerolog"
)

// ConsoleLogger writes human-readable log lines, coloured only on a
// terminal: the services' logs in `failbus dev`, `demo --verbose` and
// `bench --verbose`.
func ConsoleLogger(w io.Writer) zerolog.Logger {
	return zerolog.New(zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !IsTerminal(w)}).With().Timestamp().Logger()
}
