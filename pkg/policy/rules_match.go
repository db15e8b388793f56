package policy

// patternSet is an Aho–Corasick automaton over lower-case patterns: every
// rule's body patterns (and the hint phrases and redaction triggers) of a
// Classifier, built once. One pass over an outcome's error text, on first
// use, marks every pattern the text contains, so a rule's body condition
// costs a bit test instead of a substring search per pattern.
//
// The automaton holds only the first acPrefix bytes of each pattern, which
// keeps its table small enough for the L1 cache; when such a prefix ends at
// a text position, the rest of a longer pattern is verified there.
type patternSet struct {
	ids    map[string]int32 // pattern → id
	pb     [][]byte         // id → pattern
	class  [256]uint8       // byte → alphabet class; 0 = in no pattern
	nclass int
	next   []int32  // DFA: state*nclass+class → state (large automata)
	next16 []uint16 // the same as state<<1 | has-output, when states fit (cache-friendlier)
	outLo  []int32  // patterns ending in a state: outIDs[outLo[s]:outLo[s+1]]
	outIDs []int32
}

// add registers a lower-case, non-empty pattern and returns its id.
func (p *patternSet) add(pat string) int32 {
	if p.ids == nil {
		p.ids = make(map[string]int32)
	}
	if id, ok := p.ids[pat]; ok {
		return id
	}
	id := int32(len(p.ids))
	p.ids[pat] = id
	p.pb = append(p.pb, []byte(pat))
	return id
}

// acPrefix is how many leading bytes of a pattern the automaton holds.
const acPrefix = 8

func (p *patternSet) words() int { return (len(p.ids) + 63) / 64 }

// build compiles the automaton after every pattern was added.
func (p *patternSet) build() {
	pats := make([]string, len(p.ids))
	for s, id := range p.ids {
		pats[id] = s
	}
	// Alphabet: every byte used by a pattern gets a class.
	p.nclass = 1
	for _, s := range pats {
		for i := 0; i < len(s); i++ {
			if p.class[s[i]] == 0 {
				p.class[s[i]] = uint8(p.nclass)
				p.nclass++
			}
		}
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
	if n <= 1<<15 {
		p.next16 = make([]uint16, len(p.next))
		for i, x := range p.next {
			v := uint16(x) << 1
			if p.outLo[x] < p.outLo[x+1] {
				v |= 1
			}
			p.next16[i] = v
		}
		p.next = nil
	}
}

// scan marks in hits every pattern that occurs in text.
func (p *patternSet) scan(text []byte, hits []uint64) {
	if p.next16 != nil {
		nclass := p.nclass
		s := 0
		for i, b := range text {
			v := p.next16[s*nclass+int(p.class[b])]
			s = int(v >> 1)
			if v&1 != 0 {
				p.mark(s, text, i, hits)
			}
		}
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

// mark records the patterns whose automaton prefix ends at text[i].
func (p *patternSet) mark(s int, text []byte, i int, hits []uint64) {
	for _, id := range p.outIDs[p.outLo[s]:p.outLo[s+1]] {
		if hits[id>>6]&(1<<(id&63)) != 0 {
			continue
		}
		pat := p.pb[id]
		if len(pat) > acPrefix {
			start := i + 1 - acPrefix
			if len(text)-start < len(pat) || string(text[start:start+len(pat)]) != string(pat) {
				continue
			}
		}
		hits[id>>6] |= 1 << (id & 63)
	}
}

func hit(hits []uint64, id int32) bool { return hits[id>>6]&(1<<(id&63)) != 0 }
