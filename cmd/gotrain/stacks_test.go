package main

import "testing"

func TestProgramStacks(t *testing.T) {
	dump := `goroutine 18 [running]:
runtime/pprof.writeGoroutineStacks({0x5c1f40, 0xc0000a2000})
	/usr/local/go/src/runtime/pprof/pprof.go:761 +0x6a
github.com/gotrain/gotrain/worker.(*agentConn).dumpStacks(0xc0001b6000)
	/src/gotrain/worker/attach.go:210 +0x45
created by github.com/gotrain/gotrain/worker.Init in goroutine 1
	/src/gotrain/worker/init.go:88 +0x1f1

goroutine 1 [select]:
runtime.gopark(0x0?, 0x0?, 0x0?, 0x0?, 0x0?)
	/usr/local/go/src/runtime/proc.go:424 +0xce
sync.(*Cond).Wait(0xc000012345)
	/usr/local/go/src/sync/cond.go:71 +0xcf
github.com/gotrain/gotrain/worker/cpucomm.(*Comm).AllReduce(0xc0000b4000, {0xc000200000, 0x400, 0x400})
	/src/gotrain/worker/cpucomm/allreduce.go:55 +0x1e5
train/model.Step(...)
	/home/me/train/model/step.go:31
main.main()
	/home/me/train/main.go:40 +0x2b1

goroutine 7 [IO wait]:
internal/poll.runtime_pollWait(0x7f, 0x72)
	/usr/local/go/src/runtime/netpoll.go:351 +0x85
net.(*conn).Read(0xc000060010, {0xc000300000, 0x8000, 0x8000})
	/usr/local/go/src/net/net.go:194 +0x45
created by google.golang.org/grpc.newHTTP2Client in goroutine 1
	/root/go/pkg/mod/google.golang.org/grpc@v1.70.0/internal/transport/http2_client.go:400 +0x1d5

goroutine 9 [running]:
main.worker()
	/home/me/train/main.go:60 +0x10
`
	want := `goroutine 1 [select]:
	... 3 frame(s) of the Go runtime and gotrain's library
train/model.Step(...)
	/home/me/train/model/step.go:31
main.main()
	/home/me/train/main.go:40 +0x2b1

goroutine 9 [running]:
main.worker()
	/home/me/train/main.go:60 +0x10

goroutine 18 [running]:
runtime/pprof.writeGoroutineStacks({0x5c1f40, 0xc0000a2000})
	/usr/local/go/src/runtime/pprof/pprof.go:761 +0x6a
github.com/gotrain/gotrain/worker.(*agentConn).dumpStacks(0xc0001b6000)
	/src/gotrain/worker/attach.go:210 +0x45
created by github.com/gotrain/gotrain/worker.Init in goroutine 1
	/src/gotrain/worker/init.go:88 +0x1f1

goroutine 7 [IO wait]:
internal/poll.runtime_pollWait(0x7f, 0x72)
	/usr/local/go/src/runtime/netpoll.go:351 +0x85
net.(*conn).Read(0xc000060010, {0xc000300000, 0x8000, 0x8000})
	/usr/local/go/src/net/net.go:194 +0x45
created by google.golang.org/grpc.newHTTP2Client in goroutine 1
	/root/go/pkg/mod/google.golang.org/grpc@v1.70.0/internal/transport/http2_client.go:400 +0x1d5
`
	if got := programStacks(dump); got != want {
		t.Errorf("programStacks:\n%s\nwant:\n%s", got, want)
	}
	for _, other := range []string{"Thread 0x7f (idle): \"MainThread\"\n    train (t.py:3)\n", "", "no dump\n\nat all\n"} {
		if got := programStacks(other); got != other {
			t.Errorf("programStacks(%q) = %q, want it unchanged", other, got)
		}
	}
}
