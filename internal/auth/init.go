package auth

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/pkg/events"
)

// ConfFile is the name of the configuration fragment Init writes: the
// users and their permissions, for nats-server's `include`.
const ConfFile = "auth.conf"

// SeedExt is the extension of the seed files: DIR/<role>.nk.
const SeedExt = ".nk"

// User is one role's user in a directory written by Init.
type User struct {
	Role Role
	// Public is the user's nkey public key (U...), its name on the server.
	Public string
	// SeedFile is the path of its seed (mode 0600): give it to --nkey.
	SeedFile string
	// Permissions are what auth.conf allows it.
	Permissions Permissions
}

// Set is the users of one directory.
type Set struct {
	Dir   string
	Users []User
}

// ConfPath is the path of the directory's auth.conf.
func (s *Set) ConfPath() string { return filepath.Join(s.Dir, ConfFile) }

// Seed returns the seed file of role (e.g. RoleClassifier, "agent-a"), or
// "" when the set has no such user.
func (s *Set) Seed(role string) string {
	for _, u := range s.Users {
		if u.Role.Name == role {
			return u.SeedFile
		}
	}
	return ""
}

// Init writes into dir (created if missing) one nkey user per role, and
// one per name in agents (role agent-<name>, whose subjects carry only
// that name): each user's seed in <role>.nk (mode 0600) and every user
// with its permissions in auth.conf. A seed already in dir is kept, and
// so is every agent-<name> user an earlier run made: running Init again
// (after an upgrade of failbus, or to add agents) only rewrites auth.conf
// and adds what is missing; nobody is locked out. To replace a user's
// key, delete its seed file first.
func Init(dir string, agents []string) (*Set, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	roles := Roles()
	seen := map[string]bool{}
	for _, r := range roles {
		seen[r.Name] = true
	}
	// Agents given a user by an earlier run keep it.
	earlier, err := filepath.Glob(filepath.Join(dir, RoleAgent+"-*"+SeedExt))
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	for _, f := range earlier {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), RoleAgent+"-"), SeedExt)
		if !slices.Contains(agents, name) && events.Token(name) == name {
			agents = append(agents, name)
		}
	}
	for _, a := range agents {
		r := Agent(a)
		if a == "" || a == "*" || seen[r.Name] {
			return nil, fmt.Errorf("auth: agent name %q: empty, a wildcard or given twice", a)
		}
		seen[r.Name] = true
		roles = append(roles, r)
	}
	// A named agent keeps out of its neighbours' durable consumers.
	for i := range roles {
		if !strings.HasPrefix(roles[i].Name, RoleAgent+"-") {
			continue
		}
		for _, a := range agents {
			if RoleAgent+"-"+events.Token(a) != roles[i].Name {
				roles[i].NotAgents = append(roles[i].NotAgents, a)
			}
		}
	}
	set := &Set{Dir: dir}
	for _, r := range roles {
		seed := filepath.Join(dir, r.Name+SeedExt)
		pub, err := ensureSeed(seed)
		if err != nil {
			return nil, err
		}
		perms, err := r.Permissions(pub)
		if err != nil {
			return nil, err
		}
		set.Users = append(set.Users, User{Role: r, Public: pub, SeedFile: seed, Permissions: perms})
	}
	if err := writeFile(set.ConfPath(), []byte(set.Conf()), 0o644); err != nil {
		return nil, err
	}
	return set, nil
}

// ensureSeed returns the public key of the user seed in path, creating
// the file with a new seed when there is none.
func ensureSeed(path string) (string, error) {
	_, err := os.Stat(path)
	if err == nil {
		return connect.NkeyPublicKey(path)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("auth: %w", err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("auth: new nkey: %w", err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	if err := writeFile(path, append(seed, '\n'), 0o600); err != nil {
		return "", err
	}
	return pub, nil
}

// writeFile writes through a temporary file and a rename, so a crash
// leaves the old file or the new one.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("auth: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("auth: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	return nil
}

// Conf renders the users as a nats-server configuration fragment: an
// authorization block with one nkey user per role. Every user needs
// credentials: a connection without them is refused.
func (s *Set) Conf() string {
	var b bytes.Buffer
	b.WriteString(`# failbus users, one nkey per role, each allowed only its own subjects.
# Written by 'failbus auth init'; running it again keeps the keys and
# rewrites this file. Include it from the nats-server configuration:
#   include "auth.conf"
# The seeds (<role>.nk, mode 0600) are each service's --nkey; keep them
# secret. A connection without credentials is refused.
# Replies: each user may subscribe only to _INBOX.<its public key>.>, the
# inbox prefix failbus clients use with --nkey (other clients: set it).
authorization {
  users = [
`)
	for _, u := range s.Users {
		fmt.Fprintf(&b, "    # %s: %s\n", u.Role.Name, u.Role.Doc)
		fmt.Fprintf(&b, "    {\n      nkey: %s\n      permissions: {\n", quote(u.Public))
		writeList(&b, "publish", u.Permissions.PublishAllow, u.Permissions.PublishDeny)
		writeList(&b, "subscribe", u.Permissions.SubscribeAllow, u.Permissions.SubscribeDeny)
		if u.Permissions.AllowResponses {
			b.WriteString("        allow_responses: true\n")
		}
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

func writeList(b *bytes.Buffer, name string, allow, deny []string) {
	fmt.Fprintf(b, "        %s: {\n", name)
	for _, l := range []struct {
		key  string
		subj []string
	}{{"allow", allow}, {"deny", deny}} {
		if len(l.subj) == 0 {
			continue
		}
		q := make([]string, len(l.subj))
		for i, s := range l.subj {
			q[i] = quote(s)
		}
		fmt.Fprintf(b, "          %s: [\n            %s\n          ]\n", l.key, strings.Join(q, ",\n            "))
	}
	b.WriteString("        }\n")
}

// quote writes a string the nats-server configuration reads verbatim.
func quote(s string) string { return strconv.Quote(s) }
