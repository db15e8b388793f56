// Package drill is `failbus drill`: one fleet of agents, one chaos
// timeline, run once per strategy — the official Go SDKs as they come
// (their own retries), and the same SDKs with their retries off under
// agent.Call on the bus — and one table of what each did to the provider,
// counted from the provider's side (the chaos server's request log).
//
// The fleet (Plan): N agents, each with a primary provider (an OpenAI-API
// provider and an Anthropic-API provider on one chaos server, so a segment
// one refuses can go to the other), two auth profiles per provider
// ("main" and "backup", each agent its own keys), M tasks of several LLM
// calls (steps) run by a subagent, and a cron whose every run makes one
// call and writes a memory entry. The timeline (DefaultTimeline) has an
// outage of the OpenAI provider counted by `reset`, some agents' main keys
// capped, content each provider refuses in some tasks' prompts, a
// rate-limit storm and stalled streams. A few subagents crash during the
// outage, the same ones in every strategy.
//
// What each strategy's agent does is what an agent of its kind does:
//
//   - go-sdk: each call through openai-go or anthropic-sdk-go with their
//     default retries; an error the SDK returns (or an answer the
//     provider refused) fails the task, which is lost; a failed cron run
//     or memory write is not redone; a crashed subagent's task is not
//     noticed. Every failure the agent sees is one page to a human (a
//     team alerting on every failure).
//   - go-failbus: tasks are submitted through the bus (held while their
//     provider is down, released after), each call runs under agent.Call
//     with the SDKs' retries off, the agent carries out the decisions it
//     gets back (a skip_provider moves the segment to the other provider,
//     a switch_profile is kept for its next calls), subagents heartbeat and
//     checkpoint after each step, and the agent obeys recovery's controls
//     (kill, run_cron, check_write, probe).
//
// The figures are defined in docs/DRILL.md. A Row is one strategy's
// figures, so the rows of other clients (the TypeScript drill) can be
// added to the same table and JSON.
//
// What it does not do: it is not a benchmark of the bus (failbus bench is);
// its times are the machine's, so on a loaded machine the figures move a
// little from run to run. Against a real provider (Config.Real) nothing is
// scripted: the figures are counted from the client's side, and those that
// need the timeline's windows are left empty.
package drill
