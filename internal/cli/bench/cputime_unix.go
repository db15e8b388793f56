//go:build unix

package bench

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user + system) this process has used so far:
// the server, every service and the bench's own load. Spent CPU per
// outcome is steadier on a shared machine than throughput, which also
// moves with what the neighbours run.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
