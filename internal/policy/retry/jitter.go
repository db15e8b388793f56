package retry

import "encoding/binary"

// JitterU is the uniform number in [0, 1) the backoff jitter of a
// failure is drawn with: a hash of its outcome id (and seed), not a
// random generator's next number. The scheduler records the outcome id
// with every decision, so `failbus simulate` and `failbus shadow`, fed
// the same outcomes, draw the same number and give the same retry the
// same delay as the bus did, in any order and on any replica; a
// redelivered outcome draws its number again, unchanged. Seed 0 is the
// bus's draw; another seed draws a different, still reproducible, one
// (simulate's and shadow's --seed).
//
// Outcome ids are the agent's (unique per call attempt), so the draws of
// many concurrent failures are spread as evenly as independent random
// numbers: FNV-1a over the seed and the id, then splitmix64's finaliser,
// whose output passes as uniform.
func JitterU(outcomeID string, seed uint64) float64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	for i := 0; i < len(outcomeID); i++ {
		h ^= uint64(outcomeID[i])
		h *= 1099511628211
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return float64(h>>11) / (1 << 53)
}
