// Command scheduler will turn classifications into decisions and durable
// delayed retries (DESIGN.md §4 "Retries"). Until its issue is done it
// refuses to start rather than pretend.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "failbus scheduler: not implemented yet (retries have their own issue); refusing to start")
	os.Exit(2)
}
