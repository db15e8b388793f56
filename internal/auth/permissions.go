package auth

import (
	"fmt"
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/durable"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// JetStream API subjects, as nats-server names them.
const (
	api      = "$JS.API."
	ack      = "$JS.ACK."
	flowCtl  = "$JS.FC."
	kvPrefix = "$KV."
	kvStream = "KV_"
	srv      = "$SRV."
	advisory = "$JS.EVENT.>"
)

// Permissions are one user's NATS permissions, in the order they are
// written.
type Permissions struct {
	PublishAllow, PublishDeny     []string
	SubscribeAllow, SubscribeDeny []string
	// AllowResponses lets the user answer requests it received (a service
	// replying into the requester's inbox), once each.
	AllowResponses bool
}

// Server converts p for an in-process server's options.
func (p Permissions) Server() *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.PublishAllow, Deny: p.PublishDeny},
		Subscribe: &server.SubjectPermission{Allow: p.SubscribeAllow, Deny: p.SubscribeDeny},
	}
	if p.AllowResponses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return sp
}

// Permissions compiles r for the user whose nkey public key is pub (its
// inbox is _INBOX.<pub>). It fails when r names a consumer, stream or
// bucket the topology does not have, so the table cannot drift silently
// from the topology.
func (r Role) Permissions(pub string) (Permissions, error) {
	inbox := connect.InboxPrefixFor(pub) + ".>"
	if r.All {
		return Permissions{PublishAllow: []string{">"}, PublishDeny: keepDeadLetters(), SubscribeAllow: []string{">"}, AllowResponses: true}, nil
	}
	var p permBuilder
	p.sub(inbox)
	if r.ReadAll {
		p.operator()
		perms := p.done(nil)
		perms.PublishDeny = append(perms.PublishDeny, readOnlyDeny...)
		return perms, nil
	}
	streams := topology.Streams()
	streamSubjects := map[string][]string{}
	for _, s := range streams {
		streamSubjects[s.Name] = s.Subjects
	}
	buckets := map[string]bool{}
	for _, b := range topology.Buckets() {
		buckets[b.Bucket] = true
	}

	p.pub(r.Publish...)
	owned := map[string]bool{}
	for _, c := range r.Consumers {
		stream, _, ok := topology.Consumer(c)
		if !ok {
			return Permissions{}, fmt.Errorf("auth: role %s: no consumer %s in the topology", r.Name, c)
		}
		owned[c] = true
		p.pub(api+"CONSUMER.INFO."+stream+"."+c, api+"CONSUMER.MSG.NEXT."+stream+"."+c, ack+stream+"."+c+".>")
	}
	// Streams the role reads with consumers of its own: it may create them
	// only with its filters, then fetch, look up and delete them.
	readStreams := map[string]bool{}
	for _, f := range r.Read {
		found := false
		for _, s := range streams {
			if !slices.ContainsFunc(s.Subjects, func(subj string) bool { return events.SubjectsCollide(f, subj) }) {
				continue
			}
			found = true
			readStreams[s.Name] = true
			p.pub(api + "CONSUMER.CREATE." + s.Name + ".*." + f)
		}
		if !found {
			return Permissions{}, fmt.Errorf("auth: role %s reads %s, which no stream holds", r.Name, f)
		}
	}
	for _, s := range sortedKeys(readStreams) {
		p.pub(api+"CONSUMER.MSG.NEXT."+s+".*", api+"CONSUMER.INFO."+s+".*", api+"CONSUMER.DELETE."+s+".*", ack+s+".*.>")
	}
	for _, s := range append(append(slices.Clone(r.Lookup), r.Purge...), r.DeleteMsgs...) {
		if _, ok := streamSubjects[s]; !ok {
			return Permissions{}, fmt.Errorf("auth: role %s: no stream %s in the topology", r.Name, s)
		}
	}
	for _, s := range r.Info {
		if _, ok := streamSubjects[s]; !ok {
			return Permissions{}, fmt.Errorf("auth: role %s: no stream %s in the topology", r.Name, s)
		}
		p.pub(api + "STREAM.INFO." + s)
	}
	for _, s := range r.Lookup {
		p.pub(api+"STREAM.INFO."+s, api+"DIRECT.GET."+s, api+"DIRECT.GET."+s+".>", api+"STREAM.MSG.GET."+s)
	}
	for _, s := range r.Purge {
		p.pub(api+"STREAM.INFO."+s, api+"STREAM.PURGE."+s)
	}
	for _, s := range r.DeleteMsgs {
		p.pub(api+"STREAM.INFO."+s, api+"STREAM.MSG.DELETE."+s)
	}
	for _, b := range append(slices.Clone(r.Buckets), r.BucketsRead...) {
		if !buckets[b] {
			return Permissions{}, fmt.Errorf("auth: role %s: no bucket %s in the topology", r.Name, b)
		}
		s := kvStream + b
		p.pub(api+"STREAM.INFO."+s, api+"DIRECT.GET."+s, api+"DIRECT.GET."+s+".>", api+"STREAM.MSG.GET."+s,
			// Watch and Keys: an ordered push consumer on the bucket's
			// keys, its flow control, and its deletion.
			api+"CONSUMER.CREATE."+s+".*."+kvPrefix+b+".>", api+"CONSUMER.DELETE."+s+".*", flowCtl+s+".>")
	}
	for _, b := range r.Buckets {
		p.pub(kvPrefix + b + ".>")
	}
	if len(r.Serve) > 0 {
		p.sub(r.Serve...)
		p.sub(srv + ">")
		p.responses = true
	}
	p.pub(r.Request...)
	if r.FindStreams {
		p.pub(api + "STREAM.NAMES")
	}
	perms := p.done(owned)
	for _, other := range r.NotAgents {
		for _, k := range agentConsumers {
			name := durable.Name(other, k.kind)
			perms.PublishDeny = append(perms.PublishDeny,
				api+"CONSUMER.CREATE."+k.stream+"."+name, api+"CONSUMER.CREATE."+k.stream+"."+name+".>",
				api+"CONSUMER.INFO."+k.stream+"."+name, api+"CONSUMER.MSG.NEXT."+k.stream+"."+name,
				api+"CONSUMER.DELETE."+k.stream+"."+name, ack+k.stream+"."+name+".>")
		}
	}
	return perms, nil
}

// agentConsumers are the durable consumers pkg/agent keeps for an agent
// (WithDurable): the stream and the kind in its name.
var agentConsumers = []struct{ stream, kind string }{
	{topology.StreamDecisions, "decisions"},
	{topology.StreamRetries, "retries"},
	{topology.StreamDispatch, "dispatch"},
	{topology.StreamControl, "control"},
}

// operator reads everything: stream, consumer and account info, and
// messages by subject or sequence (direct gets, which the operator tools
// page through streams with, and the stream leader's message get). It
// creates no consumer, not even one of its own: a consumer create's
// subject carries the consumer's name, which cannot tell the operator's
// own from an agent's durable, and creating one under a durable's name
// updates it (retargets its filter); fetching from a durable without
// acknowledging stalls its owner for the ack wait. So no consumer create,
// update, delete, fetch or acknowledgement, whatever its name
// (readOnlyDeny).
func (p *permBuilder) operator() {
	p.pub(
		api+"INFO",
		api+"STREAM.NAMES", api+"STREAM.LIST", api+"STREAM.INFO.*",
		api+"CONSUMER.NAMES.*", api+"CONSUMER.LIST.*", api+"CONSUMER.INFO.*.*",
		api+"DIRECT.GET.>", api+"STREAM.MSG.GET.*",
	)
	p.sub(advisory, events.Prefix+".>")
}

// readOnlyDeny is what the operator is refused beyond every role's denies
// (done): anything that creates, changes, deletes or reads through a
// consumer, and the account's and streams' administration.
var readOnlyDeny = []string{
	api + "CONSUMER.CREATE.>", api + "CONSUMER.DURABLE.CREATE.>", api + "CONSUMER.DELETE.>",
	api + "CONSUMER.MSG.NEXT.>", api + "CONSUMER.PAUSE.>", api + "CONSUMER.UNPIN.>",
	api + "CONSUMER.LEADER.STEPDOWN.>", api + "STREAM.LEADER.STEPDOWN.>", api + "STREAM.PEER.REMOVE.>",
	api + "STREAM.PURGE.>", api + "STREAM.SNAPSHOT.>", api + "STREAM.RESTORE.>",
	ack + ">", flowCtl + ">",
}

// keepDeadLetters is what even the admin is refused: deleting or purging
// FAILBUS_DLQ, whose messages nobody may delete or purge either (the
// stream's deny_delete and deny_purge, which a stream update cannot turn
// off). The admin still updates the stream (failbus apply).
func keepDeadLetters() []string {
	return []string{api + "STREAM.DELETE." + topology.StreamDLQ, api + "STREAM.PURGE." + topology.StreamDLQ}
}

// permBuilder collects subjects without repeats.
type permBuilder struct {
	pubs, subs []string
	responses  bool
}

func (p *permBuilder) pub(s ...string) { p.pubs = appendNew(p.pubs, s...) }
func (p *permBuilder) sub(s ...string) { p.subs = appendNew(p.subs, s...) }

func appendNew(list []string, s ...string) []string {
	for _, v := range s {
		if !slices.Contains(list, v) {
			list = append(list, v)
		}
	}
	return list
}

// done adds the deny list every non-admin role gets, whatever its allows:
// nobody but the admin creates, changes or deletes the topology's durable
// consumers, and nobody fetches from or acknowledges one it does not run
// (owned: the consumers it runs). Streams, buckets and the account are
// the admin's too; the allows above never reach them, and the denies
// below make that explicit where a wildcard would.
func (p *permBuilder) done(owned map[string]bool) Permissions {
	var deny []string
	for _, c := range topology.Consumers() {
		stream, _, _ := topology.Consumer(c)
		deny = append(deny, api+"CONSUMER.CREATE."+stream+"."+c, api+"CONSUMER.CREATE."+stream+"."+c+".>",
			api+"CONSUMER.DURABLE.CREATE."+stream+"."+c, api+"CONSUMER.DELETE."+stream+"."+c)
		if !owned[c] {
			deny = append(deny, api+"CONSUMER.MSG.NEXT."+stream+"."+c, ack+stream+"."+c+".>")
		}
	}
	deny = append(deny, api+"STREAM.CREATE.>", api+"STREAM.UPDATE.>", api+"STREAM.DELETE.>",
		api+"STREAM.MSG.DELETE.>", api+"CONSUMER.DURABLE.CREATE.>")
	return Permissions{PublishAllow: p.pubs, PublishDeny: deny, SubscribeAllow: p.subs, AllowResponses: p.responses}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
