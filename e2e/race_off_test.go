//go:build !race

package e2e

// raceDetector is true in a -race build, whose shadow memory multiplies
// what a test's allocations cost in RSS.
const raceDetector = false
