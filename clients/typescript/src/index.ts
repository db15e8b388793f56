// failbus for TypeScript agents: run one LLM call under the bus (call),
// report every LLM call's outcome, read the decisions, due retries,
// dispatches and controls the bus sends back, ask the refusal route, wrap a
// fetch-style call into an Outcome, and check a provider's stream grammar.
// See README.md and docs/CONTRACT.md.

export { connect } from "@nats-io/transport-node";
export { connectAs, inboxPrefixFor } from "./connect.js";
export type { ConnectAsOptions } from "./connect.js";
export { Agent, DURABLE_INACTIVE_THRESHOLD_MS, validateOutcome } from "./agent.js";
export type { AgentOptions, OutcomeInput, ReportedOutcome } from "./agent.js";
export {
  Attempt, call, CallError, DecisionError, DEFAULT_DECISION_TIMEOUT_MS, DEFAULT_MAX_ATTEMPTS, DEFAULT_RESUME_WINDOW_MS,
  DEFAULT_STALL_AFTER_MS, NoDecisionError, NoProviderError, StallError, TooManyAttemptsError,
} from "./call.js";
export type { CallRequest, CallResult, Chunk, Restart, Step, Target } from "./call.js";
export { completionEvidence, evidenceOf, HTTPError, httpErrorFrom, MAX_EVIDENCE_BODY, sdkErrorEvidence } from "./evidence.js";
export type { Describer, Evidence, Evidencer } from "./evidence.js";
export { DURABLE_ACK_WAIT_MS } from "./reader.js";
export type { Reader } from "./reader.js";
export { requestRoute, RouteServiceError, RouteUnavailableError } from "./route.js";
export type { RouteAnswer, RouteRequest, RouteSkip } from "./route.js";
export { INVARIANT_CODE, InvariantError, Rules, StreamValidator, validateStream } from "./invariants.js";
export type { Rule, StreamEvent } from "./invariants.js";
export { errorText, grammars, REFUSAL_STOP_REASONS, refusalStopReason, sse, wrap, wrapStream } from "./wrap.js";
export type { CallContext, CallOutcome, ResponseLike, SSEEvent, WrapOptions, Wrapped, WrappedStream, WrapStreamOptions } from "./wrap.js";
export * from "./wire.js";
export { childSpan, formatTraceparent, HEADER_TRACEPARENT, HEADER_TRACESTATE, newTrace, parseTraceparent, setTraceHeaders, traceFromHeaders } from "./trace.js";
export type { TraceContext } from "./trace.js";
