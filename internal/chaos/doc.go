// Package chaos is a chaos provider: a local HTTP server that speaks the
// OpenAI chat completions API (POST /v1/chat/completions, plain and
// streamed) and the Anthropic messages API (POST /v1/messages, plain and
// streamed), answers as a healthy provider does, and fails on a script — a
// timeline of fault windows — the way real providers fail: a refused port,
// 503 and 529, 429 storms with and without retry-after, a key past its
// quota, the gateway's empty 400, refusal of given content, context
// overflow, answers that hang, streams that stall or break midway. It is
// the provider side of `failbus chaos` and of the fleet drill, and it is
// not failbus: it decides nothing for the agent and knows nothing of the
// bus.
//
// It records every request it received (Server.Requests, the --log JSON
// Lines file, GET /_chaos/requests): when, with which key and model, a
// fingerprint and a token estimate of the prompt, and what it answered.
// A drill counts calls from this side, not from the client's; Log answers
// the questions a drill asks (calls per window, calls while a window was
// open, the peak after it closed).
//
//	tl, err := chaos.Load("testdata/chaos/drill.yaml")
//	srv, err := chaos.New(tl, chaos.Options{Scale: 0.01})
//	err = srv.Start(ctx)
//	defer srv.Close()
//	client := openai.NewClient(option.WithBaseURL(srv.OpenAIBaseURL("")), option.WithAPIKey("sk-a"))
//	…
//	outage, _ := tl.Fault("outage")
//	during := srv.Requests().Between(outage.From, outage.To)
//
// The timeline format is in docs/CHAOS.md.
//
// What it does not do: it does not check keys (every key is accepted and
// logged as given), count real tokens (an estimate: a token per four
// bytes of prompt text), speak TLS or HTTP/2, or serve any other endpoint.
// A refuse window truly closes the port, so the calls it refuses never
// reach the server and are not in the log; a reset window is the outage
// whose calls are counted. Probability draws follow arrival order: the
// same seed gives the same answers to the same requests arriving in the
// same order, which concurrent clients do not promise.
package chaos
