package scheduler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// mtimeGranularity is the coarsest modification-time resolution the poll
// allows for (FAT's 2s; ext4, xfs and tmpfs keep nanoseconds, ext3 and
// HFS+ seconds). A file whose modification time is not older than this
// when it was last read is read again even when its stat looks unchanged: a
// same-size rewrite within one tick of the clock could keep the same
// modification time (git's "racily clean" rule).
const mtimeGranularity = 2 * time.Second

// policyFile is the state of following Config.PolicyFile. Run's start
// touches it, then only the poll goroutine: it needs no lock.
//
// A change is acted on only once two consecutive looks agree (the
// "settle" rule): a file rewritten in place is empty or half written for a
// moment, and an empty document is a valid policy (the default one), so a
// look that caught the write half done must not replace the policy, reset
// the budgets with a new policy key, and audit it. Renaming a finished file
// over the policy file (what editors, config management and Kubernetes
// ConfigMaps do) is never seen half done, and is the recommended way to
// change the file; a writer that stalls longer than one poll interval in
// the middle of an in-place rewrite can still be caught. A change is thus
// in force one to two poll intervals after it is written. The first look,
// at start, is acted on at once.
type policyFile struct {
	path     string
	interval time.Duration
	// fallback: Config.Policy was set, so a file unusable at start keeps
	// it instead of failing Run.
	fallback bool

	// seen is the stat taken just before the last successful read, and
	// readAt the time of that stat; seen is nil when the last look failed.
	seen   os.FileInfo
	readAt time.Time
	// acted is what the last applied or rejected look saw (nil before the
	// first), so an unchanged file, or one that stays missing, is reported
	// once; pending is a different look seen once, acted on when the next
	// look agrees.
	acted, pending *fileLook
}

// fileLook is what one look at the policy file found: its content, or why
// it could not be read.
type fileLook struct {
	err  error
	hash [sha256.Size]byte
	data []byte
}

// same reports whether two looks found the same thing.
func (l *fileLook) same(o *fileLook) bool {
	if l.err != nil || o.err != nil {
		return l.err != nil && o.err != nil && l.err.Error() == o.err.Error()
	}
	return l.hash == o.hash
}

// unchanged reports whether fi is the stat of the content read last and no
// same-size rewrite can hide behind its modification time.
func (f *policyFile) unchanged(fi os.FileInfo) bool {
	return f.sameStat(fi) && f.readAt.After(fi.ModTime().Add(mtimeGranularity))
}

// sameStat reports whether fi is the same file, modification time and size
// as the stat of the last read.
func (f *policyFile) sameStat(fi os.FileInfo) bool {
	return f.seen != nil && os.SameFile(f.seen, fi) && fi.ModTime().Equal(f.seen.ModTime()) && fi.Size() == f.seen.Size()
}

// source names the file and the content read, for logs and audits.
func (f *policyFile) source(sum *[sha256.Size]byte) string {
	if sum == nil {
		return "file " + f.path
	}
	return "file " + f.path + " sha256:" + hex.EncodeToString(sum[:8])
}

// startPolicyFile reads the policy file before anything is decided: its
// valid content becomes the base policy. An unusable file keeps
// Config.Policy when one was given (logged and counted, not audited: it is
// not a change), else it fails Run.
func (s *Service) startPolicyFile(ctx context.Context) error {
	return s.checkPolicyFile(ctx, true)
}

// pollPolicyFile checks the policy file every interval until ctx ends.
func (s *Service) pollPolicyFile(ctx context.Context) {
	t := time.NewTicker(s.file.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = s.checkPolicyFile(ctx, false) // after start it reports, never fails
		}
	}
}

// checkPolicyFile is one look at the policy file: a stat, and a read and a
// hash only when the file may have changed. A new content, once settled
// (see policyFile), is parsed and applied, or rejected with the last good
// policy kept. Only the first look (initial) returns an error, when the
// file is unusable and there is no Config.Policy to fall back on.
func (s *Service) checkPolicyFile(ctx context.Context, initial bool) error {
	f := s.file
	at := time.Now() // the file system's clock, not the decisions'
	fi, err := os.Stat(f.path)
	var l *fileLook
	statChanged := err != nil || !f.sameStat(fi)
	if err == nil && f.unchanged(fi) {
		if f.pending == nil {
			return nil
		}
		l = f.pending // the content read last, confirmed unchanged
	} else {
		l = f.read(fi, err, at)
	}
	if f.acted != nil && l.same(f.acted) {
		if statChanged && l.err == nil && f.pending == nil {
			s.log.Debug().Str("policy_file", f.path).Msg("policy file rewritten with the same content; nothing to reload")
		}
		f.pending = nil
		return nil
	}
	if !initial && (f.pending == nil || !l.same(f.pending)) {
		f.pending = l
		s.log.Debug().Str("policy_file", f.path).Msg("policy file changed; acting on it once the next look agrees")
		return nil
	}
	f.pending, f.acted = nil, l
	data := l.data
	l.data = nil // only the hash is compared from now on
	if l.err != nil {
		return s.rejectPolicyFile(ctx, initial, nil, at, fmt.Errorf("read policy file: %w", l.err))
	}
	p, err := policy.Parse(data)
	if err != nil {
		return s.rejectPolicyFile(ctx, initial, &l.hash, at, fmt.Errorf("policy file %s: %w", f.path, err))
	}
	s.applyPolicyFile(ctx, initial, p, &l.hash, at)
	return nil
}

// read reads the file whose stat (taken at at) is fi, or explains statErr.
func (f *policyFile) read(fi os.FileInfo, statErr error, at time.Time) *fileLook {
	err := statErr
	var data []byte
	if err == nil {
		if fi.IsDir() {
			err = fmt.Errorf("%s is a directory", f.path)
		} else {
			data, err = os.ReadFile(f.path)
		}
	}
	if err != nil {
		f.seen = nil
		return &fileLook{err: err}
	}
	f.seen, f.readAt = fi, at
	return &fileLook{hash: sha256.Sum256(data), data: data}
}

// applyPolicyFile makes p, the file's new content, the base policy. It is
// in force unless the KV key overrides it (then it is recorded as
// shadowed).
func (s *Service) applyPolicyFile(ctx context.Context, initial bool, p *policy.Policy, sum *[sha256.Size]byte, at time.Time) {
	f := s.file
	src := f.source(sum)
	var kv *activePolicy
	s.m.fileValid.Set(1) // before it is in force: whoever sees the policy sees the gauge
	s.setLayer(func(l *policyLayers) {
		l.base = &activePolicy{p: p, source: src}
		kv = l.kv
	})
	key := p.RetryFor("").Key()
	if initial {
		s.log.Info().Str("policy", src).Str("policy_key", key).Msg("policy file loaded")
		return
	}
	a := &PolicyAudit{At: events.At(s.now()), Kind: PolicyApplied, Source: src, PolicyKey: key}
	if kv != nil {
		a.Kind, a.PolicyKey = PolicyShadowed, kv.p.RetryFor("").Key()
		s.log.Info().Str("policy", src).Str("policy_key", key).Str("overridden_by", kv.source).
			Msg("policy file changed; the KV policy stays in force until its key is deleted")
	} else {
		s.log.Info().Str("policy", src).Str("policy_key", key).Msg("policy file applied")
	}
	s.recordPolicy(ctx, reloadFile, a, fileAuditID(a.Kind, sum, at))
}

// rejectPolicyFile reports a policy file that cannot be read or is not a
// valid policy: the last good policy stays in force.
func (s *Service) rejectPolicyFile(ctx context.Context, initial bool, sum *[sha256.Size]byte, at time.Time, err error) error {
	f := s.file
	if initial && !f.fallback {
		return fmt.Errorf("scheduler: %w", err)
	}
	s.m.fileValid.Set(0)
	kept := s.active.Load()
	s.log.Error().Err(err).Str("policy_file", f.path).Str("policy", kept.source).Str("policy_key", kept.p.RetryFor("").Key()).
		Msg("policy file rejected; keeping the last good policy")
	if initial {
		s.m.reloads.WithLabelValues(reloadFile, PolicyRejected).Inc()
		return nil
	}
	a := &PolicyAudit{
		At: events.At(s.now()), Kind: PolicyRejected, Source: f.source(sum),
		PolicyKey: kept.p.RetryFor("").Key(), Error: err.Error(),
	}
	s.recordPolicy(ctx, reloadFile, a, fileAuditID(a.Kind, sum, at))
	return nil
}

// fileAuditID is the Nats-Msg-Id of the audit record of one change of the
// policy file: each detected change is recorded once (a retried publish is
// deduplicated), and the same content coming back later is a new record.
func fileAuditID(kind string, sum *[sha256.Size]byte, at time.Time) string {
	h := "unreadable"
	if sum != nil {
		h = hex.EncodeToString(sum[:8])
	}
	return Name + ":policy:file:" + kind + ":" + h + ":" + strconv.FormatInt(at.UnixNano(), 10)
}
