package delivery

// Names the black-box tests use for identifiers the package keeps unexported.
const DefaultLogSinkName = defaultLogSinkName
const DefaultMaxAttempts = defaultMaxAttempts
const DefaultMaxUnconfirmed = defaultMaxUnconfirmed
const LedgerClaimed = ledgerClaimed

type LedgerEntry = ledgerEntry

var IsDigest = isDigest
var LedgerKey = ledgerKey
var UTCDay = utcDay
