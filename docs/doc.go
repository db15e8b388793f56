// Package docs holds failbus's documentation (the Markdown files beside
// this one). It has no code to import: its tests keep the documents true to
// the code. The table of subjects, streams, types and schema names in
// CONTRACT.md is generated from pkg/events and jetstream/ and checked on
// every test run; regenerate it with
//
//	go test ./docs -run TestContractTables -update
//
// and links in README.md and docs/*.md must point at files that exist.
package docs
