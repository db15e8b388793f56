// Package delivery is the notifier service's engine: it delivers failbus
// notification requests to humans through pkg/notify's sinks (webhook,
// Slack, ntfy, SMTP, PagerDuty, log), each dedupe key once, within a daily
// budget for non-critical ones, with every decision recorded.
//
// People stop reading a channel that repeats itself and get hurt by one that
// goes quiet, so the package is built around two promises: one notification
// per state, and none dropped silently.
//
// # The ledger: exactly once per dedupe key
//
// Every dedupe key has one entry in the KV bucket FAILBUS_NOTIFY_DEDUPE
// (LedgerEntry, key LedgerKey). A request claims its key with a create-only
// write before anything is sent; only the request holding the claim sends.
// Every later change is a compare-and-set on the entry's revision, so
// replicas never both own a key, and a restart resumes from the bucket.
//
//   - A key already sent within its lifetime (Config.DedupeLifetime,
//     default 7 days) is deduplicated: audit record, no send.
//   - A key claimed by another request whose lease (Config.ClaimLease) has
//     not run out, or waiting for its request's redelivery after a failed
//     send, is deduplicated too: that request is responsible and is not
//     acknowledged until it is sent or dead-lettered.
//   - A claim whose lease ran out belongs to a replica that crashed or
//     stalled. The next request for the key, typically the same request
//     redelivered by JetStream, takes it over by compare-and-set.
//   - Each sink's success is recorded before the request is acknowledged;
//     a sink already sent is never sent again, even when another sink of
//     the same notification keeps failing.
//
// # A crash between claim and send
//
// A replica can die after claiming a key and before recording the send:
// before the send, during it, or after the receiver accepted it. From the
// ledger these look the same (a claim with a lease), and nothing can tell
// them apart, because the send happened outside the bus. The notifier
// treats the claim as unsent: after the lease, the request is redelivered,
// takes the claim over and sends again, with the same idempotency key
// (Delivery.IdempotencyKey, the entry's Generation, kept across retries and
// takeovers and new only when a lifetime ends). So:
//
//   - a sink whose receiver deduplicates on that key (Idempotent: PagerDuty,
//     whose dedup_key is the dedupe key; a webhook marked idempotent, which
//     gets Idempotency-Key) sees the notification exactly once;
//   - any other sink (Slack, ntfy, SMTP, log, a plain webhook) sees it at
//     least once and at most twice. A replica has at most
//     Config.MaxUnconfirmed (default 1) sends to such sinks between "sent"
//     and "recorded", so one crash duplicates at most that many
//     notifications. Nothing is ever lost to a crash: the choice is a rare
//     duplicate over a silent gap.
//
// A send that gets no answer before its timeout is the same unknown seen
// from a live replica: the receiver may have taken it. It counts as a
// failed attempt and is retried with the same idempotency key, so an
// idempotent sink still sees it once; a non-idempotent one may see it
// twice. Keep route timeouts well above the receiver's normal latency.
//
// Leases compare times written by different replicas: their clocks must
// agree to well within ClaimLease minus the send timeout.
//
// # The daily budget
//
// At most Config.DailyBudget non-critical (info, normal) notifications go
// out per UTC day; critical ones always do. The count is a record per day
// in FAILBUS_NOTIFY_BUDGET (BudgetRecord), changed by compare-and-set, so
// replicas share it and it survives restarts. A notification takes its
// slot once (the ledger remembers it), so retries and takeovers never
// spend a second one; a crash between taking the slot and the first write
// of the entry loses that slot, so the budget errs on the side of fewer
// pushes. A request over the budget is held: acknowledged with a
// held_by_budget audit record, and kept on the FAILBUS_NOTIFY stream. The
// first hold of a day puts one digest request on the bus
// (DigestRequest): it bypasses the budget and says how many were held
// back, counted when it is sent, and why.
//
// # Failures
//
// A sink that fails is retried by JetStream redelivery with the route's
// backoff (RetryPolicy); a permanent answer (the request itself refused:
// bad URL, unknown recipient, revoked key) or the end of the retry budget
// sends the request to the dead-letter subject with every failing sink's
// last answer. While it waits, repeats of its key defer to it.
//
// # Audit and redaction
//
// Every decision is an Audit record on failbus.audit.<service>.<kind>
// (sent, deduped, held_by_budget, failed, unrouted), with an id derived
// from the request so a redelivery does not duplicate it. Titles, texts,
// label values and sinks' answers go through redact.String before they
// leave the process.
//
// # What is not guaranteed
//
// Exactly once holds per dedupe key within its lifetime, and only toward
// idempotent sinks when replicas crash; toward the others it is at least
// once with the bound above. Ordering between notifications is not kept.
// A notification is delivered to the sinks that match it when it is
// handled; changing the routes does not re-send earlier ones.
package delivery
