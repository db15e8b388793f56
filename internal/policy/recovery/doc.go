// Package recovery is the post-outage checklist as a pure state machine
// (docs/CONTRACT.md § "Recovery"): the held
// task queue, the outage probes and the seven steps that run once a
// provider's health says recovered. "This checklist looks simple, but if it
// is not defined in advance a step gets missed" — so it is defined here,
// once, and runs the same in the recovery service (internal/service/recoverer,
// on KV buckets and streams) and in `failbus simulate` (memstore, virtual
// clock).
//
// The rules, numbered as the code repeats them:
//
//  1. Tasks are held, never dropped. A task whose provider is up and holds
//     nothing is dispatched at once (attempt 1). While the provider is down
//     — health outage, or degraded while recovering from one — and until
//     the release has drained its queue, the task waits where it was
//     stored (FAILBUS_TASKS); the provider's record only keeps the range of
//     stream sequences to release and a cursor. A task without a provider
//     belongs to every provider: it waits while any provider is down.
//  2. Released in submission order (stream order, hence each agent's order)
//     at most recovery.drain_rate per second: each task is claimed with its
//     release time, and the next release's time, in one compare-and-set on
//     the provider's record, so replicas pace the release together; each
//     (task id, attempt) is dispatched once, whatever the replicas,
//     restarts or dedupe windows (the ledger).
//  3. Probes end an outage. While the provider is down, every
//     recovery.probe_interval one agent that used it — those holding on
//     wait_provider first, in turn — is asked for one real call (control
//     probe). Who used it and who holds is read when the probe is due
//     (Usage: each agent's latest outcome and latest decision), with the
//     agents that reported themselves (heartbeats, cron and write
//     reports); the compare-and-set on the provider's record is the claim, so
//     one probe goes out per interval across replicas. A configured HTTP
//     probe runs at the same times (service only).
//  4. Flapping: outage → degraded → outage … is one episode (one recovery
//     id, one checklist); nothing is released and no step runs until the
//     health says recovered, which the fault scope only says after its
//     hysteresis. A new outage during a checklist pauses it (nothing is sent
//     to a provider that is down) and it resumes after that outage, which
//     then gets its own checklist.
//  5. The checklist, once recovered, in order, each step planned (saved in
//     the provider's record before anything of it is sent) and then sent:
//     its commands, then its record on failbus.recovery.<provider>, before
//     the next step is planned:
//     confirm; subagents (every subagent of the provider whose latest
//     heartbeat says running); kill (of those, the stale ones: latest
//     heartbeat older than stale_after, default 3 × its interval — checked
//     again against the newest heartbeats, so a subagent that just beat is
//     never killed); crons (each scheduled time inside the outage without an
//     ok run: within the catch-up window re-run by catch-up mode, the rest
//     listed with why; once per (agent, cron, scheduled_at)); writes (writes
//     that failed in the outage and were not written again since:
//     check_write each); redispatch (the killed subagents' tasks as attempt
//     + 1); release (rule 2, then a record with done: true and one normal
//     notification recovery:<provider>:<outage start, epoch ms>).
//  6. Every command has an id derived from what it is about (DispatchID,
//     CronRerunID, KillID, WriteCheckID, "recovery:<recovery id>:<step>", …): it
//     is its Nats-Msg-Id and its ledger key. A command is sent only if the
//     ledger lacks it and recorded there once the stream stored it, so a
//     crash anywhere — before or after any save, publish or ledger write —
//     repeats nothing and skips nothing (TestCrashAnywhereRepeats…). A
//     command planned longer ago than half the stream's dedupe window and
//     missing from the ledger is looked for in the stream before it is
//     published again (Publisher).
//
// The Core keeps no state between calls: everything is in the Store, so
// several replicas (and the goroutines of one) may drive it at once.
package recovery
