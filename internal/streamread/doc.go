// Package streamread holds the ways failbus's services read JetStream
// that nats.go does not offer as one call: the last message of many
// subjects in one batch (LastReader, LastPerSubject), pages of a stream
// (ReadFrom, ReadPage), a KV bucket's latest entries in one request
// (LatestEntries), a read answered by the stream's leader (LeaderGet), a
// KV bucket that recreates itself when deleted (KeyValue), and the
// compare-and-set conflict as the server words it (IsWrongLastSeq).
//
// They serve the services and the command line; an agent or an
// alternative service reads the bus with nats.go and the topology's
// names.
package streamread
