// Package cronexpr reads the schedules of the cron specs agents send
// (events.CronSpec): the expression, its time zone, and when it next
// fires. The wire types validate a spec with it and the recovery
// checklist finds the runs a cron missed.
package cronexpr

import (
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/robfig/cron/v3"

	"github.com/failbus/failbus/pkg/redact"
)

// Schedule is a parsed events.CronSpec.Schedule: a 5-field cron expression
// (minute hour day-of-month month day-of-week, with the usual ranges, steps
// and names), a descriptor (@yearly, @monthly, @weekly, @daily, @hourly), or
// "@every <duration>". Expressions are read in the cron's time zone, so a
// "0 9 * * *" in Europe/Berlin fires at 09:00 Berlin time across DST.
type Schedule struct {
	every time.Duration
	spec  *cron.SpecSchedule
}

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse parses a schedule; the error says what is wrong with it.
func Parse(expr string) (Schedule, error) {
	expr = strings.TrimSpace(expr)
	if expr == "" {
		return Schedule{}, fmt.Errorf("empty schedule")
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return Schedule{}, fmt.Errorf("schedule %q: put the time zone in the timezone field, not the expression", truncate(expr, 64))
	}
	if rest, ok := strings.CutPrefix(expr, "@every"); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return Schedule{}, fmt.Errorf("schedule %q: @every needs a Go duration (@every 15m): %v", truncate(expr, 64), err)
		}
		if d < time.Second {
			return Schedule{}, fmt.Errorf("schedule %q: @every must be at least 1s", truncate(expr, 64))
		}
		return Schedule{every: d}, nil
	}
	s, err := parseSpec(expr)
	if err != nil {
		return Schedule{}, fmt.Errorf("schedule %q: %v", truncate(expr, 64), err)
	}
	spec, ok := s.(*cron.SpecSchedule)
	if !ok {
		return Schedule{}, fmt.Errorf("schedule %q: not a cron expression", truncate(expr, 64))
	}
	return Schedule{spec: spec}, nil
}

// parseSpec guards the parser: a malformed expression must be an error,
// never a panic that stops a service.
func parseSpec(expr string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("unparseable: %v", r)
		}
	}()
	return cronParser.Parse(expr)
}

// Every is the interval of an "@every" schedule, 0 for an expression.
func (s Schedule) Every() time.Duration { return s.every }

// IsZero reports an unparsed schedule.
func (s Schedule) IsZero() bool { return s.every == 0 && s.spec == nil }

// Next is the first scheduled time strictly after t. An expression is read
// in loc (nil = UTC); an @every schedule counts from anchor (anchor + k ×
// interval). The zero time means none within five years.
func (s Schedule) Next(t time.Time, loc *time.Location, anchor time.Time) time.Time {
	if s.every > 0 {
		if t.Before(anchor) {
			return anchor
		}
		k := t.Sub(anchor)/s.every + 1
		return anchor.Add(k * s.every)
	}
	if s.spec == nil {
		return time.Time{}
	}
	if loc == nil {
		loc = time.UTC
	}
	spec := *s.spec
	spec.Location = loc
	n := spec.Next(t.In(loc))
	if n.IsZero() {
		return n
	}
	return n.UTC()
}

var zones sync.Map // name → *time.Location

// LoadLocation is time.LoadLocation with a cache (it reads the zone database
// on each call); an empty name is UTC.
func LoadLocation(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location), nil
	}
	if name == "Local" {
		return nil, fmt.Errorf("time zone %q depends on the machine; name an IANA zone", name)
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("time zone %q is not an IANA zone name", truncate(name, 64))
	}
	zones.Store(name, l)
	return l, nil
}

// truncate is how an error quotes input: credentials masked
// (redact.String), then at most n bytes, cut at a character boundary.
func truncate(s string, n int) string {
	if len(s) > 4*n {
		s = s[:4*n] // redact no more than a few times what is shown
	}
	s = redact.String(s)
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
