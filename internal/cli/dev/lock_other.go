//go:build !unix

package dev

import (
	"fmt"
	"os"
)

// lockData only creates dir where flock is not available: two failbus dev
// on one --data are not prevented there.
func lockData(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create --data %s: %w", dir, err)
	}
	return func() {}, nil
}
