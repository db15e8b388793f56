package e2e

import (
	"flag"
	"strconv"
	"testing"

	"github.com/failbus/failbus/internal/testcluster"
)

// defaultParallel is how many of this package's parallel tests run at
// once when -parallel does not say. Most of them wait rather than
// compute — for a SIGKILLed process's restart, a retry's due time, a
// recovery's minimum time, a full disk freed — so at go test's default
// (GOMAXPROCS: 2 on the CI machine) the package ran alone for minutes at
// the end of CI with a core mostly idle. The tests that measure the
// process's memory (TestTwentyThousandProviderNames, TestHostilePayloads)
// are not parallel: they run first, alone in the process.
const defaultParallel = 4

// TestMain sets -parallel to defaultParallel unless it was given, and
// lets testcluster run a node of TestServicesResumeOnceTheirServerCanStoreAgain
// as a child process of the test binary.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(defaultParallel)); err != nil {
			panic(err)
		}
	}
	testcluster.Main(m)
}
