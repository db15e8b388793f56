// Package health is `failbus health`: each provider's current state, read
// from the latest record per provider on failbus.health.<provider>.
package health

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Command is `failbus health`.
var Command = cli.Command{Name: "health", Summary: "print each provider's current health (healthy, degraded, outage, recovered)", Run: run}

const usage = `[--server URL] [--json] [--check] [PROVIDER...]

Prints each provider's current state: the latest record on
failbus.health.<provider> (stream FAILBUS_HEALTH), one provider a line,
sorted by provider, with when it was reached and why. A provider that has no
record has never been anything but healthy. With PROVIDER arguments, only
those. --json prints the records as JSON Lines, as on the bus.

Exit code: 0 when read (with --check: and every listed provider is healthy
or recovered; 3 when one is degraded or in an outage), 1 when the bus cannot
be read, 2 for unusable arguments.`

// readTimeout bounds reading the latest records.
const readTimeout = 30 * time.Second

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("health", usage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	asJSON := fs.Bool("json", false, "print the health records as JSON Lines")
	check := fs.Bool("check", false, "exit 3 when a provider is degraded or in an outage")
	providers, code, done := cli.Parse(fs, args)
	if done {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	nc, js, err := conn.JetStream(ctx, "health")
	if err != nil {
		fmt.Fprintf(stderr, "failbus health: %v\n", err)
		return 1
	}
	defer nc.Close()
	// The server answers a denied request by reporting the denial, not by
	// replying: fail at once, naming it, instead of waiting for a timeout.
	ctx, failFast := nc.FailFast(ctx)
	defer failFast()
	records, err := Latest(ctx, js, providers...)
	if err != nil {
		if d := cli.Diagnose(ctx, js, nc.ConnectedUrlRedacted(), topology.StreamHealth); d != nil {
			err = d
		}
		fmt.Fprintf(stderr, "failbus health: %v\n", nc.Explain(err))
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, h := range records {
			if err := enc.Encode(h); err != nil {
				fmt.Fprintf(stderr, "failbus health: %v\n", err)
				return 1
			}
		}
	} else {
		write(stdout, records, providers, time.Now())
	}
	for _, h := range records {
		if *check && (h.State == events.HealthDegraded || h.State == events.HealthOutage) {
			return 3
		}
	}
	return 0
}

// Latest returns the latest health record of each provider (of the given
// ones, or of all), sorted by provider.
func Latest(ctx context.Context, js jetstream.JetStream, providers ...string) ([]events.Health, error) {
	filters := []string{events.HealthPrefix + ".>"}
	if len(providers) > 0 {
		filters = filters[:0]
		for _, p := range providers {
			filters = append(filters, events.HealthSubject(p))
		}
		slices.Sort(filters)
		filters = slices.Compact(filters)
	}
	var out []events.Health
	cfg := watch.Config{Stream: topology.StreamHealth, Filters: filters, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, Direct: true}
	err := watch.Read(ctx, js, cfg, func(m jetstream.Msg) error {
		h, err := events.DecodeAs[*events.Health](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return fmt.Errorf("health record on %s: %w", m.Subject(), err)
		}
		out = append(out, *h)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b events.Health) int { return strings.Compare(a.Provider, b.Provider) })
	return out, nil
}

// write prints the records as a table; asked-for providers without a
// record are listed as healthy.
func write(w io.Writer, records []events.Health, asked []string, now time.Time) {
	if len(records) == 0 && len(asked) == 0 {
		fmt.Fprintln(w, "no health records: every provider has been healthy, or nothing was reported yet")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tSTATE\tSINCE\tREASON")
	seen := map[string]bool{}
	for _, h := range records {
		seen[events.Token(h.Provider)] = true
		fmt.Fprintf(tw, "%s\t%s\t%s (%s ago)\t%s\n", h.Provider, h.State, h.At.UTC().Format(time.RFC3339), age(now.Sub(h.At.Time)), h.Reason)
	}
	for _, p := range asked {
		if !seen[events.Token(p)] {
			fmt.Fprintf(tw, "%s\t%s\t-\tno health record: never degraded\n", p, events.HealthHealthy)
		}
	}
	_ = tw.Flush()
}

// age writes d for people, to the unit that matters: 42s, 12m, 5h07m,
// 3d04h.
func age(d time.Duration) string {
	d = max(d, 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}
