package retry

// Retry ids on the bus (persist, then wait).
//
// BudgetKey.RetryID derives the id of the n-th retry of a budget as
// "<budget token>-<n>". An agent that cancels or starts a retry sends only
// that id; the scheduler finds the budget's ledger (the subject
// events.RetryLedgerSubject(token)) from it with SplitID, so a cancel
// needs no lookup table that a crash could lose.

import (
	"strconv"
	"strings"
)

// SplitID is the inverse of BudgetKey.RetryID: it returns the budget
// token and the 1-based retry number of id. ok is false for an id that
// BudgetKey.RetryID cannot have made.
func SplitID(id string) (token string, n int, ok bool) {
	i := strings.LastIndexByte(id, '-')
	if i <= 1 || id[0] != 'b' {
		return "", 0, false
	}
	token = id[:i]
	for j := 1; j < len(token); j++ {
		c := token[j]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", 0, false
		}
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil || n < 1 || strconv.Itoa(n) != id[i+1:] {
		return "", 0, false
	}
	return token, n, true
}
