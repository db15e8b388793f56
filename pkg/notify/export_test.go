package notify

// Names the black-box tests use for identifiers the package keeps unexported.
type NtfyMessage = ntfyMessage
type PagerDutyEvent = pagerDutyEvent
