// Command recovery will run the post-outage recovery checklist (DESIGN.md
// §4 "Recovery"). It is not built yet: rather than pretend, it refuses to
// start and says so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "failbus recovery: not implemented yet (the recovery checklist has its own issue); refusing to start")
	os.Exit(2)
}
