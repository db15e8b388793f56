// Package auth is who may do what on the bus: one NATS user per role
// (classifier, scheduler, notifier, recovery, agent, operator, admin), each
// allowed only the subjects its work needs, compiled from the topology
// (internal names of streams, consumers and buckets) into nats-server
// permissions, and written by `failbus auth init` as a configuration
// fragment plus one nkey seed per role (CONTRACT.md "Deployment: cluster
// and credentials").
//
// How narrow "only what it needs" is:
//
//   - Messages: a role publishes only the subjects it produces (the
//     classifier failbus.classified.> and its own dead letters; an agent
//     its own outcomes, boundaries, heartbeats, cron and write records,
//     tasks, and started/cancel marks; never a decision, health record,
//     due retry, dispatch, control, recovery step or audit record).
//   - Its durable consumers: look up, fetch from and acknowledge the
//     topology's consumers it runs, and no other; creating, changing or
//     deleting any of them is the admin's (services run with --no-apply).
//   - Reading: consumers of its own only with the filter subjects it reads
//     (the JetStream API subject of a consumer create carries the filter,
//     and the server checks that it matches the request), so an agent
//     reads decisions, due retries, dispatches and controls, not the
//     classifier's input.
//   - KV: the buckets it keeps state in, by their $KV.<bucket>.> and
//     KV_<bucket> API subjects, and no other (the classifier cannot touch
//     the notifier's dedupe ledger).
//   - Replies: each user may only subscribe to its own inbox,
//     _INBOX.<its nkey public key>.>, which internal/connect uses as the
//     inbox prefix, so no role reads another's replies (API answers, KV
//     values, route answers).
//   - The operator reads and changes nothing: info requests and single
//     messages (direct gets, the leader's message get) only, no consumer
//     at all, since a consumer create cannot be told from an update of
//     someone else's durable by its subject.
//   - Dead letters are kept: no role may delete or purge FAILBUS_DLQ, the
//     admin included (its messages are protected by the stream itself).
//
// The generic `agent` user may act for any agent name (one seed for a
// fleet). `auth init --agents a,b` adds users agent-a, agent-b whose
// subjects carry their own name only.
package auth

import (
	"fmt"

	"github.com/failbus/failbus/internal/storecheck"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Role names: the users `failbus auth init` writes.
const (
	RoleClassifier = "classifier"
	RoleScheduler  = "scheduler"
	RoleNotifier   = "notifier"
	RoleRecovery   = "recovery"
	RoleAgent      = "agent"
	RoleOperator   = "operator"
	RoleAdmin      = "admin"
)

// Role is what one user may do, in failbus terms; Permissions compiles it
// into NATS subjects.
type Role struct {
	// Name is the role (and the user's seed file, <name>.nk).
	Name string
	// Doc says in one line what the role is for; it heads the user's entry
	// in auth.conf.
	Doc string
	// Publish are the subjects whose messages the role writes.
	Publish []string
	// Consumers are the topology's durable consumers the role runs: it may
	// look them up, fetch from them and acknowledge, nothing more.
	Consumers []string
	// Read are subject filters the role reads with consumers of its own
	// (ordered, or durable ones it creates for itself), on whichever
	// streams hold them.
	Read []string
	// Lookup are streams the role reads single messages of, by subject or
	// sequence (direct get).
	Lookup []string
	// Info are streams whose info (configuration and counts, no message)
	// the role may read: nats.js (the TypeScript client) reads it before
	// it opens an ordered consumer.
	Info []string
	// Buckets are KV buckets the role reads and writes.
	Buckets []string
	// BucketsRead are KV buckets the role only reads and watches.
	BucketsRead []string
	// Purge are streams the role purges by subject (the scheduler
	// cancelling a pending schedule).
	Purge []string
	// DeleteMsgs are streams the role deletes single messages of, by
	// sequence (recovery removing a task past its agent's limits once it is
	// dead-lettered).
	DeleteMsgs []string
	// Serve are request subjects the role answers (NATS micro services);
	// it may then answer requests and $SRV discovery.
	Serve []string
	// Request are subjects the role sends requests to.
	Request []string
	// FindStreams lets the role ask which stream holds a subject
	// ($JS.API.STREAM.NAMES).
	FindStreams bool
	// NotAgents names other agents whose durable consumers
	// (durable.Name) the role may not read, look up or delete:
	// an agent-<name> user's neighbours in the same auth init.
	NotAgents []string
	// ReadAll lets the role read everything and change nothing (operator).
	ReadAll bool
	// All lets the role do anything (admin).
	All bool
}

// dlq is the dead-letter subject of each service name, and its store
// check's (storecheck.Subject): what every runner of a service
// writes besides its outputs.
func dlq(services ...string) []string {
	out := make([]string, 0, 2*len(services))
	for _, s := range services {
		out = append(out, events.DLQSubject(s), storecheck.Subject(s))
	}
	return out
}

// Roles returns every role, in the order of auth.conf.
func Roles() []Role {
	return append(serviceRoles(), Agent("*"), operator(), admin())
}

// serviceRoles are the roles of the service binaries.
func serviceRoles() []Role {
	return []Role{
		{
			Name:      RoleClassifier,
			Doc:       "the classifier: reads every outcome (consumer classifier), writes one classification each",
			Consumers: []string{topology.ConsumerClassifier},
			// A normal notification request: an agent reached its providers
			// limit.
			Publish: append([]string{events.ClassifiedPrefix + ".>", events.NotifySubject(events.SeverityNormal)}, dlq(topology.ConsumerClassifier)...),
			// The providers each agent names (policy limits).
			Buckets: []string{topology.BucketLimits},
		},
		{
			Name: RoleScheduler,
			Doc:  "the scheduler with the refusal tiers: decisions, the retry ledger and schedules, provider health, notification requests; the refusal state and route service",
			Consumers: []string{
				topology.ConsumerScheduler, topology.ConsumerSchedulerControl,
				topology.ConsumerRefusals, topology.ConsumerRefusalBoundaries,
			},
			Publish: append([]string{
				events.DecisionPrefix + ".>",
				events.RetryPrefix + ".ledger.>",
				events.RetryPrefix + ".sched.>",
				events.HealthPrefix + ".>",
				events.NotifyPrefix + ".>",
				events.AuditPrefix + "." + RoleScheduler + ".>",
			}, dlq(topology.ConsumerScheduler, topology.ConsumerSchedulerControl,
				topology.ConsumerRefusals, topology.ConsumerRefusalBoundaries)...),
			// Fault-scope history, health at start, and whether a retry
			// already came due.
			Read:        []string{events.ClassifiedPrefix + ".>", events.HealthPrefix + ".>", events.RetryPrefix + ".due.>"},
			Lookup:      []string{topology.StreamRetries, topology.StreamHealth},
			Purge:       []string{topology.StreamRetries},
			Buckets:     []string{topology.BucketRefusals, topology.BucketScope},
			BucketsRead: []string{topology.BucketPolicy},
			Serve:       []string{events.RefusalRouteSubject},
		},
		{
			Name:      RoleNotifier,
			Doc:       "the notifier: reads notification requests (consumer notifier), keeps the dedupe ledger and daily budget, audits every decision",
			Consumers: []string{topology.ConsumerNotifier},
			Publish: append([]string{
				events.AuditPrefix + "." + RoleNotifier + ".>",
				events.NotifyPrefix + ".>", // the daily budget digest
			}, dlq(topology.ConsumerNotifier)...),
			Buckets: []string{topology.BucketNotifyDedupe, topology.BucketNotifyBudget},
		},
		{
			// What CONTRACT.md § Recovery implies; the service is being
			// built, and its engineer checks this against what it does.
			Name: RoleRecovery,
			Doc:  "the recovery service: reads health, heartbeats, cron and write reports and tasks, and looks up outcomes and decisions for its probes; sends dispatches, controls, recovery steps and notifications",
			Consumers: []string{
				topology.ConsumerRecovery, topology.ConsumerRecoveryHeartbeats, topology.ConsumerRecoveryReports,
				topology.ConsumerRecoveryTasks,
			},
			Publish: append([]string{
				events.DispatchPrefix + ".>", events.ControlPrefix + ".>", events.RecoveryPrefix + ".>",
				events.NotifyPrefix + ".>",
				events.AuditPrefix + "." + RoleRecovery + ".>",
				// Its built-in HTTP probes report like an agent (origin probe).
				events.OutcomePrefix + ".>",
			}, dlq(topology.ConsumerRecovery, topology.ConsumerRecoveryHeartbeats, topology.ConsumerRecoveryReports,
				topology.ConsumerRecoveryTasks)...),
			Read: []string{
				events.HealthPrefix + ".>", events.HeartbeatPrefix + ".>", events.Prefix + ".cron.>", events.WritePrefix + ".>",
				events.TaskPrefix + ".>", events.DispatchPrefix + ".>", events.RecoveryPrefix + ".>", events.ControlPrefix + ".>",
				// Whether what it sent before a crash is stored.
				events.NotifyPrefix + ".>",
			},
			FindStreams: true,
			Lookup: []string{
				topology.StreamHealth, topology.StreamTasks, topology.StreamDispatch, topology.StreamRecoveries,
				topology.StreamControl, topology.StreamLiveness, topology.StreamReports,
				// The probe targets: each agent's latest outcome and decision.
				topology.StreamOutcomes, topology.StreamDecisions,
			},
			Buckets:    []string{topology.BucketHeartbeats, topology.BucketCrons, topology.BucketRecovery, topology.BucketLimits},
			DeleteMsgs: []string{topology.StreamTasks},
		},
	}
}

// Agent is the role of an agent called name; "*" is the generic agent
// role, allowed to act for any agent. An agent reports (outcomes,
// boundaries, heartbeats, cron and write records, tasks, started and
// cancel marks) and reads what the bus sends it (decisions, due retries,
// dispatches, controls) through consumers of its own; it asks the refusal
// route. It may not publish anything the services decide.
func Agent(name string) Role {
	a := name
	if a != "*" {
		a = events.Token(name)
	}
	r := Role{
		Name: RoleAgent,
		Doc:  "agents: report outcomes, boundaries, heartbeats, cron and write records, tasks; read their decisions, due retries, dispatches and controls",
		Publish: []string{
			events.OutcomePrefix + ".*." + a,
			events.SegmentPrefix + "." + a,
			events.HeartbeatPrefix + "." + a,
			events.CronSpecPrefix + "." + a,
			events.CronRunPrefix + "." + a,
			events.WritePrefix + "." + a,
			events.TaskPrefix + ".*." + a,
			events.RetryPrefix + ".started." + a,
			events.RetryPrefix + ".cancel." + a,
		},
		Read: []string{
			events.DecisionPrefix + "." + a,
			events.RetryPrefix + ".due." + a,
			events.DispatchPrefix + "." + a,
			events.ControlPrefix + "." + a,
			// A held call resumes when its provider's health says so.
			events.HealthPrefix + ".>",
		},
		Request: []string{events.RefusalRouteSubject},
		// What it reads, for the TypeScript client's ordered readers. With
		// a subjects filter the info also lists which agents' subjects
		// hold messages (names and counts, not contents).
		Info: []string{topology.StreamDecisions, topology.StreamRetries, topology.StreamDispatch, topology.StreamControl, topology.StreamHealth},
	}
	if name != "*" {
		r.Name = RoleAgent + "-" + a
		r.Doc = fmt.Sprintf("agent %s only: like agent, with its own name in every subject", name)
	}
	return r
}

func operator() Role {
	return Role{
		Name:    RoleOperator,
		Doc:     "operators: read every stream, consumer and bucket (tail, report, shadow, lag, health, dlq ls/show) with direct gets and info requests; publish nothing, change nothing: no consumer created, updated, deleted, fetched from or acknowledged, its own included",
		ReadAll: true,
	}
}

func admin() Role {
	return Role{
		Name: RoleAdmin,
		Doc:  "the admin: creates and changes streams, consumers and buckets (failbus apply), requeues dead letters, sets the policy in KV; everything but deleting or purging FAILBUS_DLQ",
		All:  true,
		// Declared for the table: the buckets only the admin writes.
		Buckets: []string{topology.BucketPolicy, topology.BucketDLQRequeues},
	}
}
