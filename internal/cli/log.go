package cli

import (
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// ConsoleLogger writes human-readable log lines, coloured only on a
// terminal: the services' logs in `failbus dev`, `demo --verbose` and
// `bench --verbose`.
func ConsoleLogger(w io.Writer) zerolog.Logger {
	color := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			color = true
		}
	}
	return zerolog.New(zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !color}).With().Timestamp().Logger()
}
