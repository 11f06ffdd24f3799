// Package bench holds gotrain's data-plane benchmarks, run with go test:
//
//	go test -run '^$' -bench CPUAllReduce -benchtime 2s ./bench/
//
// BenchmarkCPUAllReduce measures the pure-Go CPU backend (package
// worker/cpucomm) with its ranks as goroutines of one process over loopback
// TCP. Each result reports the algorithm bandwidth as MB/s (b.SetBytes: the
// buffer size over the time of one all-reduce) and the bus bandwidth as
// busbw-GB/s, which is algbw × 2(n-1)/n for n ranks, as nccl-tests reports it:
// the rate at which each rank's links move data, comparable across rank
// counts. results/ keeps the tables, with the machine they ran on.
package bench
