// Package pattern finds many lower-case substrings in one pass: an
// Aho–Corasick automaton over the classifier's body patterns, hint phrases
// and redaction triggers, built once per classifier.
package pattern

import "strings"

// Set is an Aho–Corasick automaton over lower-case patterns: every
// rule's body patterns (and the hint phrases and redaction triggers) of a
// Classifier, built once. One pass over an outcome's error text, on first
// use, marks every pattern the text contains, so a rule's body condition
// costs a bit test instead of a substring search per pattern.
//
// The automaton holds only the first acPrefix bytes of each pattern, which
// keeps its table small enough for the L1 cache; when such a prefix ends at
// a text position, the rest of a longer pattern is verified there.
type Set struct {
	ids map[string]int32 // pattern (with its boundary flags) → id
	pb  [][]byte         // id → pattern
	// bound holds, per id, which ends of the pattern must fall on a word
	// boundary (boundLeft, boundRight); 0 for a plain substring.
	bound  []uint8
	class  [256]uint8 // byte → alphabet class; 0 = in no pattern
	nclass int
	next   []int32 // DFA: state*nclass+class → state (large automata)
	// next16 is the same table, premultiplied for small automata: entry
	// state*nclass+class holds next*nclass<<1 | has-output, so a step is
	// one load, a shift and an add (no multiply on the dependency chain),
	// and the table is half the size (cache-friendlier).
	next16 *[next16Len]uint16
	// div recovers a state from its premultiplied form: s*nclass*div>>32 == s
	// for every premultiplied state below 1<<16.
	div    uint64
	outLo  []int32 // patterns ending in a state: outIDs[outLo[s]:outLo[s+1]]
	outIDs []int32
	// fold: '-' and '_' are a space, in patterns and in the text (see
	// FoldSeparators).
	fold bool
}

// FoldSeparators makes '-', '_' and ' ' one character for this set, before
// any pattern is added: "rate limit" then also matches "rate-limit" and
// "rate_limit", and the spellings cost one pattern and one alphabet class
// instead of three.
func (p *Set) FoldSeparators() { p.fold = true }

func foldSep(b byte) byte {
	if b == '-' || b == '_' {
		return ' '
	}
	return b
}

// Boundary flags of a word pattern (AddWord).
const (
	boundLeft  uint8 = 1 << iota // the byte before the match is not a word byte
	boundRight                   // the byte after the match is not a word byte
)

// Add registers a lower-case, non-empty pattern, matched anywhere, and
// returns its id.
func (p *Set) Add(pat string) int32 { return p.add(pat, 0) }

// AddWord registers a lower-case, non-empty pattern matched on word
// boundaries and returns its id: an ASCII letter or digit at either end of
// the pattern must not continue into the text around the match ("quota"
// is not in "quotas", "rpm" is not in "rpms"), so a short word cannot hit
// inside a longer one. A trailing '*' lifts the right boundary: "throttl*"
// matches "throttled" and "throttling". Ends that are not ASCII letters or
// digits (CJK, punctuation) need no boundary: Chinese is written without
// spaces.
func (p *Set) AddWord(pat string) int32 {
	var b uint8
	if strings.HasSuffix(pat, "*") {
		pat = strings.TrimSuffix(pat, "*")
	} else if wordByte(pat[len(pat)-1]) {
		b |= boundRight
	}
	if wordByte(pat[0]) {
		b |= boundLeft
	}
	return p.add(pat, b)
}

func (p *Set) add(pat string, bound uint8) int32 {
	if p.ids == nil {
		p.ids = make(map[string]int32)
	}
	if p.fold && strings.ContainsAny(pat, "-_") {
		b := []byte(pat)
		for i := range b {
			b[i] = foldSep(b[i])
		}
		pat = string(b)
	}
	key := pat
	if bound != 0 {
		key = string(rune('0'+bound)) + "\x00" + pat
	}
	if id, ok := p.ids[key]; ok {
		return id
	}
	id := int32(len(p.ids))
	p.ids[key] = id
	p.pb = append(p.pb, []byte(pat))
	p.bound = append(p.bound, bound)
	return id
}

// wordByte reports whether b is an ASCII letter or digit: the bytes a word
// boundary separates.
func wordByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b >= 'A' && b <= 'Z'
}

// acPrefix is how many leading bytes of a pattern the automaton holds.
const acPrefix = 8

// Words is the length in uint64 words of a hit set for Scan.
func (p *Set) Words() int { return (len(p.ids) + 63) / 64 }

// Build compiles the automaton after every pattern was added.
func (p *Set) Build() {
	pats := make([]string, len(p.pb))
	for id, b := range p.pb {
		pats[id] = string(b)
	}
	// Alphabet: every byte in the automaton's part of a pattern (its first
	// acPrefix bytes) gets a class. A byte only ever after that part leaves
	// every prefix unmatched, as a byte in no pattern does, and mark
	// compares the rest byte by byte: it shares class 0 and keeps the
	// table small.
	p.nclass = 1
	for _, s := range pats {
		if len(s) > acPrefix {
			s = s[:acPrefix]
		}
		for i := 0; i < len(s); i++ {
			if p.class[s[i]] == 0 {
				p.class[s[i]] = uint8(p.nclass)
				p.nclass++
			}
		}
	}
	if p.fold {
		p.class['-'], p.class['_'] = p.class[' '], p.class[' ']
	}
	// Trie.
	type node struct {
		child map[uint8]int32
		out   []int32
	}
	nodes := []node{{child: map[uint8]int32{}}}
	for id, s := range pats {
		if len(s) > acPrefix {
			s = s[:acPrefix]
		}
		cur := int32(0)
		for i := 0; i < len(s); i++ {
			c := p.class[s[i]]
			nx, ok := nodes[cur].child[c]
			if !ok {
				nx = int32(len(nodes))
				nodes = append(nodes, node{child: map[uint8]int32{}})
				nodes[cur].child[c] = nx
			}
			cur = nx
		}
		nodes[cur].out = append(nodes[cur].out, int32(id))
	}
	// Breadth first: failure links folded into a full transition table.
	n := len(nodes)
	p.next = make([]int32, n*p.nclass)
	fail := make([]int32, n)
	queue := make([]int32, 0, n)
	for c := 1; c < p.nclass; c++ {
		if nx, ok := nodes[0].child[uint8(c)]; ok {
			p.next[c] = nx
			queue = append(queue, nx)
		}
	}
	for qi := 0; qi < len(queue); qi++ {
		s := queue[qi]
		nodes[s].out = append(nodes[s].out, nodes[fail[s]].out...)
		for c := 1; c < p.nclass; c++ {
			if nx, ok := nodes[s].child[uint8(c)]; ok {
				fail[nx] = p.next[int(fail[s])*p.nclass+c]
				p.next[int(s)*p.nclass+c] = nx
				queue = append(queue, nx)
			} else {
				p.next[int(s)*p.nclass+c] = p.next[int(fail[s])*p.nclass+c]
			}
		}
	}
	p.outLo = make([]int32, n+1)
	for s := 0; s < n; s++ {
		p.outLo[s] = int32(len(p.outIDs))
		p.outIDs = append(p.outIDs, nodes[s].out...)
	}
	p.outLo[n] = int32(len(p.outIDs))
	if n*p.nclass <= next16Len {
		// Sized for any automaton that fits, so that indexes masked to
		// next16Len need no bounds check; the unused tail is never touched.
		p.next16 = new([next16Len]uint16)
		for i, x := range p.next {
			v := uint16(int(x)*p.nclass) << 1
			if p.outLo[x] < p.outLo[x+1] {
				v |= 1
			}
			p.next16[i] = v
		}
		p.div = (1<<32 + uint64(p.nclass) - 1) / uint64(p.nclass)
		p.next = nil
	}
}

// next16Len bounds the premultiplied table: next*nclass<<1 | 1 must fit in
// 16 bits.
const next16Len = 1 << 15

// scanSplit is the text length from which scan runs two interleaved
// automaton walks, one per half, so that the CPU overlaps their table
// loads (each walk is a chain of dependent loads).
const scanSplit = 64

// Scan marks in hits every pattern that occurs in text.
func (p *Set) Scan(text []byte, hits []uint64) {
	if p.next16 != nil {
		p.scan16(text, hits)
		return
	}
	if p.next != nil {
		nclass := p.nclass
		s := 0
		for i, b := range text {
			s = int(p.next[s*nclass+int(p.class[b])])
			p.mark(s, text, i, hits)
		}
	}
}

// scan16 is scan over the premultiplied table. A long text is walked as
// two halves at once, so that the CPU overlaps the parts' table loads
// (each walk is a chain of dependent loads). A part's walk starts
// acPrefix-1 bytes before the part, which is enough for it to be in the
// same state as a single walk of the whole text from the part on (a state
// stands for at most the last acPrefix bytes). Whatever it reports before
// its part is a real occurrence too, and hits is a set, so the result is
// that of one walk. (Four parts measured no faster than two: the loop is
// then bound by instruction throughput, not load latency.)
func (p *Set) scan16(text []byte, hits []uint64) {
	const (
		mask = next16Len - 1
		warm = acPrefix - 1
	)
	next, class := p.next16, &p.class
	s, i := 0, 0
	if len(text) >= scanSplit {
		// Halves [0, mid) and [mid, len), the second walk from mid-warm;
		// both walk mid bytes, then the second the rest.
		mid := len(text) / 2
		off := mid - warm
		t0, t1 := text[:mid], text[off:off+mid]
		s1 := 0
		for k := range t0 {
			v0 := next[(s+int(class[t0[k]]))&mask]
			v1 := next[(s1+int(class[t1[k]]))&mask]
			s, s1 = int(v0>>1), int(v1>>1)
			if (v0|v1)&1 != 0 {
				if v0&1 != 0 {
					p.mark(p.state(s), text, k, hits)
				}
				if v1&1 != 0 {
					p.mark(p.state(s1), text, off+k, hits)
				}
			}
		}
		s, i = s1, off+mid
	}
	for ; i < len(text); i++ {
		v := next[(s+int(class[text[i]]))&mask]
		s = int(v >> 1)
		if v&1 != 0 {
			p.mark(p.state(s), text, i, hits)
		}
	}
}

// Compact reports whether the automaton fits the premultiplied 16-bit table
// (states × alphabet classes ≤ next16Len), the fast path of Scan. Its size
// and fill are returned for the test that keeps the built-in rules inside it.
func (p *Set) Compact() (ok bool, cells, limit int) {
	return p.next16 != nil, (len(p.outLo) - 1) * p.nclass, next16Len
}

// state turns a premultiplied state of next16 back into a state number.
func (p *Set) state(pm int) int { return int(uint64(pm) * p.div >> 32) }

// mark records the patterns whose automaton prefix ends at text[i].
func (p *Set) mark(s int, text []byte, i int, hits []uint64) {
	for _, id := range p.outIDs[p.outLo[s]:p.outLo[s+1]] {
		if hits[id>>6]&(1<<(id&63)) != 0 {
			continue
		}
		pat := p.pb[id]
		start := i + 1 - len(pat)
		if len(pat) > acPrefix {
			start = i + 1 - acPrefix
			if len(text)-start < len(pat) || !p.equal(text[start:start+len(pat)], pat) {
				continue
			}
		}
		if b := p.bound[id]; b != 0 {
			if b&boundLeft != 0 && start > 0 && wordByte(text[start-1]) {
				continue
			}
			if end := start + len(pat); b&boundRight != 0 && end < len(text) && wordByte(text[end]) {
				continue
			}
		}
		hits[id>>6] |= 1 << (id & 63)
	}
}

// equal compares a text window with a pattern, folding separators when the
// set does.
func (p *Set) equal(text, pat []byte) bool {
	if !p.fold {
		return string(text) == string(pat)
	}
	for i, b := range text {
		if foldSep(b) != pat[i] {
			return false
		}
	}
	return true
}

// Hit reports whether pattern id is marked in hits.
func Hit(hits []uint64, id int32) bool { return hits[id>>6]&(1<<(id&63)) != 0 }

// Mask returns the hit-set words with the bits of ids set, for Any; call it
// after every pattern was added.
func (p *Set) Mask(ids []int32) []uint64 {
	if len(ids) == 0 {
		return nil
	}
	m := make([]uint64, p.Words())
	for _, id := range ids {
		m[id>>6] |= 1 << (id & 63)
	}
	return m
}

// Any reports whether hits holds any pattern of mask (from Mask): a few
// word tests, where FirstHit tests each pattern of a long list.
func Any(hits, mask []uint64) bool {
	for i, w := range mask {
		if hits[i]&w != 0 {
			return true
		}
	}
	return false
}

// FirstHit is the index in ids of the first pattern found in hits, or -1:
// a rule's evidence names the first of its patterns that matched.
func FirstHit(hits []uint64, ids []int32) int {
	for k, id := range ids {
		if Hit(hits, id) {
			return k
		}
	}
	return -1
}
