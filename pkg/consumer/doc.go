// Package consumer is failbus's pluggable consumer: a runner that owns a
// durable JetStream pull consumer and calls one Handler per message, so a
// service (or a user's own cost tracker or dashboard feeder) is a function
// and nothing else.
//
// The runner does the parts that are easy to get wrong:
//
//   - It is a pipeline: it fetches in batches, runs Concurrency handlers at
//     once (messages with equal Config.Key in delivery order on one
//     worker), stores each input's outputs with async publishes and waits
//     for their acknowledgements as a window (Config.MaxInFlight, bounded
//     by the consumer's MaxAckPending) instead of one by one, and
//     acknowledges an input without waiting for the server's reply. No
//     worker waits for a round trip of the runner's own.
//   - It acknowledges an input only after every output the handler asked for
//     (Outputs.Publish) is stored by JetStream. Each output carries
//     Nats-Msg-Id "<service>:<input id>:<key>", so an input that
//     is redelivered after a crash re-publishes the same ids and the streams
//     drop the copies: outputs are exactly once as long as the redelivery
//     falls inside the output stream's duplicate window.
//   - A handler answers with its error: nil acks, Retry(after, reason) asks
//     for a later redelivery, DeadLetter(reason) sends the input to
//     failbus.dlq.<service> at once, any other error is retried with backoff
//     and dead-lettered on the last allowed delivery. The runner keeps one
//     delivery of the consumer's MaxDeliver spare: if the process dies during
//     a message's last handler delivery, the spare one dead-letters it
//     without running the handler again, where the server would otherwise
//     drop it silently. One bad message never stops the service.
//   - Dead letters (events.DeadLetter) keep the original subject, headers
//     and bytes beside the reason, so an operator can fix and replay them.
//   - Panics become dead letters (Recover), long handlers keep their message
//     (Heartbeat), metrics and one zerolog line per notable event are built
//     in, and Run drains on shutdown: no new fetches, in-flight handlers
//     finish, fetched but unstarted messages are handed back at once.
//
// What is not guaranteed: handlers run at least once per input (a crash
// after the handler but before the ack runs it again), so side effects other
// than Outputs must be idempotent. Ordering holds only with Concurrency 1
// or per Config.Key, and even then a retried message is handled after the
// ones behind it. A
// delivery in flight when its process dies comes back only when its AckWait
// runs out (30 s on the topology's consumers, then the consumer's backoff):
// the server cannot tell a dead service from a slow one. A process that dies
// again while dead-lettering on the spare delivery (milliseconds, no handler
// involved) still loses that dead letter; the server then reports the
// message only by its MAX_DELIVERIES advisory.
//
// A runner's Gatherer and Healthy are what a service's /metrics and
// /healthz endpoints serve.
package consumer
