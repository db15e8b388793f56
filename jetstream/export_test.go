package topology

// ReadFromPaged is ReadFrom with answers of at most pageBytes, so a test
// sees it page.
var ReadFromPaged = readFrom
