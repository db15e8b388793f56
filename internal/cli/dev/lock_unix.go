//go:build unix

package dev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// lockFile is the file in --data that one failbus dev holds locked while
// it runs; it contains the holder's PID.
const lockFile = "failbus-dev.lock"

// lockData takes the lock of dir (creating dir), so a second failbus dev
// cannot start on the same store and replay it alongside the first. The
// lock is the kernel's (flock): it goes with the process, also on SIGKILL,
// so a stale file never blocks a restart. unlock releases it.
func lockData(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create --data %s: %w", dir, err)
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock --data %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := "another process"
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(holder))); perr == nil {
				who = fmt.Sprintf("another failbus dev (pid %d)", pid)
			}
			return nil, fmt.Errorf("--data %s is in use by %s: stop it, or give this one another --data", dir, who)
		}
		return nil, fmt.Errorf("lock --data %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
