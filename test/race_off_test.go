//go:build !race

package test

// raceDetector is true in a -race build, whose shadow memory multiplies
// what a test's allocations cost in RSS.
const raceDetector = false
