package retry

import "testing"

func TestSplitRetryIDInvertsRetryID(t *testing.T) {
	k := BudgetKey{Agent: "a.b c", Session: "s", Turn: 3, Step: 2, Provider: "openai", PolicyKey: "pk0123"}
	for _, n := range []int{1, 2, 10, 1024} {
		token, got, ok := SplitID(k.RetryID(n))
		if !ok || token != k.Token() || got != n {
			t.Errorf("SplitID(%q) = %q, %d, %v; want %q, %d, true", k.RetryID(n), token, got, ok, k.Token(), n)
		}
	}
	for _, bad := range []string{"", "-1", "b-1", "b0123-0", "b0123-01", "b0123-x", "x0123-1", "b01G3-1", "b0123", "b0123--1"} {
		if token, n, ok := SplitID(bad); ok {
			t.Errorf("SplitID(%q) = %q, %d, true; want not ok", bad, token, n)
		}
	}
}
