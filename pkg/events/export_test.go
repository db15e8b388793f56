package events

// Names the black-box tests use for identifiers the package keeps unexported.
const DefaultMaxDepth = defaultMaxDepth
const MaxNameBytes = maxNameBytes
const MaxTokens = maxTokens

type LimitError = limitError

var ErrNumberRange = errNumberRange
var ErrStringTooLong = errStringTooLong
var ErrTimeRange = errTimeRange
var ErrTooDeep = errTooDeep
var ErrTooLarge = errTooLarge
var ErrTooManyEntries = errTooManyEntries
var ErrTruncated = errTruncated
var RawJSON = rawJSON
