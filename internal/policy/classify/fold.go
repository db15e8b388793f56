package classify

import "strings"

// hasFold reports whether list holds s, ignoring case.
func hasFold(list []string, s string) bool { return indexFoldList(list, s) >= 0 }

// indexFoldList finds s in list ignoring case.
func indexFoldList(list []string, s string) int {
	if s == "" {
		return -1
	}
	for i, x := range list {
		if strings.EqualFold(x, s) {
			return i
		}
	}
	return -1
}
