package report

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Report is every figure of a report: what --json prints and what the page
// shows. Maps are keyed by provider, class, action, service or kind, so
// each figure has a path of keys (the page tags its numbers with it).
type Report struct {
	// From and To bound the period: records stored in [From, To).
	From events.Time `json:"from"`
	To   events.Time `json:"to"`
	// GeneratedAt is when the report was made.
	GeneratedAt events.Time `json:"generated_at"`
	// BucketMS is the width of one time bucket of the series.
	BucketMS int64 `json:"bucket_ms"`
	// Buckets are the start times of the buckets of every series.
	Buckets []events.Time `json:"buckets"`
	// Outside counts records stored in the period whose own time (their
	// `at`) lies outside it — agents' clocks, or late backfill. They are
	// counted, and drawn in the first or last bucket.
	Outside int `json:"dated_outside"`

	Totals Totals `json:"totals"`
	// Providers holds each provider's outcomes and classes.
	Providers map[string]*Provider `json:"providers"`
	// Classes counts classifications by class over every provider.
	Classes map[string]int `json:"classes"`
	// Health is each provider's health timeline.
	Health map[string]*Health `json:"health"`
	// Decisions counts decisions by action.
	Decisions map[string]int `json:"decisions"`
	Retries   Retries        `json:"retries"`
	// Overruled lists classifications whose claimed class harder evidence
	// rejected, grouped by provider, claim, verdict and rule; most first.
	Overruled     []Overruled   `json:"overruled"`
	Refusals      Refusals      `json:"refusals"`
	Notifications Notifications `json:"notifications"`
	DeadLetters   DeadLetters   `json:"dead_letters"`
	// Recoveries lists the recovery runs, by outage start.
	Recoveries []Recovery `json:"recoveries"`
	// PolicyChanges lists the scheduler's policy changes, in order.
	PolicyChanges []PolicyChange `json:"policy_changes"`
	// Undecodable counts, by stream, stored messages that are not the
	// records their subjects carry (they are left out of every figure).
	Undecodable map[string]int `json:"undecodable"`
	// Notes say what the report could not read (a stream missing).
	Notes []string `json:"notes"`
	// Shadow is what another policy would have decided (only with
	// --shadow).
	Shadow *Shadow `json:"shadow,omitempty"`
}

// Totals are the counts of the period's records.
type Totals struct {
	Outcomes        int `json:"outcomes"`
	Boundaries      int `json:"boundaries"`
	Classifications int `json:"classifications"`
	OK              int `json:"ok"`
	Failures        int `json:"failures"`
	Decisions       int `json:"decisions"`
	Notifications   int `json:"notification_requests"`
	DeadLetters     int `json:"dead_letters"`
	HealthChanges   int `json:"health_changes"`
	RecoveryRecords int `json:"recovery_records"`
}

// Provider is one provider's outcomes and what they were classified as.
type Provider struct {
	// Outcomes counts the outcomes agents published for it.
	Outcomes int `json:"outcomes"`
	// OK and Failures split its classifications.
	OK       int `json:"ok"`
	Failures int `json:"failures"`
	// Classes counts its failures by class (ok is in OK).
	Classes map[string]int `json:"classes"`
	// Unclassified counts its outcomes without a classification in the
	// period (dead-lettered, or not classified yet).
	Unclassified int `json:"unclassified"`
	// Series is one entry per bucket.
	Series []Bucket `json:"series"`
}

// Bucket is one provider's figures in one time bucket.
type Bucket struct {
	OK           int            `json:"ok"`
	Classes      map[string]int `json:"classes,omitempty"`
	Unclassified int            `json:"unclassified,omitempty"`
}

// Total is every outcome of the bucket.
func (b Bucket) Total() int {
	n := b.OK + b.Unclassified
	for _, c := range b.Classes {
		n += c
	}
	return n
}

// Health is one provider's health over the period.
type Health struct {
	// Start is the state at the start of the period (from the latest
	// record before it; "" when there was none: no trouble recorded).
	Start string `json:"start,omitempty"`
	// Spans cover the period, one per state in force.
	Spans []Span `json:"spans"`
	// Outages counts entries into outage; OutageMS sums, within the
	// period, the time from each to the provider's recovery (recovered or
	// healthy): the recovering phase, health degraded, included, as the
	// recovered record's reason counts "the outage lasted".
	Outages  int   `json:"outages"`
	OutageMS int64 `json:"outage_ms"`
	// DegradedMS sums the time degraded outside outages (rate-limited on
	// every profile, failing a large share of calls) within the period.
	DegradedMS int64 `json:"degraded_ms"`
}

// Span is a state in force from From to To.
type Span struct {
	State  string      `json:"state"`
	From   events.Time `json:"from"`
	To     events.Time `json:"to"`
	Reason string      `json:"reason,omitempty"`
}

// Retries are the retry figures.
type Retries struct {
	// Scheduled counts retry decisions, Due the retries that came due,
	// GivenUp the give_up decisions.
	Scheduled int `json:"scheduled"`
	Due       int `json:"due"`
	GivenUp   int `json:"given_up"`
	// Started and Cancelled count the agents' answers to scheduled
	// retries (from the retry ledger).
	Started   int `json:"started"`
	Cancelled int `json:"cancelled"`
	// ByProvider splits scheduled and given up by provider.
	ByProvider map[string]*ProviderRetries `json:"by_provider"`
}

// ProviderRetries are one provider's retry figures.
type ProviderRetries struct {
	Scheduled int `json:"scheduled"`
	GivenUp   int `json:"given_up"`
}

// Overruled is one kind of overruled classification.
type Overruled struct {
	Provider string `json:"provider"`
	// Claimed is what a heuristic or upstream_code said; Class what the
	// evidence made of it; Rule the rule that decided.
	Claimed string `json:"claimed"`
	Class   string `json:"class"`
	Rule    string `json:"rule"`
	Count   int    `json:"count"`
	// Evidence is the evidence of the first one; Examples up to three
	// outcome ids.
	Evidence []string `json:"evidence,omitempty"`
	Examples []string `json:"examples"`
}

// Refusals are the refusal-tier figures: segments are (segment, provider)
// pairs.
type Refusals struct {
	// Refused counts content refusals; Segments the distinct segments they
	// hit.
	Refused  int `json:"refused"`
	Segments int `json:"segments"`
	// Rerendered counts rerender decisions; Skipped the segments told to
	// skip the provider; Frozen those skipped with no re-probe left.
	Rerendered int                          `json:"rerendered"`
	Skipped    int                          `json:"skipped"`
	Frozen     int                          `json:"frozen"`
	ByProvider map[string]*ProviderRefusals `json:"by_provider"`
}

// ProviderRefusals are one provider's refusal figures.
type ProviderRefusals struct {
	Refused    int `json:"refused"`
	Segments   int `json:"segments"`
	Rerendered int `json:"rerendered"`
	Skipped    int `json:"skipped"`
	Frozen     int `json:"frozen"`
}

// Notifications are the notifier's figures: requests, and what it decided
// about them (its audit records).
type Notifications struct {
	// Requested counts notification requests by severity.
	Requested map[string]int `json:"requested"`
	// Sent counts deliveries to sinks, Held requests held back by the
	// daily budget, Deduped repeats of a dedupe key, Failed failed
	// attempts (FailedFinal of them dead-lettered), Unrouted requests no
	// sink takes.
	Sent        int `json:"sent"`
	Held        int `json:"held"`
	Deduped     int `json:"deduped"`
	Failed      int `json:"failed"`
	FailedFinal int `json:"failed_final"`
	Unrouted    int `json:"unrouted"`
	// BySeverity splits the decisions by severity.
	BySeverity map[string]*SeverityNotifications `json:"by_severity"`
}

// SeverityNotifications are one severity's notifier decisions.
type SeverityNotifications struct {
	Sent     int `json:"sent"`
	Held     int `json:"held"`
	Deduped  int `json:"deduped"`
	Failed   int `json:"failed"`
	Unrouted int `json:"unrouted"`
}

// DeadLetters are the dead letters by service and reason.
type DeadLetters struct {
	Total     int            `json:"total"`
	ByService map[string]int `json:"by_service"`
	// ByReason groups them by service and reason, most first.
	ByReason []ReasonCount `json:"by_reason"`
}

// ReasonCount is one (service, reason) and how often.
type ReasonCount struct {
	Service string `json:"service"`
	Reason  string `json:"reason"`
	Count   int    `json:"count"`
}

// Recovery is one recovery run (one outage of one provider).
type Recovery struct {
	ID              string      `json:"recovery_id"`
	Provider        string      `json:"provider"`
	OutageStartedAt events.Time `json:"outage_started_at"`
	RecoveredAt     events.Time `json:"recovered_at"`
	// Steps are the checklist steps recorded, in order.
	Steps []string `json:"steps"`
	Done  bool     `json:"done"`
	// LastAt is when its latest record was made.
	LastAt       events.Time `json:"last_at"`
	Killed       int         `json:"killed"`
	CronsRerun   int         `json:"crons_rerun"`
	CronsMissed  int         `json:"crons_missed"`
	Writes       int         `json:"writes"`
	Redispatched int         `json:"redispatched"`
	Released     int         `json:"released"`
}

// PolicyChange is one policy change the scheduler recorded.
type PolicyChange struct {
	At        events.Time `json:"at"`
	Kind      string      `json:"kind"`
	Source    string      `json:"source"`
	PolicyKey string      `json:"policy_key,omitempty"`
	Error     string      `json:"error,omitempty"`
}

// bucketSizes are the bucket widths a report picks from: the smallest that
// gives at most maxBuckets.
var bucketSizes = []time.Duration{
	time.Minute, 5 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour,
	2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour,
}

// maxBuckets bounds the bars of a series: one bar stays wide enough to see.
const maxBuckets = 36

// fineBuckets bounds the buckets records are first counted in: the
// smallest bucket size that divides the period into at most this many.
// The series are drawn in coarser ones at the end (axis), chosen over the
// span the records cover.
const fineBuckets = 2048

// BucketFor is the bucket width for a period of length d.
func BucketFor(d time.Duration) time.Duration {
	for _, s := range bucketSizes {
		if d <= s*maxBuckets {
			return s
		}
	}
	return bucketSizes[len(bucketSizes)-1]
}

// aggregator folds records into a Report.
type aggregator struct {
	r      *Report
	shadow *shadowing // nil unless asked for
	from   time.Time
	to     time.Time
	bucket time.Duration
	n      int // buckets

	outcomes   map[string]outcomeSeen // outcome id → where it was counted
	classified map[string]bool        // outcome ids with a classification
	segmentOf  map[string]segProv     // content_refusal outcome id → its segment
	refused    map[segProv]bool
	skipped    map[segProv]bool
	frozen     map[segProv]bool
	overruled  map[[4]string]*Overruled
	reasons    map[[2]string]int
	recoveries map[string]*Recovery
	ledger     map[string]*[2]bool // retry id → started, cancelled
	health     map[string][]events.Health
	healthPre  map[string]events.Health // latest before the period
	downPre    map[string]bool          // in an outage (recovering included) when the period began
}

type outcomeSeen struct {
	provider string
	bucket   int
}

type segProv struct{ segment, provider string }

func newAggregator(from, to time.Time) *aggregator {
	bucket := bucketSizes[len(bucketSizes)-1]
	for _, s := range bucketSizes {
		if to.Sub(from) <= s*fineBuckets {
			bucket = s
			break
		}
	}
	start := from.Truncate(bucket)
	n := int((to.Sub(start) + bucket - 1) / bucket)
	n = max(n, 1)
	r := &Report{
		From: events.At(from), To: events.At(to), BucketMS: bucket.Milliseconds(),
		Providers: map[string]*Provider{}, Classes: map[string]int{}, Health: map[string]*Health{},
		Decisions:     map[string]int{},
		Retries:       Retries{ByProvider: map[string]*ProviderRetries{}},
		Refusals:      Refusals{ByProvider: map[string]*ProviderRefusals{}},
		Notifications: Notifications{Requested: map[string]int{}, BySeverity: map[string]*SeverityNotifications{}},
		DeadLetters:   DeadLetters{ByService: map[string]int{}},
		Overruled:     []Overruled{}, Recoveries: []Recovery{}, PolicyChanges: []PolicyChange{},
		Undecodable: map[string]int{}, Notes: []string{},
	}
	for i := range n {
		r.Buckets = append(r.Buckets, events.At(start.Add(time.Duration(i)*bucket)))
	}
	return &aggregator{
		r: r, from: from, to: to, bucket: bucket, n: n,
		outcomes: map[string]outcomeSeen{}, classified: map[string]bool{}, segmentOf: map[string]segProv{},
		refused: map[segProv]bool{}, skipped: map[segProv]bool{}, frozen: map[segProv]bool{},
		overruled: map[[4]string]*Overruled{}, reasons: map[[2]string]int{}, recoveries: map[string]*Recovery{},
		ledger: map[string]*[2]bool{}, health: map[string][]events.Health{}, healthPre: map[string]events.Health{}, downPre: map[string]bool{},
	}
}

// bucketOf is the bucket of a record's own time at when it is believed
// (events.EventTime: not ahead of its store time, not more than 30 days
// behind), else of its store time; a time outside the period counts in
// Outside and lands in the nearest edge bucket.
func (a *aggregator) bucketOf(at events.Time, stored time.Time) int {
	t, _ := events.EventTime(at, stored) // the time the services go by
	if stored.IsZero() && t.IsZero() {
		t = a.from
	}
	start := a.r.Buckets[0].Time
	if t.Before(a.from) || !t.Before(a.to) {
		a.r.Outside++
	}
	i := int(t.Sub(start) / a.bucket)
	if t.Before(start) {
		i = 0
	}
	return min(max(i, 0), a.n-1)
}

func (a *aggregator) provider(name string) *Provider {
	p := a.r.Providers[name]
	if p == nil {
		p = &Provider{Classes: map[string]int{}, Series: make([]Bucket, a.n)}
		a.r.Providers[name] = p
	}
	return p
}

func (a *aggregator) outcome(o *events.Outcome, stored time.Time) {
	a.r.Totals.Outcomes++
	p := a.provider(o.Provider)
	p.Outcomes++
	a.outcomes[o.ID] = outcomeSeen{provider: o.Provider, bucket: a.bucketOf(o.At, stored)}
}

func (a *aggregator) classification(c *events.Classification, stored time.Time) {
	a.r.Totals.Classifications++
	a.classified[c.OutcomeID] = true
	p := a.provider(c.Provider)
	b := &p.Series[a.bucketOf(c.At, stored)]
	a.r.Classes[c.Class]++
	if c.Class == events.ClassOK {
		a.r.Totals.OK++
		p.OK++
		b.OK++
	} else {
		a.r.Totals.Failures++
		p.Failures++
		p.Classes[c.Class]++
		if b.Classes == nil {
			b.Classes = map[string]int{}
		}
		b.Classes[c.Class]++
	}
	if c.Overruled != "" {
		k := [4]string{c.Provider, c.Overruled, c.Class, c.Rule}
		o := a.overruled[k]
		if o == nil {
			o = &Overruled{Provider: c.Provider, Claimed: c.Overruled, Class: c.Class, Rule: c.Rule, Evidence: c.Evidence}
			a.overruled[k] = o
		}
		o.Count++
		if len(o.Examples) < 3 {
			o.Examples = append(o.Examples, c.OutcomeID)
		}
	}
	if c.Class == events.ClassContentRefusal {
		sp := segProv{events.SegmentKey(c.Session, c.Segment), c.Provider}
		a.segmentOf[c.OutcomeID] = sp
		a.refused[sp] = true
		a.r.Refusals.Refused++
		a.refusalsOf(c.Provider).Refused++
	}
}

func (a *aggregator) refusalsOf(provider string) *ProviderRefusals {
	p := a.r.Refusals.ByProvider[provider]
	if p == nil {
		p = &ProviderRefusals{}
		a.r.Refusals.ByProvider[provider] = p
	}
	return p
}

func (a *aggregator) retriesOf(provider string) *ProviderRetries {
	p := a.r.Retries.ByProvider[provider]
	if p == nil {
		p = &ProviderRetries{}
		a.r.Retries.ByProvider[provider] = p
	}
	return p
}

func (a *aggregator) decision(d *events.Decision) {
	a.r.Totals.Decisions++
	a.r.Decisions[d.Action]++
	switch d.Action {
	case events.ActionRetry:
		a.r.Retries.Scheduled++
		a.retriesOf(d.Provider).Scheduled++
	case events.ActionGiveUp:
		a.r.Retries.GivenUp++
		a.retriesOf(d.Provider).GivenUp++
	case events.ActionRerender:
		a.r.Refusals.Rerendered++
		a.refusalsOf(d.Provider).Rerendered++
	case events.ActionSkipProvider:
		sp, ok := a.segmentOf[d.OutcomeID]
		if !ok {
			sp = segProv{"?" + d.OutcomeID, d.Provider} // its refusal lies before the period
		}
		a.skipped[sp] = true
		if d.DueAt.IsZero() {
			a.frozen[sp] = true // no re-probe left: frozen until a boundary
		}
	}
}

func (a *aggregator) retryDue() { a.r.Retries.Due++ }

// ledgerEntry counts an agent's answer to a retry (the ledger keeps the
// record and then a copy with the mark).
func (a *aggregator) ledgerEntry(retryID string, started, cancelled bool) {
	e := a.ledger[retryID]
	if e == nil {
		e = &[2]bool{}
		a.ledger[retryID] = e
	}
	e[0] = e[0] || started
	e[1] = e[1] || cancelled
}

// healthRecord keeps a health change: before the period it only sets the
// starting state.
func (a *aggregator) healthRecord(h *events.Health, stored time.Time) {
	if h.At.IsZero() {
		h.At = events.At(stored)
	}
	if stored.Before(a.from) {
		if cur, ok := a.healthPre[h.Provider]; !ok || !h.At.Before(cur.At.Time) {
			a.healthPre[h.Provider] = *h
		}
		switch h.State { // a degraded record after an outage is its recovering
		case events.HealthOutage:
			a.downPre[h.Provider] = true
		case events.HealthRecovered, events.HealthHealthy:
			a.downPre[h.Provider] = false
		}
		return
	}
	if !stored.Before(a.to) {
		return
	}
	a.r.Totals.HealthChanges++
	a.health[h.Provider] = append(a.health[h.Provider], *h)
}

func (a *aggregator) notification(n *events.Notification) {
	a.r.Totals.Notifications++
	a.r.Notifications.Requested[n.Severity]++
}

// notifyAudit counts one notifier decision (kinds of pkg/notify).
func (a *aggregator) notifyAudit(kind, severity string, final bool) {
	n := &a.r.Notifications
	s := n.BySeverity[severity]
	if s == nil {
		s = &SeverityNotifications{}
		n.BySeverity[severity] = s
	}
	switch kind {
	case "sent":
		n.Sent++
		s.Sent++
	case "held_by_budget":
		n.Held++
		s.Held++
	case "deduped":
		n.Deduped++
		s.Deduped++
	case "failed":
		n.Failed++
		s.Failed++
		if final {
			n.FailedFinal++
		}
	case "unrouted":
		n.Unrouted++
		s.Unrouted++
	}
}

func (a *aggregator) deadLetter(service, reason string) {
	a.r.Totals.DeadLetters++
	a.r.DeadLetters.Total++
	a.r.DeadLetters.ByService[service]++
	a.reasons[[2]string{service, reason}]++
}

func (a *aggregator) recovery(rec *events.Recovery) {
	a.r.Totals.RecoveryRecords++
	r := a.recoveries[rec.RecoveryID]
	if r == nil {
		r = &Recovery{ID: rec.RecoveryID, Provider: rec.Provider, OutageStartedAt: rec.OutageStartedAt, RecoveredAt: rec.RecoveredAt, Steps: []string{}}
		a.recoveries[rec.RecoveryID] = r
	}
	if rec.Step != "" && !slices.Contains(r.Steps, rec.Step) {
		r.Steps = append(r.Steps, rec.Step)
	}
	r.Done = r.Done || rec.Done
	if rec.At.After(r.LastAt.Time) {
		r.LastAt = rec.At
	}
	if r.RecoveredAt.IsZero() {
		r.RecoveredAt = rec.RecoveredAt
	}
	r.Killed += len(rec.Killed)
	r.CronsRerun += len(rec.CronsRerun)
	r.CronsMissed += len(rec.CronsMissed)
	r.Writes += len(rec.Writes)
	r.Redispatched += len(rec.Redispatched)
	r.Released += rec.Released
}

func (a *aggregator) policyChange(p PolicyChange) {
	a.r.PolicyChanges = append(a.r.PolicyChanges, p)
}

// finish computes what needs every record: joins, distinct counts,
// timelines, sorted lists.
func (a *aggregator) finish(now time.Time) *Report {
	r := a.r
	r.GeneratedAt = events.At(now)
	for id, o := range a.outcomes {
		if !a.classified[id] {
			p := a.provider(o.provider)
			p.Unclassified++
			p.Series[o.bucket].Unclassified++
		}
	}
	// Refusal segments.
	r.Refusals.Segments = len(a.refused)
	for sp := range a.refused {
		a.refusalsOf(sp.provider).Segments++
	}
	r.Refusals.Skipped = len(a.skipped)
	for sp := range a.skipped {
		a.refusalsOf(sp.provider).Skipped++
	}
	r.Refusals.Frozen = len(a.frozen)
	for sp := range a.frozen {
		a.refusalsOf(sp.provider).Frozen++
	}
	// Retry answers.
	for _, e := range a.ledger {
		if e[0] {
			r.Retries.Started++
		}
		if e[1] {
			r.Retries.Cancelled++
		}
	}
	// Overruled, most first.
	for _, o := range a.overruled {
		r.Overruled = append(r.Overruled, *o)
	}
	slices.SortFunc(r.Overruled, func(x, y Overruled) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), strings.Compare(x.Provider, y.Provider),
			strings.Compare(x.Claimed, y.Claimed), strings.Compare(x.Class, y.Class), strings.Compare(x.Rule, y.Rule))
	})
	// Dead letters by reason, most first.
	for k, n := range a.reasons {
		r.DeadLetters.ByReason = append(r.DeadLetters.ByReason, ReasonCount{Service: k[0], Reason: k[1], Count: n})
	}
	slices.SortFunc(r.DeadLetters.ByReason, func(x, y ReasonCount) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), strings.Compare(x.Service, y.Service), strings.Compare(x.Reason, y.Reason))
	})
	if r.DeadLetters.ByReason == nil {
		r.DeadLetters.ByReason = []ReasonCount{}
	}
	// Recoveries by outage start.
	for _, rec := range a.recoveries {
		r.Recoveries = append(r.Recoveries, *rec)
	}
	slices.SortFunc(r.Recoveries, func(x, y Recovery) int {
		return cmp.Or(x.OutageStartedAt.Compare(y.OutageStartedAt.Time), strings.Compare(x.ID, y.ID))
	})
	// Health timelines: every provider seen in the period or with trouble
	// before it.
	names := map[string]bool{}
	for p := range a.health {
		names[p] = true
	}
	for p, h := range a.healthPre {
		if h.State != events.HealthHealthy {
			names[p] = true
		}
	}
	for _, p := range slices.Sorted(maps.Keys(names)) {
		r.Health[p] = a.timeline(p)
	}
	a.axis()
	return r
}

// axis chooses the buckets the series are drawn in, and folds the fine
// buckets the records were counted in into them: over the span the
// records cover within the period (outcomes, classifications, health
// changes), not the whole period — a day asked for whose records fill its
// last two minutes is drawn over those two minutes, not as 24 hourly bars
// with everything in the last — in the smallest bucket size that is a
// whole number of fine buckets and gives at most maxBuckets bars. With no
// record, the period.
func (a *aggregator) axis() {
	first, last := -1, -1
	mark := func(i int) {
		if first < 0 || i < first {
			first = i
		}
		last = max(last, i)
	}
	for _, p := range a.r.Providers {
		for i, b := range p.Series {
			if b.Total() > 0 {
				mark(i)
			}
		}
	}
	for _, hs := range a.health {
		for _, h := range hs {
			t := clamp(h.At.Time, a.from, a.to.Add(-time.Nanosecond))
			mark(min(max(int(t.Sub(a.r.Buckets[0].Time)/a.bucket), 0), a.n-1))
		}
	}
	if first < 0 {
		first, last = 0, a.n-1
	}
	lo, hi := a.r.Buckets[first].Time, a.r.Buckets[last].Add(a.bucket)
	size := a.bucket
	for _, s := range bucketSizes {
		if s >= a.bucket && s%a.bucket == 0 {
			size = s
			if hi.Sub(lo.Truncate(s)) <= s*maxBuckets {
				break
			}
		}
	}
	start := lo.Truncate(size)
	n := max(1, int((hi.Sub(start)+size-1)/size))
	fine := a.r.Buckets
	a.r.Buckets = make([]events.Time, n)
	for i := range n {
		a.r.Buckets[i] = events.At(start.Add(time.Duration(i) * size))
	}
	a.r.BucketMS = size.Milliseconds()
	for _, p := range a.r.Providers {
		series := make([]Bucket, n)
		for i, b := range p.Series {
			if b.Total() == 0 {
				continue
			}
			j := min(max(int(fine[i].Sub(start)/size), 0), n-1)
			to := &series[j]
			to.OK += b.OK
			to.Unclassified += b.Unclassified
			for c, v := range b.Classes {
				if to.Classes == nil {
					to.Classes = map[string]int{}
				}
				to.Classes[c] += v
			}
		}
		p.Series = series
	}
}

// timeline builds one provider's spans over the period.
func (a *aggregator) timeline(provider string) *Health {
	h := &Health{Spans: []Span{}}
	recs := a.health[provider]
	slices.SortStableFunc(recs, func(x, y events.Health) int { return x.At.Compare(y.At.Time) })
	state, reason := events.HealthHealthy, ""
	down := false // from an outage until recovered or healthy
	if pre, ok := a.healthPre[provider]; ok {
		h.Start, state, reason = pre.State, pre.State, pre.Reason
		down = a.downPre[provider]
	}
	if state == events.HealthOutage {
		h.Outages++
	}
	from := a.from
	add := func(to time.Time) {
		if !to.After(from) {
			return
		}
		if n := len(h.Spans); n > 0 && h.Spans[n-1].State == state {
			h.Spans[n-1].To = events.At(to)
		} else {
			h.Spans = append(h.Spans, Span{State: state, From: events.At(from), To: events.At(to), Reason: reason})
		}
		switch {
		case down:
			h.OutageMS += to.Sub(from).Milliseconds()
		case state == events.HealthDegraded:
			h.DegradedMS += to.Sub(from).Milliseconds()
		}
		from = to
	}
	for _, rec := range recs {
		add(clamp(rec.At.Time, a.from, a.to))
		if rec.State == events.HealthOutage && !down {
			h.Outages++
		}
		state, reason = rec.State, rec.Reason
		switch state {
		case events.HealthOutage:
			down = true
		case events.HealthRecovered, events.HealthHealthy:
			down = false
		}
	}
	add(a.to)
	return h
}

// clamp returns t within [lo, hi].
func clamp(t, lo, hi time.Time) time.Time {
	switch {
	case t.Before(lo):
		return lo
	case t.After(hi):
		return hi
	}
	return t
}
