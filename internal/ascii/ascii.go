// Package ascii holds the ASCII case-folding helpers the classifier and the
// redactor share. They compare against a pattern that is already lower case,
// so each byte of the subject is folded once and nothing allocates; non-ASCII
// bytes compare as they are.
package ascii

// Lower returns c lower-cased when it is an ASCII capital letter.
func Lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// HasPrefixFold is strings.HasPrefix with ASCII case folding; lowerPrefix
// must be lower case.
func HasPrefixFold(s, lowerPrefix string) bool {
	if len(s) < len(lowerPrefix) {
		return false
	}
	for i := 0; i < len(lowerPrefix); i++ {
		if Lower(s[i]) != lowerPrefix[i] {
			return false
		}
	}
	return true
}

// EqualFold reports whether a equals lowerB up to ASCII case; lowerB must be
// lower case.
func EqualFold(a, lowerB string) bool { return len(a) == len(lowerB) && HasPrefixFold(a, lowerB) }

// IndexFold finds lowerSub in s ignoring ASCII case; lowerSub must be lower
// case and non-empty. It returns -1 when s does not contain it.
func IndexFold(s, lowerSub string) int {
	n := len(lowerSub)
	if n == 0 || n > len(s) {
		return -1
	}
	c0 := lowerSub[0]
	for i := 0; i+n <= len(s); i++ {
		if Lower(s[i]) == c0 && HasPrefixFold(s[i:], lowerSub) {
			return i
		}
	}
	return -1
}
