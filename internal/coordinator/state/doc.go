// Package state is what every replica of a coordinator holds alike, as one
// value: the job machine (internal/coordinator/job), the node ids and join keys,
// admission, the KV and rendezvous stores, each node's numbered outbox, the
// replica set and the job's result. Log entries go in ([Entry], each with
// its time), effects come out ([Effect]: plain data the server carries out:
// wake a node's stream, answer a waiting barrier, arm a deadline, take a
// voter out, finish, log a line). Apply reads no clock, does no I/O, starts
// no goroutine and logs nothing itself, so that replicas fed the same log
// hold equal states ([State.Digest]); deps_test.go enforces it.
//
// A snapshot holds the state's tables ([Image]), not the entries that made
// them; [FromImage] checks an image from another process. Package
// internal/coordinator/logentry is the wire form of the entries and of a snapshot;
// the server (package coordinator) keeps the transport, the KV store's
// waiting readers included.
package state
