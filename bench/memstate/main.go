// Command memstate measures the in-memory snapshot tier side by
// side with the disk checkpoint, for one state size at a time: the part of
// a snapshot on the training step's path (the copy into pre-faulted shared
// memory), the background hand-over (checksum, SCM_RIGHTS, the agent's seal
// and check), a restore from the agent's memory (map, checksum, copy into
// the program's buffers) against worker/checkpoint's Save (write, fsync,
// rename) and Latest (read, checksum).
//
// The agent side runs in a child process (the binary re-executed with
// -agent), as gotrain's agent does, so the memfd really crosses processes.
// The disk side writes to -dir (default: the temporary directory); its
// reads come from the page cache, the best case for the disk tier.
//
//	go build -o bin/memstate ./bench/memstate
//	bin/memstate -bytes 814192 -reps 20       # MNIST's state
//	bin/memstate -bytes 336000000 -reps 5     # the 42 M-parameter MLP: params + momentum
//	bin/memstate -bytes 1073741824 -reps 3    # 1 GiB synthetic
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/gotrain/gotrain/bench/internal/snapagent"
	"github.com/gotrain/gotrain/internal/memsnap"
	"github.com/gotrain/gotrain/worker/checkpoint"
)

func main() {
	agent := flag.String("agent", "", "internal: serve the snapshot socket at this path")
	size := flag.Int64("bytes", 814192, "state size in bytes")
	reps := flag.Int("reps", 10, "repetitions (the median is printed)")
	dir := flag.String("dir", os.TempDir(), "directory for the disk checkpoints")
	peer := flag.Bool("peer", false, "measure the peer tier (replicate to and fetch from another agent over loopback TLS) instead")
	streams := flag.Int("streams", min(8, max(1, runtime.NumCPU()/2)), "with -peer: connections of the ranged fetch (as a replaced rank's agent opens)")
	flag.Parse()
	if *peer {
		if err := runPeer(*size, *reps, *streams); err != nil {
			fmt.Fprintln(os.Stderr, "memstate:", err)
			os.Exit(1)
		}
		return
	}
	if *agent != "" {
		snapagent.Serve(*agent)
		return
	}
	if err := run(*size, *reps, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "memstate:", err)
		os.Exit(1)
	}
}

func run(size int64, reps int, dir string) error {
	c, stopAgent, err := snapagent.Start()
	if err != nil {
		return err
	}
	defer stopAgent()

	state := make([]byte, size)
	for i := range state {
		state[i] = byte(i * 7)
	}
	into := make([]byte, size)
	ckdir, err := os.MkdirTemp(dir, "memstate-ckpt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(ckdir)
	disk := checkpoint.Dir{Path: ckdir}

	var ref []time.Duration
	for range reps {
		t := time.Now()
		copy(into, state)
		ref = append(ref, time.Since(t))
	}
	var prefault, cp, hand, restore, dsave, dload []time.Duration
	var bufs [2]*memsnap.Buffer // as worker.Snapshots: two buffers written in turn
	for i := range reps + 2 {   // the first two write fresh pages: warm-up, not counted
		t0 := time.Now()
		b := bufs[i%2]
		if b == nil {
			if b, err = memsnap.NewBuffer(size); err != nil {
				return err
			}
			clear(b.Bytes()) // in worker.Snapshots: in the background, after the first hand-over
			bufs[i%2] = b
		}
		t1 := time.Now()
		memsnap.Copy(b.Bytes(), state) // on the step's path, as worker.Snapshots.Save
		t2 := time.Now()
		if err := c.CommitReused(b, int64(i+1)); err != nil { // in the background
			return err
		}
		t3 := time.Now()
		r, err := c.Latest()
		if err != nil {
			return err
		}
		memsnap.Copy(into, r.Bytes()) // as worker.State.Into
		r.Close()
		t4 := time.Now()
		if r.Step != int64(i+1) {
			return fmt.Errorf("restored step %d, want %d", r.Step, i+1)
		}
		if err := disk.Save(int64(i+1), state); err != nil {
			return err
		}
		t5 := time.Now()
		step, got, err := disk.Latest()
		if err != nil || step != int64(i+1) || len(got) != len(state) {
			return fmt.Errorf("disk latest: step %d, %d bytes, %v", step, len(got), err)
		}
		copy(into, got)
		t6 := time.Now()
		if i < 2 {
			prefault = append(prefault, t1.Sub(t0))
			continue
		}
		cp = append(cp, t2.Sub(t1))
		hand = append(hand, t3.Sub(t2))
		restore = append(restore, t4.Sub(t3))
		dsave = append(dsave, t5.Sub(t4))
		dload = append(dload, t6.Sub(t5))
	}
	// A restarted rank: the process that wrote the snapshot is gone (its
	// buffers unmapped), so the agent seals the newest one and checks it
	// once, at the first restore; later restores of it are sealed reads.
	for _, b := range bufs {
		b.Discard()
	}
	var first time.Duration
	var restarted []time.Duration
	for i := range reps + 1 {
		clear(into)
		t := time.Now()
		r, err := c.Latest()
		if err != nil {
			return fmt.Errorf("restore after the writer is gone: %w", err)
		}
		memsnap.Copy(into, r.Bytes())
		r.Close()
		d := time.Since(t)
		if i == 0 {
			first = d
			if !slices.Equal(into, state) {
				return fmt.Errorf("the state restored after its writer is gone differs from the one saved")
			}
			continue
		}
		restarted = append(restarted, d)
	}
	var refPar []time.Duration
	for range reps {
		t := time.Now()
		memsnap.Copy(into, state)
		refPar = append(refPar, time.Since(t))
	}

	gbps := func(d time.Duration) string { return fmt.Sprintf("%.2f GB/s", float64(size)/d.Seconds()/1e9) }
	fmt.Printf("state %d bytes, %d reps, medians, GOMAXPROCS %d\n", size, reps, runtime.GOMAXPROCS(0))
	fmt.Printf("  reference: memcpy between touched Go buffers, one core %v = %s; memsnap.Copy (all cores) %v = %s\n", med(ref), gbps(med(ref)), med(refPar), gbps(med(refPar)))
	fmt.Printf("  memory  snapshot: first-touch of a buffer %v (background, twice per process)  copy %v = %s (on the step's path)  hand-over %v (background)\n",
		med(prefault), med(cp), gbps(med(cp)), med(hand))
	fmt.Printf("  memory  restore, writer alive: %v = %s (map + CRC-32C check + copy into the program's buffers)\n", med(restore), gbps(med(restore)))
	fmt.Printf("  memory  restore of a restarted rank: first %v = %s (the agent seals and checks it once; map + copy)  then %v = %s (sealed: map + copy)\n",
		first, gbps(first), med(restarted), gbps(med(restarted)))
	fmt.Printf("  disk    save:     %v = %s (write + fsync + rename)\n", med(dsave), gbps(med(dsave)))
	fmt.Printf("  disk    restore:  %v = %s (read from the page cache + checksum + copy)\n", med(dload), gbps(med(dload)))
	return nil
}

func med(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
