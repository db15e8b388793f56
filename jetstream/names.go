package topology

// Stream names. They are a contract: operators tail and replay
// them by name, and the files under streams/ carry the same names.
const (
	// StreamOutcomes holds failbus.outcome.<provider>.<agent> and
	// failbus.segment.<agent>: the raw evidence everything is derived from.
	StreamOutcomes = "FAILBUS_OUTCOMES"
	// StreamClassified holds failbus.classified.<provider>.<class>.
	StreamClassified = "FAILBUS_CLASSIFIED"
	// StreamHealth holds failbus.health.<provider>.
	StreamHealth = "FAILBUS_HEALTH"
	// StreamDecisions holds failbus.decision.<agent>.
	StreamDecisions = "FAILBUS_DECISIONS"
	// StreamRetries holds failbus.retry.>: the retry ledger, the pending
	// schedules and the due retries JetStream's scheduler writes. It is the
	// one stream with message schedules and per-message TTLs enabled.
	StreamRetries = "FAILBUS_RETRIES"
	// StreamNotify holds failbus.notify.<severity>.
	StreamNotify = "FAILBUS_NOTIFY"
	// StreamControl holds failbus.control.<agent>.
	StreamControl = "FAILBUS_CONTROL"
	// StreamTasks holds failbus.task.<provider>.…: work held while a
	// provider is down.
	StreamTasks = "FAILBUS_TASKS"
	// StreamLiveness holds failbus.heartbeat.<agent>: subagent heartbeats,
	// folded by recovery into the latest per subagent (BucketHeartbeats).
	StreamLiveness = "FAILBUS_LIVENESS"
	// StreamReports holds failbus.cron.spec.<agent>, failbus.cron.run.<agent>
	// and failbus.write.<agent>: what the recovery checklist reads back over
	// an outage (which crons ran, which writes failed).
	StreamReports = "FAILBUS_REPORTS"
	// StreamDispatch holds failbus.dispatch.<agent>: tasks released to their
	// agents by recovery.
	StreamDispatch = "FAILBUS_DISPATCH"
	// StreamRecoveries holds failbus.recovery.<provider>: each recovery
	// checklist step as it was done.
	StreamRecoveries = "FAILBUS_RECOVERIES"
	// StreamDLQ holds failbus.dlq.<service>: dead letters with the reason
	// and the original bytes.
	StreamDLQ = "FAILBUS_DLQ"
	// StreamAudit holds failbus.audit.<service>.<kind>, e.g. every notifier
	// decision to send or suppress, so a missing or doubled notification can
	// be explained after the fact.
	StreamAudit = "FAILBUS_AUDIT"
	// StreamStoreCheck holds failbus.storecheck.<service>: the write an
	// idle service makes now and then to show it can still store (its
	// /healthz), the latest per service.
	StreamStoreCheck = "FAILBUS_STORECHECK"
)

// Durable pull consumer names. Each belongs to one service; the runner binds
// to it by name, so a restarted or scaled-out service resumes where the last
// one acknowledged.
const (
	// ConsumerClassifier reads StreamOutcomes (outcomes and segment
	// boundaries).
	ConsumerClassifier = "classifier"
	// ConsumerScheduler reads every classification on StreamClassified.
	ConsumerScheduler = "scheduler"
	// ConsumerSchedulerControl reads agents' started and cancel records on
	// StreamRetries (failbus.retry.started.> and failbus.retry.cancel.>), so
	// the scheduler marks the retry ledger and purges cancelled schedules.
	ConsumerSchedulerControl = "scheduler-control"
	// ConsumerRefusals reads only content refusals on StreamClassified
	// (failbus.classified.*.content_refusal), for the refusal tiers.
	ConsumerRefusals = "refusals"
	// ConsumerRefusalBoundaries reads only segment boundaries on
	// StreamOutcomes (failbus.segment.>), so the refusal tiers retire the
	// state of a session's earlier segments.
	ConsumerRefusalBoundaries = "refusals-boundaries"
	// ConsumerNotifier reads StreamNotify.
	ConsumerNotifier = "notifier"
	// ConsumerRecovery reads StreamHealth: outages and recoveries start and
	// end the recovery service's episodes.
	ConsumerRecovery = "recovery"
	// ConsumerRecoveryHeartbeats reads StreamLiveness (subagent
	// heartbeats).
	ConsumerRecoveryHeartbeats = "recovery-heartbeats"
	// ConsumerRecoveryReports reads StreamReports (cron specs and runs,
	// memory writes).
	ConsumerRecoveryReports = "recovery-reports"
	// ConsumerRecoveryTasks reads StreamTasks one message at a time (max
	// ack pending 1), so tasks are dispatched or held in submission order.
	ConsumerRecoveryTasks = "recovery-tasks"
)

// Retired consumers: durables of earlier versions that Apply deletes where
// it finds them, so nothing keeps counting messages nobody reads (a lag
// alarm on them would never clear).
const (
	// RetiredRecoveryDecisions read StreamDecisions for the recovery
	// service's probe targets, which it now reads from the outcomes and
	// decisions when a probe is due.
	RetiredRecoveryDecisions = "recovery-decisions"
)

// retired are the retired consumers and their streams.
var retired = []struct{ stream, name string }{
	{StreamDecisions, RetiredRecoveryDecisions},
}

// Retired reports whether name on stream is a durable an earlier version
// created and this one retired: nothing reads it, and Apply deletes it
// (`failbus lag` says so rather than counting it late forever).
func Retired(stream, name string) bool {
	for _, c := range retired {
		if c.stream == stream && c.name == name {
			return true
		}
	}
	return false
}

// KV bucket names. The backing streams are named KV_<bucket> by JetStream.
const (
	// BucketRefusals holds refusal state per (segment, provider).
	BucketRefusals = "FAILBUS_REFUSALS"
	// BucketScope holds the fault-scope state of each provider, shared by
	// every scheduler replica (one key per provider, compare-and-set).
	BucketScope = "FAILBUS_SCOPE"
	// BucketNotifyDedupe holds notification dedupe keys; creating a key is
	// the exactly-once gate.
	BucketNotifyDedupe = "FAILBUS_NOTIFY_DEDUPE"
	// BucketNotifyBudget holds the daily budget counters of non-critical
	// notifications.
	BucketNotifyBudget = "FAILBUS_NOTIFY_BUDGET"
	// BucketHeartbeats holds the latest heartbeat of each agent and
	// subagent.
	BucketHeartbeats = "FAILBUS_HEARTBEATS"
	// BucketCrons holds each cron's spec and first recorded run.
	BucketCrons = "FAILBUS_CRONS"
	// BucketRecovery holds the recovery service's state per provider
	// (outage episodes, checklist progress, held-task queue, probes), its
	// command ledger and its task index.
	BucketRecovery = "FAILBUS_RECOVERY"
	// BucketPolicy holds the active policy.
	BucketPolicy = "FAILBUS_POLICY"
	// BucketDLQRequeues holds one key per dead letter `failbus dlq
	// requeue` put back (or is putting back): the claim and where the copy
	// was stored, so each dead letter is requeued once.
	BucketDLQRequeues = "FAILBUS_DLQ_REQUEUES"
	// BucketLimits holds each agent's share of the shared state (the policy's
	// limits): the providers each agent names, every provider named, and
	// each agent's task bytes per day.
	BucketLimits = "FAILBUS_LIMITS"
)

// MetaRecreated is the metadata key of a durable consumer that a consumer
// runner recreated after finding it deleted; its value says when, by which
// service and at which stream sequence it starts. Such a consumer starts at
// that sequence instead of at the start of its stream, and Apply keeps that
// start instead of reporting the consumer incompatible.
const MetaRecreated = "failbus_recreated"
