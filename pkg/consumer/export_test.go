package consumer

// Names the black-box tests use for identifiers the package keeps unexported.
var StoreFailure = storeFailure
