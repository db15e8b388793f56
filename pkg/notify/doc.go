// Package notify holds the sinks that carry failbus notifications to
// humans (webhook, Slack, ntfy, SMTP, PagerDuty, the log), the Sink
// interface a sink of your own implements, and the webhook signature a
// receiver verifies (Sign, HeaderSignature).
//
// The notifier service drives them: it sends each dedupe key once, within
// a daily budget for non-critical notifications, and retries a failed
// send with the same Delivery.IdempotencyKey. A sink that deduplicates on
// that key (Idempotent: PagerDuty, a webhook marked idempotent) sees a
// notification exactly once even when a notifier replica crashes
// mid-send; any other sink sees it at least once and rarely twice.
// Package sinktest is the conformance suite every sink passes.
package notify
